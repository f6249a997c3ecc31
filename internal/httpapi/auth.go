package httpapi

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
)

// Security of the HTTP interface.
//
// With http.tls.cert.file the server speaks HTTPS; its certificate and key
// are read again when either file changes (a certificate rotated in place by
// cert-manager), checked at most once a second. With http.tls.client.ca.file
// every request but the probes must come with a client certificate that CA
// signed. With http.auth.tokens.file every request but the probes (and
// /metrics when http.auth.metrics is false) needs "Authorization: Bearer
// <token>" with one of the file's tokens, compared in constant time; the
// file is read again when it changes. An instance forwarding a query to
// another presents its peer certificate and the first token.

// reloadCheck is how often a watched file's metadata is looked at.
const reloadCheck = time.Second

// watched is a file read again when its modification time or size change.
type watched struct {
	path    string
	mu      sync.Mutex // guards checked, mod and size
	checked time.Time  // guarded by mu
	mod     time.Time  // guarded by mu
	size    int64      // guarded by mu
}

// changed reports whether the file changed since the last call that
// returned true (the first call returns true), looking at most once per
// reloadCheck.
func (w *watched) changed(now time.Time) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.checked.IsZero() && now.Sub(w.checked) < reloadCheck {
		return false, nil
	}
	w.checked = now
	fi, err := os.Stat(w.path)
	if err != nil {
		return false, err
	}
	if fi.ModTime().Equal(w.mod) && fi.Size() == w.size {
		return false, nil
	}
	w.mod, w.size = fi.ModTime(), fi.Size()
	return true, nil
}

// forget makes the next look past reloadCheck report a change, whatever the
// file holds then.
func (w *watched) forget() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mod = time.Time{}
}

// keyPair is a certificate and key read from files, read again when either
// changes. A pair that fails to load keeps the previous one (logged).
type keyPair struct {
	cert, key watched
	log       *zap.Logger
	what      string
	mu        sync.Mutex       // guards current; held while get forgets cert and key (this order only)
	current   *tls.Certificate // guarded by mu
}

func newKeyPair(certFile, keyFile, what string, log *zap.Logger) (*keyPair, error) {
	kp := &keyPair{cert: watched{path: certFile}, key: watched{path: keyFile}, log: log, what: what}
	if _, err := kp.get(); err != nil {
		return nil, err
	}
	return kp, nil
}

// get returns the current pair, loading it again when a file changed.
func (kp *keyPair) get() (*tls.Certificate, error) {
	now := time.Now()
	c1, err1 := kp.cert.changed(now)
	c2, err2 := kp.key.changed(now)
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if err := errors.Join(err1, err2); err != nil && kp.current == nil {
		return nil, fmt.Errorf("reading the %s: %w", kp.what, err)
	}
	if !c1 && !c2 && kp.current != nil {
		return kp.current, nil
	}
	pair, err := tls.LoadX509KeyPair(kp.cert.path, kp.key.path)
	if err != nil {
		if kp.current == nil {
			return nil, fmt.Errorf("loading the %s from %s and %s: %w", kp.what, kp.cert.path, kp.key.path, err)
		}
		// Mid-rotation (one file written, not the other): keep serving the
		// previous pair; the next look loads the new one.
		kp.log.Warn("Loading the rotated "+kp.what+" failed; still using the previous one", zap.String("cert", kp.cert.path), zap.Error(err))
		kp.cert.forget()
		kp.key.forget()
		return kp.current, nil
	}
	if kp.current != nil {
		kp.log.Info("Loaded the rotated "+kp.what, zap.String("cert", kp.cert.path))
	}
	kp.current = &pair
	return kp.current, nil
}

// caPool reads a PEM bundle of CA certificates.
func caPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// tokenSet is the bearer tokens of http.auth.tokens.file: one per line,
// blank lines and lines starting with '#' ignored; kept as SHA-256 hashes,
// so that a comparison takes the same time whatever the token's length.
type tokenSet struct {
	file  watched
	log   *zap.Logger
	mu    sync.Mutex          // guards hash and first
	hash  [][sha256.Size]byte // guarded by mu
	first string              // guarded by mu: what this instance forwards with
}

func newTokenSet(file string, log *zap.Logger) (*tokenSet, error) {
	ts := &tokenSet{file: watched{path: file}, log: log}
	if err := ts.reload(); err != nil {
		return nil, err
	}
	if ts.first == "" {
		return nil, fmt.Errorf("http.auth.tokens.file %s holds no token", file)
	}
	return ts, nil
}

// reload reads the file again when it changed; a file that cannot be read
// keeps the tokens it had.
func (ts *tokenSet) reload() error {
	changed, err := ts.file.changed(time.Now())
	if err != nil || !changed {
		return err
	}
	b, err := os.ReadFile(ts.file.path)
	if err != nil {
		return err
	}
	var hash [][sha256.Size]byte
	first := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		tok := strings.TrimSpace(sc.Text())
		if tok == "" || strings.HasPrefix(tok, "#") {
			continue
		}
		if first == "" {
			first = tok
		}
		hash = append(hash, sha256.Sum256([]byte(tok)))
	}
	if len(hash) == 0 {
		return fmt.Errorf("http.auth.tokens.file %s holds no token", ts.file.path)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.hash != nil {
		ts.log.Info("Loaded the changed tokens file", zap.String("file", ts.file.path), zap.Int("tokens", len(hash)))
	}
	ts.hash, ts.first = hash, first
	return nil
}

// valid reports whether tok is one of the tokens, comparing with every one
// in constant time.
func (ts *tokenSet) valid(tok string) bool {
	if err := ts.reload(); err != nil {
		ts.log.Warn("Reading the tokens file failed; using the tokens read before", zap.String("file", ts.file.path), zap.Error(err))
	}
	h := sha256.Sum256([]byte(tok))
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ok := 0
	for i := range ts.hash {
		ok |= subtle.ConstantTimeCompare(h[:], ts.hash[i][:])
	}
	return ok == 1 && tok != ""
}

// forwardToken is the token this instance presents to the others.
func (ts *tokenSet) forwardToken() string {
	_ = ts.reload()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.first
}

// guard is the HTTP interface's security: TLS material and the checks
// every request goes through.
type guard struct {
	sec    config.HTTPSecurity
	server *keyPair  // nil without TLS
	peer   *keyPair  // nil without a peer certificate
	tokens *tokenSet // nil without tokens
	// clientCAs verify client certificates (nil: none asked for); peerCAs
	// verify the other instances' servers (nil: the system roots).
	clientCAs, peerCAs *x509.CertPool
}

func newGuard(sec config.HTTPSecurity, log *zap.Logger) (*guard, error) {
	g := &guard{sec: sec}
	var err error
	if sec.TLS() {
		if g.server, err = newKeyPair(sec.CertFile, sec.KeyFile, "HTTPS certificate", log); err != nil {
			return nil, err
		}
	}
	if sec.ClientCAFile != "" {
		if g.clientCAs, err = caPool(sec.ClientCAFile); err != nil {
			return nil, fmt.Errorf("reading http.tls.client.ca.file: %w", err)
		}
	}
	if sec.PeerCertFile != "" {
		if g.peer, err = newKeyPair(sec.PeerCertFile, sec.PeerKeyFile, "peer certificate", log); err != nil {
			return nil, err
		}
	}
	if sec.PeerCAFile != "" {
		if g.peerCAs, err = caPool(sec.PeerCAFile); err != nil {
			return nil, fmt.Errorf("reading http.tls.peer.ca.file: %w", err)
		}
	}
	if sec.TokensFile != "" {
		if g.tokens, err = newTokenSet(sec.TokensFile, log); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// serverTLS is the server's TLS configuration (nil: plain HTTP). Client
// certificates are verified when given and required by protect, so that
// the probes (which present none) still reach /healthz and /readyz.
func (g *guard) serverTLS() *tls.Config {
	if g.server == nil {
		return nil
	}
	c := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return g.server.get() },
	}
	if g.clientCAs != nil {
		c.ClientAuth = tls.VerifyClientCertIfGiven
		c.ClientCAs = g.clientCAs
	}
	return c
}

// peerTLS is what a forwarding client presents and trusts.
func (g *guard) peerTLS() *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: g.peerCAs}
	if g.peer != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return g.peer.get() }
	}
	return c
}

// open reports whether path is answered without credentials: the probes,
// and /metrics when http.auth.metrics is false.
func (g *guard) open(path string) bool {
	return path == "/healthz" || path == "/readyz" || (path == "/metrics" && !g.sec.AuthMetrics)
}

// protect wraps h: security headers on every answer, then the client
// certificate and the token checks.
func (g *guard) protect(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("X-Content-Type-Options", "nosniff")
		// JSON answers need nothing; the status page sets its own policy.
		hd.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
		hd.Set("Cache-Control", "no-store")
		if g.open(r.URL.Path) {
			h.ServeHTTP(w, r)
			return
		}
		if g.clientCAs != nil && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "a client certificate signed by http.tls.client.ca.file is required"})
			return
		}
		if g.tokens != nil {
			auth := r.Header.Get("Authorization")
			tok, ok := strings.CutPrefix(auth, "Bearer ")
			switch {
			case auth == "" || !ok:
				hd.Set("WWW-Authenticate", `Bearer realm="salesagg"`)
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "a bearer token is required (Authorization: Bearer <token>)"})
				return
			case !g.tokens.valid(strings.TrimSpace(tok)):
				hd.Set("WWW-Authenticate", `Bearer realm="salesagg", error="invalid_token"`)
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "the bearer token is not valid"})
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// authorize sets what a forwarded request presents besides its
// certificate: the first token.
func (g *guard) authorize(req *http.Request) {
	if g.tokens != nil {
		req.Header.Set("Authorization", "Bearer "+g.tokens.forwardToken())
	}
}

// describe says how the server is protected, for the start-up line.
func (g *guard) describe() []zap.Field {
	return []zap.Field{
		zap.String("scheme", g.sec.Scheme()),
		zap.Bool("client_certificates", g.clientCAs != nil),
		zap.Bool("tokens", g.tokens != nil),
		zap.Bool("peer_certificate", g.peer != nil),
	}
}

// limitListener accepts at most n connections at once: Accept waits while
// n are open (or until the listener is closed).
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
