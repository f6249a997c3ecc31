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
	"net/http/pprof"
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
	// Healthy is false once a task kept failing past task.timeout.ms.
	Healthy() (bool, string)
	BadEvents() int64
	// InstanceID names this instance in X-Served-By.
	InstanceID() string
	// TaskOf names the task owning a product.
	TaskOf(product string) string
	// Instances lists the group's members, their tasks and servers.
	Instances() []stream.InstanceStatus
	// StandbyTotal answers from this instance's standby copy of the
	// product's task, within acceptable.recovery.lag; lag is how far behind
	// it may be.
	StandbyTotal(product string) (total int64, ok bool, lag int64, err error)
	// StandbyServers are the other instances keeping a standby copy of the
	// product's task.
	StandbyServers(product string) []string
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
	// StandbyLagHeader is on an answer from a standby copy: it may be
	// stale by up to this many changelog records (the copy's lag when it
	// answered). X-Served-By then ends in "; standby".
	StandbyLagHeader = "X-Salesagg-Standby-Lag"
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
func Listen(addr string, b Backend, log *zap.Logger, opts ...Option) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on http.addr %s: %w", addr, err)
	}
	s := &Server{ln: ln, log: log}
	s.srv = &http.Server{
		Handler:           Handler(b, opts...),
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
func Handler(b Backend, opts ...Option) http.Handler {
	mux := http.NewServeMux()
	fwd := &http.Client{Timeout: forwardTimeout}
	mux.HandleFunc("GET /v1/products/{product}", func(w http.ResponseWriter, r *http.Request) {
		queryProduct(w, r, fwd, b, r.PathValue("product"))
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
	mux.Handle("GET /{$}", newStatusPage(b, opts...)) // the status page, statuspage.go
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Alive unless a task kept failing past task.timeout.ms: then a
		// restart (the liveness probe's) is the next thing to try.
		if ok, reason := b.Healthy(); !ok {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "reason": reason})
			return
		}
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
	mux.Handle("GET /metrics", metricsHandler(b))
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.pprof {
		// Profiles are bounded by the server's WriteTimeout (30 s): a CPU
		// profile asks for at most ?seconds=29.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return http.MaxBytesHandler(mux, 1<<20)
}

// queryProduct answers GET /v1/products/{product}:
//  1. from this instance's active task;
//  2. else, unless the request was forwarded to us, by one hop to the
//     owner, whose answer is relayed unless it could not give one (it did
//     not answer, or answered 503: restoring);
//  3. else from this instance's standby copy, within
//     acceptable.recovery.lag, marked stale (StandbyLagHeader);
//  4. else, unless forwarded, by one hop to an instance with a standby copy;
//  5. else an error: the owner's 503, or 503 naming an unreachable owner,
//     or this instance's own answer (404 naming the owner, 503 while no
//     owner is known).
//
// A forwarded request is answered where it lands (steps 1, 3, 5): never
// forwarded again, so there are no loops.
func queryProduct(w http.ResponseWriter, r *http.Request, fwd *http.Client, b Backend, product string) {
	servedBy := b.InstanceID() + "; task=" + b.TaskOf(product)
	total, ok, err := b.Total(product)
	if err == nil {
		w.Header().Set(ServedByHeader, servedBy)
		writeTotal(w, product, total, ok, nil)
		return
	}
	forwarded := r.Header.Get(ForwardedHeader) != ""
	var nh *stream.NotHostedError
	var ownerAnswer *answer
	var ownerErr error
	if errors.As(err, &nh) && nh.Server != "" && !forwarded {
		ownerAnswer, ownerErr = ask(r.Context(), fwd, b.InstanceID(), nh.Server, product)
		if ownerErr == nil && ownerAnswer.code != http.StatusServiceUnavailable {
			ownerAnswer.relay(w)
			return
		}
	}
	if st, ok, lag, serr := b.StandbyTotal(product); serr == nil {
		w.Header().Set(ServedByHeader, servedBy+"; standby")
		w.Header().Set(StandbyLagHeader, strconv.FormatInt(lag, 10))
		writeTotal(w, product, st, ok, &lag)
		return
	}
	if !forwarded {
		for _, server := range b.StandbyServers(product) {
			a, err := ask(r.Context(), fwd, b.InstanceID(), server, product)
			if err == nil && (a.code == http.StatusOK || a.code == http.StatusNotFound) {
				a.relay(w)
				return
			}
		}
	}
	switch {
	case ownerAnswer != nil:
		ownerAnswer.relay(w)
	case ownerErr != nil:
		w.Header().Set(ServedByHeader, servedBy)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{
			"error": fmt.Sprintf("the owner of task %s, %s at %s, did not answer: %v", nh.Task, nh.Owner, nh.Server, ownerErr),
			"task":  nh.Task, "partition": nh.Partition, "owner": nh.Owner, "server": nh.Server,
		})
	default:
		w.Header().Set(ServedByHeader, servedBy)
		writeError(w, err)
	}
}

// writeTotal writes a product's total (404 when unknown); staleBy, when not
// nil, marks an answer from a standby copy.
func writeTotal(w http.ResponseWriter, product string, total int64, ok bool, staleBy *int64) {
	var body map[string]any
	code := http.StatusOK
	if ok {
		body = map[string]any{"product": product, "total": total}
	} else {
		code = http.StatusNotFound
		body = map[string]any{"error": "unknown product", "product": product}
	}
	if staleBy != nil {
		body["stale"] = true
		body["standby_lag"] = *staleBy
	}
	writeJSON(w, code, body)
}

// answer is another instance's answer to a product query.
type answer struct {
	code   int
	header http.Header
	body   []byte
}

// relayed are the headers of an answer that are passed on.
var relayed = []string{"Content-Type", ServedByHeader, StandbyLagHeader, "Retry-After"}

func (a *answer) relay(w http.ResponseWriter) {
	for _, h := range relayed {
		if v := a.header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(a.code)
	_, _ = w.Write(a.body)
}

// ask forwards a product query to server: one hop, bounded by
// forwardTimeout, marked forwarded so that it is answered where it lands.
func ask(ctx context.Context, cl *http.Client, self, server, product string) (*answer, error) {
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	u := "http://" + server + "/v1/products/" + url.PathEscape(product)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(ForwardedHeader, self)
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	return &answer{code: resp.StatusCode, header: resp.Header, body: body}, nil
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
