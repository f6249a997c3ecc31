// Package httpapi serves salesagg's HTTP interface: product queries, task
// status, liveness, readiness and metrics.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
)

// Backend is what the HTTP interface reads. *stream.Runtime implements it.
type Backend interface {
	Total(product string) (int64, bool, error)
	Products(after string, limit int) ([]state.Total, []string, error)
	Tasks() []stream.TaskStatus
	Ready() (bool, string)
	BadEvents() int64
}

// Paging limits of GET /v1/products.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Server is the HTTP server. Create it with Listen, run it with Serve.
type Server struct {
	srv *http.Server
	ln  net.Listener
	log *zap.Logger
}

// Listen binds addr (":0" picks a free port) and prepares the handlers.
func Listen(addr string, b Backend, log *zap.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on http.addr %s: %w", addr, err)
	}
	s := &Server{ln: ln, log: log}
	s.srv = &http.Server{
		Handler:           Handler(b),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          zap.NewStdLog(log),
	}
	return s, nil
}

// Addr returns the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Shutdown.
func (s *Server) Serve() error {
	s.log.Info("HTTP server listening", zap.String("addr", s.Addr()))
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving HTTP on %s: %w", s.Addr(), err)
	}
	return nil
}

// Shutdown stops accepting requests and waits for those in flight.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Handler returns the routes over b.
func Handler(b Backend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/products/{product}", func(w http.ResponseWriter, r *http.Request) {
		product := r.PathValue("product")
		total, ok, err := b.Total(product)
		if err != nil {
			writeError(w, err)
			return
		}
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown product", "product": product})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"product": product, "total": total})
	})
	mux.HandleFunc("GET /v1/products", func(w http.ResponseWriter, r *http.Request) {
		limit := DefaultPageSize
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxPageSize {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("limit must be an integer from 1 to %d", MaxPageSize)})
				return
			}
			limit = n
		}
		page, unavailable, err := b.Products(r.URL.Query().Get("after"), limit)
		if err != nil {
			writeError(w, err)
			return
		}
		if page == nil {
			page = []state.Total{}
		}
		resp := map[string]any{"products": page}
		if len(page) == limit {
			resp["next"] = page[len(page)-1].Product
		}
		if len(unavailable) > 0 {
			resp["unavailable_tasks"] = unavailable
		}
		writeJSON(w, http.StatusOK, resp)
	})
	mux.HandleFunc("GET /v1/tasks", func(w http.ResponseWriter, _ *http.Request) {
		ts := b.Tasks()
		if ts == nil {
			ts = []stream.TaskStatus{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"tasks": ts})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ready, reason := b.Ready()
		code := http.StatusOK
		if !ready {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, map[string]any{"ready": ready, "reason": reason})
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		writeMetrics(w, b)
	})
	return http.MaxBytesHandler(mux, 1<<20)
}

// writeError answers a failed query. A product whose task runs on another
// member is 404 with the task and the owner (ask it instead); 503 with
// Retry-After when no owner is known yet (a rebalance) or the task is not
// ready here.
func writeError(w http.ResponseWriter, err error) {
	var nh *stream.NotHostedError
	if errors.As(err, &nh) {
		body := map[string]any{"error": err.Error(), "task": nh.Task, "partition": nh.Partition}
		if nh.Owner != "" {
			body["owner"] = nh.Owner
			writeJSON(w, http.StatusNotFound, body)
			return
		}
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	code := http.StatusInternalServerError
	if errors.Is(err, stream.ErrNotReady) || errors.Is(err, stream.ErrNotHosted) {
		code = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeMetrics writes the task counters in the Prometheus text format.
func writeMetrics(w http.ResponseWriter, b Backend) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	ready, _ := b.Ready()
	fmt.Fprintf(w, "# HELP salesagg_ready Whether every assigned task is running.\n# TYPE salesagg_ready gauge\nsalesagg_ready %d\n", boolInt(ready))
	fmt.Fprintf(w, "# HELP salesagg_bad_events_total Bad events skipped since start.\n# TYPE salesagg_bad_events_total counter\nsalesagg_bad_events_total %d\n", b.BadEvents())
	ts := b.Tasks()
	series := []struct {
		name, help, typ string
		val             func(stream.TaskStatus) int64
	}{
		{"salesagg_task_running", "Whether the task is running.", "gauge", func(t stream.TaskStatus) int64 { return int64(boolInt(t.State == "running")) }},
		{"salesagg_task_processed_total", "Events folded since the task started.", "counter", func(t stream.TaskStatus) int64 { return t.Processed }},
		{"salesagg_task_duplicates_skipped_total", "Redelivered events skipped.", "counter", func(t stream.TaskStatus) int64 { return t.Duplicates }},
		{"salesagg_task_forwarded_total", "Events forwarded to the owning task.", "counter", func(t stream.TaskStatus) int64 { return t.Forwarded }},
		{"salesagg_task_bad_events_total", "Bad events skipped.", "counter", func(t stream.TaskStatus) int64 { return t.BadEvents }},
		{"salesagg_task_restored_records", "Changelog records restored at the task's start.", "gauge", func(t stream.TaskStatus) int64 { return t.Restore.Restored }},
		{"salesagg_task_input_lag", "Input records not yet processed.", "gauge", func(t stream.TaskStatus) int64 { return t.Lag }},
		{"salesagg_task_checkpoint_offset", "Next changelog offset the store reflects.", "gauge", func(t stream.TaskStatus) int64 { return t.Checkpoint }},
	}
	for _, s := range series {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", s.name, s.help, s.name, s.typ)
		for _, t := range ts {
			fmt.Fprintf(w, "%s{task=%q,partition=\"%d\"} %d\n", s.name, t.Task, t.Partition, s.val(t))
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
