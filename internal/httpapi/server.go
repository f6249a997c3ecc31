// Package httpapi serves salesagg's HTTP interface: product queries, task
// status, liveness, readiness and metrics.
package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"go.uber.org/zap"
)

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
		Handler:           routes(b, g, log, o),
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
	return routes(b, &guard{}, zap.NewNop(), newOptions(opts))
}
