package httpapi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/status"
	th "github.com/salesagg/salesagg/test/harness"
)

// owned answers the products it holds, and names owner at server for the
// others (a NotHostedError, as the runtime's).
type owned struct {
	idle
	name    string
	totals  map[string]int64
	owner   string
	server  string
	standby []status.Peer
}

func (o owned) InstanceID() string     { return o.name }
func (o owned) TaskOf(p string) string { return "0_1" }
func (o owned) Ready() (bool, string)  { return true, "all tasks running" }
func (o owned) Total(p string) (int64, bool, error) {
	if v, ok := o.totals[p]; ok {
		return v, true, nil
	}
	if o.owner == "" {
		return 0, false, nil
	}
	return 0, false, &NotHostedError{Task: "0_1", Partition: 1, Owner: o.owner, Server: o.server}
}
func (o owned) StandbyServers(string) []status.Peer { return o.standby }

func getJSON(t *testing.T, cl *http.Client, u string, header http.Header) (int, http.Header, map[string]any, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]any
	_ = json.Unmarshal(b, &body)
	return resp.StatusCode, resp.Header, body, string(b)
}

func TestForwardingCannotBeHijacked(t *testing.T) {
	// Scenario: the owner of a product's task, as another member advertises it, is an attacker: it
	// redirects to an internal endpoint holding a secret, answers HTML with a script, answers JSON
	// for another product with a forged X-Served-By, or does not answer at all. The instance asked
	// never follows the redirect, never relays the body, never lets the attacker's headers
	// through, and names no address or dial error in its 503; every answer is JSON with nosniff
	// and a strict Content-Security-Policy.
	secret := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"product":"p1","total":424242,"secret":"s3cr3t-credential"}`)
	}))
	defer secret.Close()
	attacks := map[string]http.HandlerFunc{
		"redirect": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, secret.URL+"/latest/meta-data/iam", http.StatusFound)
		},
		"html": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, `<script>alert(document.cookie)</script>`)
		},
		"other product": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(ServedByHeader, "trusted-instance; task=0_1")
			fmt.Fprint(w, `{"product":"p2","total":99999}`)
		},
	}
	for name, h := range attacks {
		t.Run(name, func(t *testing.T) {
			evil := httptest.NewServer(h)
			defer evil.Close()
			srv := httptest.NewServer(Handler(owned{name: "a", owner: "evil", server: evil.Listener.Addr().String()}))
			defer srv.Close()
			code, hd, body, raw := getJSON(t, srv.Client(), srv.URL+"/v1/products/p1", nil)
			if code != http.StatusServiceUnavailable || strings.Contains(raw, "s3cr3t") || strings.Contains(raw, "<script") || strings.Contains(raw, "99999") {
				t.Fatalf("answer %d %s", code, raw)
			}
			if hd.Get("Content-Type") != "application/json" || hd.Get("X-Content-Type-Options") != "nosniff" ||
				!strings.Contains(hd.Get("Content-Security-Policy"), "default-src 'none'") || strings.HasPrefix(hd.Get(ServedByHeader), "trusted") {
				t.Fatalf("headers %v", hd)
			}
			if strings.Contains(raw, evil.Listener.Addr().String()) {
				t.Fatalf("the 503 names the attacker's address: %v", body)
			}
		})
	}
	t.Run("no answer", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		ln.Close()
		srv := httptest.NewServer(Handler(owned{name: "a", owner: "gone", server: dead}))
		defer srv.Close()
		code, _, _, raw := getJSON(t, srv.Client(), srv.URL+"/v1/products/p1", nil)
		_, port, _ := net.SplitHostPort(dead)
		if code != http.StatusServiceUnavailable || strings.Contains(raw, "refused") || strings.Contains(raw, port) {
			t.Fatalf("answer %d %s: a 503 names the owner, not the dial error", code, raw)
		}
	})
	t.Run("an address that is not host:port", func(t *testing.T) {
		for _, server := range []string{"127.0.0.9:80/latest/meta-data#", "user@host:80", "host:80?x=1", "host:http", "host:0", "[::1]:80/x"} {
			if err := config.CheckServer(server); err == nil {
				t.Errorf("CheckServer(%q) accepted it", server)
			}
		}
		for _, server := range []string{"salesagg-0.salesagg:8080", "127.0.0.1:8080", "[::1]:8080", "localhost:1"} {
			if err := config.CheckServer(server); err != nil {
				t.Errorf("CheckServer(%q) = %v", server, err)
			}
		}
	})
}

func TestForwardedAnswersAreWrittenAgain(t *testing.T) {
	// Scenario: a genuine owner answers; the instance asked writes the decoded answer again with
	// its own headers: X-Served-By names the member it asked, a standby answer keeps its lag.
	owner := httptest.NewServer(Handler(owned{name: "b", totals: map[string]int64{"p1": 1234}}))
	defer owner.Close()
	srv := httptest.NewServer(Handler(owned{name: "a", owner: "b", server: owner.Listener.Addr().String()}))
	defer srv.Close()
	code, hd, body, _ := getJSON(t, srv.Client(), srv.URL+"/v1/products/p1", nil)
	if code != http.StatusOK || body["total"] != float64(1234) || hd.Get(ServedByHeader) != "b; task=0_1" {
		t.Fatalf("answer %d %v %v", code, body, hd)
	}
	code, _, body, _ = getJSON(t, srv.Client(), srv.URL+"/v1/products/nope", nil)
	if code != http.StatusNotFound || body["product"] != "nope" {
		t.Fatalf("unknown product: %d %v", code, body)
	}
}

func TestDotSegmentProducts(t *testing.T) {
	// Scenario: products named "." and ".." (sent escaped, as %2E and %2E%2E) are answered as
	// themselves, by the owner and through a forward, never redirected to another path.
	totals := map[string]int64{".": 1, "..": 2, "a.b": 3, "%": 4, "a b": 5}
	owner := httptest.NewServer(Handler(owned{name: "b", totals: totals}))
	defer owner.Close()
	fwd := httptest.NewServer(Handler(owned{name: "a", owner: "b", server: owner.Listener.Addr().String()}))
	defer fwd.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for p, want := range totals {
		for _, base := range []string{owner.URL, fwd.URL} {
			code, _, body, raw := getJSON(t, noRedirect, base+productsPrefix+escapeSegment(p), nil)
			if code != http.StatusOK || body["product"] != p || body["total"] != float64(want) {
				t.Errorf("%q from %s: %d %s", p, base, code, raw)
			}
		}
	}
}

func FuzzProductRoute(f *testing.F) {
	// Any product name, escaped as the forwarder escapes it, reaches the
	// handler as itself.
	for _, seed := range []string{"p1", ".", "..", "...", "a/b", "%2F", "a?b#c", "é", " ", "\x00", "/v1/tasks", "..%2F..", "a;b"} {
		f.Add(seed)
	}
	srv := httptest.NewServer(Handler(echo{}))
	f.Cleanup(srv.Close)
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	f.Fuzz(func(t *testing.T, product string) {
		if product == "" || !utf8.ValidString(product) {
			return // products are UTF-8: an event with another key is a bad event
		}
		u := srv.URL + productsPrefix + escapeSegment(product)
		if _, err := url.Parse(u); err != nil {
			t.Fatalf("escaped product %q makes an unparsable URL: %v", product, err)
		}
		resp, err := cl.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body struct {
			Product string `json:"product"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &body) != nil || body.Product != product {
			t.Fatalf("product %q: %d %s", product, resp.StatusCode, b)
		}
	})
}

// echo knows every product, with a total of its length.
type echo struct{ idle }

func (echo) Total(p string) (int64, bool, error) { return int64(len(p)), true, nil }

// serve runs Listen with sec over b, with metrics, and returns its address.
func serve(t *testing.T, b Backend, sec config.HTTPSecurity) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	s, err := Listen("127.0.0.1:0", b, zap.NewNop(), WithSecurity(sec), WithPprof(true), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { _ = s.Shutdown(t.Context()) })
	return s.Addr()
}

// tlsClient trusts pki's CA and presents certFile/keyFile when given.
func tlsClient(t *testing.T, pki *th.PKI, certFile, keyFile string) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(pki.CA)
	tc := &tls.Config{RootCAs: pool}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
}

func TestTokens(t *testing.T) {
	// Scenario: with http.auth.tokens.file, a request without a token or with a wrong one gets 401
	// with WWW-Authenticate; a listed token passes; the probes stay open; /metrics needs a token
	// unless http.auth.metrics is false; a token added to the file works without a restart; the
	// command line is never served by pprof.
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# operators\nfirst-token\n\nsecond-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, authMetrics := range []bool{true, false} {
		addr := serve(t, owned{name: "a", totals: map[string]int64{"p1": 7}}, config.HTTPSecurity{TokensFile: tokens, AuthMetrics: authMetrics})
		base := "http://" + addr
		bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
		if code, hd, _, _ := getJSON(t, http.DefaultClient, base+"/v1/products/p1", nil); code != http.StatusUnauthorized || !strings.HasPrefix(hd.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("no token: %d %v", code, hd)
		}
		if code, hd, _, _ := getJSON(t, http.DefaultClient, base+"/v1/products/p1", bearer("first-tokenX")); code != http.StatusUnauthorized || !strings.Contains(hd.Get("WWW-Authenticate"), "invalid_token") {
			t.Fatalf("wrong token: %d %v", code, hd)
		}
		if code, _, body, _ := getJSON(t, http.DefaultClient, base+"/v1/products/p1", bearer("second-token")); code != http.StatusOK || body["total"] != float64(7) {
			t.Fatalf("listed token: %d %v", code, body)
		}
		for _, probe := range []string{"/healthz", "/readyz"} {
			if code, _, _, _ := getJSON(t, http.DefaultClient, base+probe, nil); code != http.StatusOK {
				t.Fatalf("%s without a token: %d", probe, code)
			}
		}
		code, _, _, _ := getJSON(t, http.DefaultClient, base+"/metrics", nil)
		if (authMetrics && code != http.StatusUnauthorized) || (!authMetrics && code != http.StatusOK) {
			t.Fatalf("/metrics without a token, http.auth.metrics %v: %d", authMetrics, code)
		}
		if code, _, _, raw := getJSON(t, http.DefaultClient, base+"/debug/pprof/cmdline", bearer("first-token")); code != http.StatusNotFound || strings.Contains(raw, os.Args[0]) {
			t.Fatalf("pprof cmdline: %d %q", code, raw)
		}
	}
	addr := serve(t, owned{name: "a", totals: map[string]int64{"p1": 7}}, config.HTTPSecurity{TokensFile: tokens, AuthMetrics: true})
	if err := os.WriteFile(tokens, []byte("third-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, _, _ := getJSON(t, http.DefaultClient, "http://"+addr+"/v1/products/p1", http.Header{"Authorization": {"Bearer third-token"}})
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a token added to the file is refused: %d", code)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _, _, _ := getJSON(t, http.DefaultClient, "http://"+addr+"/v1/products/p1", http.Header{"Authorization": {"Bearer first-token"}}); code != http.StatusUnauthorized {
		t.Fatalf("a token removed from the file still passes: %d", code)
	}
}

func TestMutualTLSBetweenInstances(t *testing.T) {
	// Scenario: both instances serve HTTPS and require client certificates. A client without one
	// gets 401 (the probes answer it); with one it is answered. Instance A forwards to B over
	// HTTPS presenting its peer certificate, with a token B accepts; without a peer certificate
	// B refuses A's forward and A answers 503.
	pki := th.NewPKI(t)
	srvCert, srvKey, _ := pki.Issue(t, "server")
	peerCert, peerKey, _ := pki.Issue(t, "peer")
	cliCert, cliKey, _ := pki.Issue(t, "client")
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("shared-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sec := config.HTTPSecurity{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: pki.CAFile, PeerCertFile: peerCert, PeerKeyFile: peerKey,
		PeerCAFile: pki.CAFile, TokensFile: tokens, AuthMetrics: true}
	b := serve(t, owned{name: "b", totals: map[string]int64{"p1": 55}}, sec)
	a := serve(t, owned{name: "a", owner: "b", server: b}, sec)
	tok := http.Header{"Authorization": {"Bearer shared-token"}}

	anon := tlsClient(t, pki, "", "")
	if code, _, _, _ := getJSON(t, anon, "https://"+a+"/v1/products/p1", tok); code != http.StatusUnauthorized {
		t.Fatalf("a client without a certificate: %d", code)
	}
	if code, _, _, _ := getJSON(t, anon, "https://"+a+"/readyz", nil); code != http.StatusOK {
		t.Fatalf("/readyz for the probe without a certificate: %d", code)
	}
	client := tlsClient(t, pki, cliCert, cliKey)
	code, hd, body, raw := getJSON(t, client, "https://"+a+"/v1/products/p1", tok)
	if code != http.StatusOK || body["total"] != float64(55) || hd.Get(ServedByHeader) != "b; task=0_1" {
		t.Fatalf("forwarded over mutual TLS: %d %s %v", code, raw, hd)
	}
	if resp, err := http.Get("http://" + a + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the HTTPS server: %d", resp.StatusCode)
		}
	}

	noPeer := sec
	noPeer.PeerCertFile, noPeer.PeerKeyFile = "", ""
	a2 := serve(t, owned{name: "a2", owner: "b", server: b}, noPeer)
	if code, _, _, raw := getJSON(t, client, "https://"+a2+"/v1/products/p1", tok); code != http.StatusServiceUnavailable {
		t.Fatalf("forwarded without a peer certificate: %d %s", code, raw)
	}
}

func TestCertificateRotatedWhileServing(t *testing.T) {
	// Scenario: the server's certificate and key are replaced on disk (as cert-manager renews
	// them); new connections get the new certificate without a restart.
	pki := th.NewPKI(t)
	cert, key, first := pki.Issue(t, "server")
	addr := serve(t, idle{}, config.HTTPSecurity{CertFile: cert, KeyFile: key})
	served := func() int64 {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // the serial is what is checked
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if got := served(); got != first {
		t.Fatalf("serial %d, want %d", got, first)
	}
	_, _, second := pki.Issue(t, "server")
	deadline := time.Now().Add(10 * time.Second)
	for served() != second {
		if time.Now().After(deadline) {
			t.Fatalf("still serving serial %d after the rotation to %d", served(), second)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestHTTPSCertificateMidRotation(t *testing.T) {
	// Scenario: the certificate was rewritten and its key not yet (mid-rotation) while
	// handshakes look at the files: the pair that fails to load leaves the previous one
	// served and the files to be read again, and marking them does not race the looks
	// (go test -race reports the race this guards against).
	pki := th.NewPKI(t)
	cert, key, first := pki.Issue(t, "server")
	kp, err := newKeyPair(cert, key, "HTTPS certificate", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	next, _, _ := pki.Issue(t, "next")
	if err := os.Rename(next, cert); err != nil { // a new certificate, the old key
		t.Fatal(err)
	}
	// Same size and, to the file system's clock, the same time are possible:
	// make the change one a look sees.
	if later := time.Now().Add(time.Minute); os.Chtimes(cert, later, later) != nil {
		t.Fatal("touching the certificate")
	}
	kp.cert.checked = time.Time{} // look at the certificate now, not after reloadCheck
	done := make(chan struct{})
	go func() {
		// Another handshake's looks at the key file, each past reloadCheck
		// after the one before.
		defer close(done)
		start := time.Now()
		for i := 1; time.Since(start) < 200*time.Millisecond; i++ {
			if _, err := kp.key.changed(start.Add(time.Duration(i) * time.Hour)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	got, err := kp.get()
	<-done
	if err != nil {
		t.Fatalf("mid-rotation: %v, want the previous pair", err)
	}
	if serial := got.Leaf.SerialNumber.Int64(); serial != first {
		t.Fatalf("mid-rotation: serving serial %d, want the previous %d", serial, first)
	}
}

// unroutable names an owner that advertises no usable address.
type unroutable struct{ idle }

func (unroutable) Total(string) (int64, bool, error) {
	return 0, false, &NotHostedError{Task: "0_1", Partition: 1, Owner: "evil", Unroutable: "advertises an application.server that is not host:port"}
}

func TestUnroutableOwnerIsAnswered503(t *testing.T) {
	// Scenario: the owner of a product's task advertises an address that is not host:port: the
	// query is answered 503 naming the owner and why, not forwarded anywhere.
	srv := httptest.NewServer(Handler(unroutable{}))
	defer srv.Close()
	code, hd, body, _ := getJSON(t, srv.Client(), srv.URL+"/v1/products/p1", nil)
	if code != http.StatusServiceUnavailable || body["owner"] != "evil" || !strings.Contains(fmt.Sprint(body["error"]), "not host:port") || hd.Get("Retry-After") == "" {
		t.Fatalf("answer %d %v", code, body)
	}
}

// gathering lists instances that each hang until their request is done.
type gathering struct {
	idle
	peers []status.Instance
}

func (g gathering) InstanceID() string           { return "a" }
func (g gathering) Instances() []status.Instance { return g.peers }

func TestProductsGatheredInParallel(t *testing.T) {
	// Scenario: GET /v1/products asks three other instances that never answer: they are asked
	// at once under one deadline (forwardTimeout), not one after another, and their tasks are
	// listed as unavailable.
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hang.Close()
	var peers []status.Instance
	for i := range 3 {
		peers = append(peers, status.Instance{Name: fmt.Sprintf("p%d", i), Server: hang.Listener.Addr().String(), Tasks: []string{fmt.Sprintf("0_%d", i)}})
	}
	srv := httptest.NewServer(Handler(gathering{peers: peers}))
	defer srv.Close()
	began := time.Now()
	code, _, body, raw := getJSON(t, srv.Client(), srv.URL+"/v1/products", nil)
	took := time.Since(began)
	if code != http.StatusOK || len(body["unavailable_tasks"].([]any)) != 3 {
		t.Fatalf("answer %d %s", code, raw)
	}
	// One after another would take three times forwardTimeout.
	if took >= 2*forwardTimeout {
		t.Fatalf("gathering from three hanging instances took %s; one deadline is %s", took, forwardTimeout)
	}
}
