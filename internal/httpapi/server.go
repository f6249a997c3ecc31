// Package httpapi serves salesagg's HTTP interface: product queries, task
// status, liveness, readiness and metrics.
package httpapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
)

// Backend is what the HTTP interface reads, in httpapi's own views;
// internal/httpapi/streamview adapts the runtime to it.
type Backend interface {
	Total(product string) (int64, bool, error)
	Products(after string, limit int) ([]state.Total, []string, error)
	Tasks() []TaskStatus
	Ready() (bool, string)
	// Healthy is false once a task kept failing past task.timeout.ms.
	Healthy() (bool, string)
	BadEvents() int64
	// InstanceID names this instance in X-Served-By.
	InstanceID() string
	// TaskOf names the task owning a product.
	TaskOf(product string) string
	// Instances lists the group's members, their tasks and servers.
	Instances() []InstanceStatus
	// StandbyTotal answers from this instance's standby copy of the
	// product's task, within acceptable.recovery.lag; lag is how far behind
	// it may be.
	StandbyTotal(product string) (total int64, ok bool, lag int64, err error)
	// StandbyServers are the other instances keeping a standby copy of the
	// product's task.
	StandbyServers(product string) []Peer
	// StoreScanner lists the top products on the status page.
	StoreScanner
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

// forwardTimeout bounds a forwarded request, and GET /v1/products' gathering
// from every instance.
const forwardTimeout = 2 * time.Second

// Paging limits of GET /v1/products.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Connections: an idle keep-alive connection is closed after idleTimeout;
// fdReserve file descriptors are kept for the stores and Kafka when the
// process's limit (RLIMIT_NOFILE) is lower than http.max.connections.
const (
	idleTimeout = 15 * time.Second
	fdReserve   = 256
)

// Server is the HTTP server. Create it with Listen, run it with Serve.
type Server struct {
	srv   *http.Server
	ln    net.Listener
	log   *zap.Logger
	guard *guard
	// maxConns is the connection limit in force (http.max.connections,
	// lowered to fit the file descriptor limit).
	maxConns int
}

// Listen binds addr (":0" picks a free port) and prepares the handlers,
// with the TLS, authentication and connection limit of WithSecurity.
func Listen(addr string, b Backend, log *zap.Logger, opts ...Option) (*Server, error) {
	o := newOptions(opts)
	g, err := newGuard(o.sec, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on http.addr %s: %w", addr, err)
	}
	limit := o.sec.MaxConnections
	if limit <= 0 {
		limit = 512
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < uint64(limit+2*fdReserve) {
		lowered := max(16, int(rl.Cur)/2)
		if lowered < limit {
			log.Warn("Lowering http.max.connections to fit the file descriptor limit: the stores and Kafka need the rest",
				zap.Int("http.max.connections", limit), zap.Int("lowered_to", lowered), zap.Uint64("RLIMIT_NOFILE", rl.Cur))
			limit = lowered
		}
	}
	var l net.Listener = newLimitListener(ln, limit)
	s := &Server{log: log, guard: g, maxConns: limit}
	if tc := g.serverTLS(); tc != nil {
		l = tls.NewListener(l, tc)
	}
	s.ln = l
	s.srv = &http.Server{
		Handler:           handler(b, g, log, o),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          zap.NewStdLog(log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))),
	}
	return s, nil
}

// Addr returns the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Shutdown.
func (s *Server) Serve() error {
	s.log.Info("HTTP server listening", append([]zap.Field{zap.String("addr", s.Addr()), zap.Int("max_connections", s.maxConns)}, s.guard.describe()...)...)
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

// Handler returns the routes over b, serving anyone (the security of
// WithSecurity is Listen's).
func Handler(b Backend, opts ...Option) http.Handler {
	return handler(b, &guard{}, zap.NewNop(), newOptions(opts))
}

// productsPrefix is the path of one product's total; the rest of the path
// is the product, escaped as one segment.
const productsPrefix = "/v1/products/"

func handler(b Backend, g *guard, log *zap.Logger, o options) http.Handler {
	mux := http.NewServeMux()
	fw := newForwarder(g, log)
	mux.HandleFunc("GET /v1/products", func(w http.ResponseWriter, r *http.Request) {
		listProducts(w, r, fw, b)
	})
	mux.HandleFunc("GET /v1/tasks", func(w http.ResponseWriter, _ *http.Request) {
		ts := b.Tasks()
		if ts == nil {
			ts = []TaskStatus{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"tasks": ts})
	})
	mux.HandleFunc("GET /v1/instances", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"instances": b.Instances()})
	})
	mux.Handle("GET /{$}", newStatusPage(b, o))
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
	if o.metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.metrics, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	}
	if o.pprof {
		// Profiles are bounded by the server's WriteTimeout (30 s): a CPU
		// profile asks for at most ?seconds=29. The command line is not
		// served: it can hold secrets given as flags.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("GET /debug/pprof/cmdline", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "the command line is not served"})
		})
	}
	// One product's total is routed here, not by the mux: the mux cleans
	// dot segments, so that the products "." and ".." (sent as %2E and
	// %2E%2E) would be redirected to other paths.
	routes := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rest, ok := strings.CutPrefix(r.URL.EscapedPath(), productsPrefix); ok && !strings.Contains(rest, "/") {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed"})
				return
			}
			product, err := url.PathUnescape(rest)
			if err != nil || product == "" {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "the product must be one path segment, escaped"})
				return
			}
			queryProduct(w, r, fw, b, product)
			return
		}
		mux.ServeHTTP(w, r)
	})
	return http.MaxBytesHandler(g.protect(routes), 1<<20)
}

// listProducts answers GET /v1/products: this instance's page merged with
// the same page of every other instance running tasks, asked in parallel
// under one deadline (forwardTimeout).
func listProducts(w http.ResponseWriter, r *http.Request, fw *forwarder, b Backend) {
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
	if !forwarded(r) {
		ctx, cancel := context.WithTimeout(r.Context(), forwardTimeout)
		defer cancel()
		type result struct {
			tasks       []string
			page        []state.Total
			unavailable []string
			err         error
		}
		var peers []InstanceStatus
		for _, is := range b.Instances() {
			if !is.Self && len(is.Tasks) > 0 {
				peers = append(peers, is)
			}
		}
		results := make(chan result, len(peers))
		for _, is := range peers {
			go func() {
				got, unav, err := fw.page(ctx, b.InstanceID(), is, after, limit)
				results <- result{tasks: is.Tasks, page: got, unavailable: unav, err: err}
			}()
		}
		for range peers {
			res := <-results
			if res.err != nil {
				unavailable = append(unavailable, res.tasks...)
				continue
			}
			page = append(page, res.page...)
			unavailable = append(unavailable, res.unavailable...)
		}
		sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
		if len(page) > limit {
			page = page[:limit]
		}
		sort.Strings(unavailable)
		unavailable = slices.Compact(unavailable)
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
}

// forwarded reports whether r came from another instance (it is answered
// where it lands, never forwarded again).
func forwarded(r *http.Request) bool { return r.Header.Get(ForwardedHeader) != "" }

// queryProduct answers GET /v1/products/{product}:
//  1. from this instance's active task;
//  2. else, unless the request was forwarded to us, by one hop to the
//     owner, whose answer is decoded and written again (never relayed as
//     it came) unless it could not give one (it did not answer, or
//     answered 503: restoring);
//  3. else from this instance's standby copy, within
//     acceptable.recovery.lag, marked stale (StandbyLagHeader);
//  4. else, unless forwarded, by one hop to an instance with a standby copy;
//  5. else an error: the owner's 503, or 503 naming an owner that did not
//     answer or advertises no usable address, or this instance's own answer
//     (404 naming the owner, 503 while no owner is known).
//
// A forwarded request is answered where it lands (steps 1, 3, 5): never
// forwarded again, so there are no loops.
func queryProduct(w http.ResponseWriter, r *http.Request, fw *forwarder, b Backend, product string) {
	task := b.TaskOf(product)
	servedBy := b.InstanceID() + "; task=" + task
	total, ok, err := b.Total(product)
	if err == nil {
		w.Header().Set(ServedByHeader, servedBy)
		writeTotal(w, product, total, ok, nil)
		return
	}
	var nh *NotHostedError
	var ownerAnswer *answer
	ownerFailed := false
	if errors.As(err, &nh) && nh.Server != "" && !forwarded(r) {
		a, err := fw.ask(r.Context(), b.InstanceID(), nh.Owner, nh.Server, product, task)
		if err != nil {
			ownerFailed = true
		} else if a.code != http.StatusServiceUnavailable {
			a.write(w)
			return
		} else {
			ownerAnswer = a
		}
	}
	if st, ok, lag, serr := b.StandbyTotal(product); serr == nil {
		w.Header().Set(ServedByHeader, servedBy+"; standby")
		w.Header().Set(StandbyLagHeader, strconv.FormatInt(lag, 10))
		writeTotal(w, product, st, ok, &lag)
		return
	}
	if !forwarded(r) {
		for _, peer := range b.StandbyServers(product) {
			a, err := fw.ask(r.Context(), b.InstanceID(), peer.Name, peer.Server, product, task)
			if err == nil && (a.code == http.StatusOK || a.code == http.StatusNotFound) {
				a.write(w)
				return
			}
		}
	}
	switch {
	case ownerAnswer != nil:
		ownerAnswer.write(w)
	case ownerFailed:
		// What went wrong stays in this instance's log: the answer names
		// the owner, not the dial error.
		w.Header().Set(ServedByHeader, servedBy)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{
			"error": fmt.Sprintf("the owner of task %s, %s, did not answer", nh.Task, nh.Owner),
			"task":  nh.Task, "partition": nh.Partition, "owner": nh.Owner,
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

// writeError answers a failed query. A product whose task runs on another
// member is 404 with the task and the owner (ask it instead); 503 with
// Retry-After when no owner is known yet (a rebalance), the owner cannot be
// asked, or the error is ErrUnavailable (the task is not ready here); any
// other error is 500.
func writeError(w http.ResponseWriter, err error) {
	var nh *NotHostedError
	if errors.As(err, &nh) {
		body := map[string]any{"error": err.Error(), "task": nh.Task, "partition": nh.Partition}
		if nh.Owner != "" && nh.Unroutable != "" {
			body["owner"] = nh.Owner
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, body)
			return
		}
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
	if errors.Is(err, ErrUnavailable) {
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
