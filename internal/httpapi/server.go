// Package httpapi serves salesagg's HTTP interface: product queries, task
// status, liveness, readiness and metrics.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
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
	// InstanceID names this instance in X-Served-By.
	InstanceID() string
	// TaskOf names the task owning a product.
	TaskOf(product string) string
	// Instances lists the group's members, their tasks and servers.
	Instances() []stream.InstanceStatus
}

// Headers of the query routing.
const (
	// ServedByHeader names the instance and task that answered a product
	// query: "<instance>; task=0_2".
	ServedByHeader = "X-Served-By"
	// ForwardedHeader marks a request one instance forwarded to another
	// (its value names the forwarder); a forwarded request is answered
	// where it lands, never forwarded again.
	ForwardedHeader = "X-Salesagg-Forwarded"
)

// forwardTimeout bounds a forwarded request.
const forwardTimeout = 2 * time.Second

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

// Shutdown stops accepting requests and waits for those in flight until ctx
// is done; then it closes the connections left. A connection a client opened
// without sending a request yet (another instance's forwarding client dials
// ahead) counts as in flight for net/http until it is 5 s old: it must not
// make a clean stop fail.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		s.log.Warn("HTTP connections still open at the end of the shutdown; closing them")
		return s.srv.Close()
	}
	return err
}

// Handler returns the routes over b.
func Handler(b Backend) http.Handler {
	mux := http.NewServeMux()
	fwd := &http.Client{Timeout: forwardTimeout}
	mux.HandleFunc("GET /v1/products/{product}", func(w http.ResponseWriter, r *http.Request) {
		product := r.PathValue("product")
		total, ok, err := b.Total(product)
		var nh *stream.NotHostedError
		if errors.As(err, &nh) && nh.Server != "" && r.Header.Get(ForwardedHeader) == "" {
			forwardProduct(w, r, fwd, b, nh, product)
			return
		}
		w.Header().Set(ServedByHeader, b.InstanceID()+"; task="+b.TaskOf(product))
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
		after := r.URL.Query().Get("after")
		page, unavailable, err := b.Products(after, limit)
		if err != nil {
			writeError(w, err)
			return
		}
		if r.Header.Get(ForwardedHeader) == "" {
			// Gather the same page from every other owner.
			for _, is := range b.Instances() {
				if is.Self || len(is.Tasks) == 0 {
					continue
				}
				got, unav, err := fetchPage(r.Context(), fwd, b.InstanceID(), is.Server, after, limit)
				if err != nil {
					unavailable = append(unavailable, is.Tasks...)
					continue
				}
				page = append(page, got...)
				unavailable = append(unavailable, unav...)
			}
			sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
			if len(page) > limit {
				page = page[:limit]
			}
			sort.Strings(unavailable)
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
	mux.HandleFunc("GET /v1/instances", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"instances": b.Instances()})
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
// forwardProduct answers a product query from the instance that runs its
// task: one hop, bounded by forwardTimeout. An owner that cannot be reached
// is a 503 naming it.
func forwardProduct(w http.ResponseWriter, r *http.Request, cl *http.Client, b Backend, nh *stream.NotHostedError, product string) {
	ctx, cancel := context.WithTimeout(r.Context(), forwardTimeout)
	defer cancel()
	u := "http://" + nh.Server + "/v1/products/" + url.PathEscape(product)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err == nil {
		req.Header.Set(ForwardedHeader, b.InstanceID())
		var resp *http.Response
		if resp, err = cl.Do(req); err == nil {
			defer resp.Body.Close()
			body, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if rerr == nil {
				for _, h := range []string{"Content-Type", ServedByHeader, "Retry-After"} {
					if v := resp.Header.Get(h); v != "" {
						w.Header().Set(h, v)
					}
				}
				w.WriteHeader(resp.StatusCode)
				_, _ = w.Write(body)
				return
			}
			err = rerr
		}
	}
	w.Header().Set(ServedByHeader, b.InstanceID()+"; task="+nh.Task)
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{
		"error": fmt.Sprintf("the owner of task %s, %s at %s, did not answer: %v", nh.Task, nh.Owner, nh.Server, err),
		"task":  nh.Task, "partition": nh.Partition, "owner": nh.Owner, "server": nh.Server,
	})
}

// fetchPage reads one page of GET /v1/products from another instance.
func fetchPage(ctx context.Context, cl *http.Client, self, server, after string, limit int) ([]state.Total, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if after != "" {
		q.Set("after", after)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+server+"/v1/products?"+q.Encode(), nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set(ForwardedHeader, self)
	resp, err := cl.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET /v1/products on %s: %s", server, resp.Status)
	}
	var body struct {
		Products    []state.Total `json:"products"`
		Unavailable []string      `json:"unavailable_tasks"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&body); err != nil {
		return nil, nil, fmt.Errorf("GET /v1/products on %s: %w", server, err)
	}
	return body.Products, body.Unavailable, nil
}

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
