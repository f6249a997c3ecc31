package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// healthServer is a real net/http server on loopback answering /readyz with
// the given status and body, and /healthz with 200.
func healthServer(t *testing.T, status int, body string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("User-Agent") != "salesagg-health" {
			t.Errorf("User-Agent %q", r.Header.Get("User-Agent"))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("GET /moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/healthz", http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func runHealthT(t *testing.T, environ []string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runHealth(args, environ, &out, &errb)
	return code, out.String(), errb.String()
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestHealthExitCodes(t *testing.T) {
	ready := healthServer(t, http.StatusOK, `{"ready":true,"reason":""}`)
	restoring := healthServer(t, http.StatusServiceUnavailable, `{"ready":false,"reason":"task 0_1 is restoring"}`)
	plain := healthServer(t, http.StatusInternalServerError, "boom\nsecond line\n")
	dead := closedAddr(t)

	tests := []struct {
		name     string
		args     []string
		env      []string
		code     int
		inStderr string
	}{
		{"ready", []string{"--url", ready.URL + "/readyz"}, nil, 0, ""},
		{"503 with the reason from the JSON body", []string{"--url", restoring.URL + "/readyz"}, nil, 1,
			"GET " + restoring.URL + "/readyz: 503 Service Unavailable: task 0_1 is restoring"},
		{"non-JSON body folded onto one line", []string{"--url", plain.URL + "/readyz"}, nil, 1,
			"500 Internal Server Error: boom second line"},
		{"not found", []string{"--url", ready.URL + "/nope"}, nil, 1, "404 Not Found"},
		{"redirect not followed", []string{"--url", ready.URL + "/moved"}, nil, 1, "302 Found"},
		{"connection refused", []string{"--url", "http://" + dead + "/readyz"}, nil, 1, "connection refused"},
		{"address from SALESAGG_HTTP_ADDR", nil, []string{"SALESAGG_HTTP_ADDR=" + hostPort(t, ready.URL)}, 0, ""},
		{"wildcard host probes 127.0.0.1", nil, []string{"SALESAGG_HTTP_ADDR=:" + portOf(t, ready.URL)}, 0, ""},
		{"0.0.0.0 probes 127.0.0.1", nil, []string{"SALESAGG_HTTP_ADDR=0.0.0.0:" + portOf(t, ready.URL)}, 0, ""},
		{"derived address, not ready", nil, []string{"SALESAGG_HTTP_ADDR=:" + portOf(t, restoring.URL)}, 1, "task 0_1 is restoring"},
		{"--path /healthz at the derived address", []string{"--path", "/healthz"}, []string{"SALESAGG_HTTP_ADDR=:" + portOf(t, restoring.URL)}, 0, ""},
		{"--http.addr beats the environment", []string{"--http.addr", hostPort(t, ready.URL)}, []string{"SALESAGG_HTTP_ADDR=" + dead}, 0, ""},
		{"bad http.addr", nil, []string{"SALESAGG_HTTP_ADDR=8080"}, 1, `http.addr "8080": must be host:port or :port`},
		{"unknown flag exits 1, not 2", []string{"--nope"}, nil, 1, "unknown flag: --nope"},
		{"stray argument", []string{"extra"}, nil, 1, `unexpected argument "extra"`},
		{"bad timeout", []string{"--timeout", "0s"}, nil, 1, "--timeout must be positive"},
		{"bad path", []string{"--path", "readyz"}, nil, 1, "--path must start with '/'"},
		{"bad URL", []string{"--url", "http://[::1"}, nil, 1, "bad URL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runHealthT(t, tc.env, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if tc.code == 0 {
				if stderr != "" || !strings.Contains(stdout, "200 OK") {
					t.Fatalf("stdout %q, stderr %q", stdout, stderr)
				}
				return
			}
			if !strings.HasPrefix(stderr, "salesagg health: ") || !strings.HasSuffix(stderr, "\n") ||
				strings.Count(stderr, "\n") != 1 {
				t.Fatalf("stderr is not one line starting with 'salesagg health: ': %q", stderr)
			}
			if !strings.Contains(stderr, tc.inStderr) {
				t.Fatalf("stderr %q does not contain %q", stderr, tc.inStderr)
			}
		})
	}
}

func TestHealthDefaultURL(t *testing.T) {
	// Nothing set: http.addr's default :8080, probed on 127.0.0.1. Whether
	// something answers there is not up to the test; the URL shown is.
	code, stdout, stderr := runHealthT(t, nil, "--timeout", "1s")
	if !strings.Contains(stdout+stderr, "http://127.0.0.1:8080/readyz") || (code != 0 && code != 1) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestHealthTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	start := time.Now()
	code, _, stderr := runHealthT(t, nil, "--url", srv.URL+"/readyz", "--timeout", "300ms")
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %s with --timeout 300ms", took)
	}
	if code != 1 || !strings.Contains(stderr, "no answer within 300ms") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

func TestHealthAddressFromConfigFile(t *testing.T) {
	ready := healthServer(t, http.StatusOK, `{"ready":true}`)
	dir := t.TempDir()
	file := filepath.Join(dir, "salesagg.yaml")
	// A key the probe does not use, even an unknown one, does not fail it.
	yaml := "http:\n  addr: \"0.0.0.0:" + portOf(t, ready.URL) + "\"\nsome.unknown.key: 1\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runHealthT(t, nil, "--config", file); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	// The environment beats the file, as for the service.
	code, _, stderr := runHealthT(t, []string{"SALESAGG_HTTP_ADDR=" + closedAddr(t)}, "--config", file)
	if code != 1 || !strings.Contains(stderr, "connection refused") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runHealthT(t, nil, "--config", filepath.Join(dir, "missing.yaml"))
	if code != 1 || !strings.Contains(stderr, "reading http.addr from") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// The built binary: the exit codes Docker sees, through main.
func TestHealthBinaryExitCodes(t *testing.T) {
	ready := healthServer(t, http.StatusOK, `{"ready":true}`)
	restoring := healthServer(t, http.StatusServiceUnavailable, `{"ready":false,"reason":"no partitions assigned yet"}`)
	for _, tc := range []struct {
		addr string
		code int
	}{{hostPort(t, ready.URL), 0}, {hostPort(t, restoring.URL), 1}, {closedAddr(t), 1}} {
		cmd := exec.Command(binary, "health")
		cmd.Env = append(os.Environ(), "SALESAGG_HTTP_ADDR="+tc.addr)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Fatalf("%s: exit %d, want %d (stderr %q)", tc.addr, code, tc.code, stderr.String())
		}
		if tc.addr == hostPort(t, restoring.URL) && !strings.Contains(stderr.String(), "no partitions assigned yet") {
			t.Fatalf("stderr %q", stderr.String())
		}
	}
	// A bad flag is unhealthy (1), never Docker's reserved 2.
	if err := exec.Command(binary, "health", "--bogus").Run(); err == nil || err.(*exec.ExitError).ExitCode() != 1 {
		t.Fatalf("health --bogus: %v, want exit 1", err)
	}
}

func hostPort(t *testing.T, rawURL string) string {
	t.Helper()
	return strings.TrimPrefix(rawURL, "http://")
}

func portOf(t *testing.T, rawURL string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(hostPort(t, rawURL))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func TestHealthOverTLS(t *testing.T) {
	// Scenario: with http.tls.cert.file set (here in the environment, as on Kubernetes), health
	// probes https on loopback and checks the certificate's chain against the CA, not its name
	// (the certificate names the pod's DNS name); a certificate from another CA fails.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ready":true}`))
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"SALESAGG_HTTP_TLS_CERT_FILE=" + caFile, "SALESAGG_HTTP_ADDR=" + srv.Listener.Addr().String()}
	if code, out, errOut := runHealthT(t, env); code != healthOK || !strings.HasPrefix(out, "https://") {
		t.Fatalf("health over TLS: %d %q %q", code, out, errOut)
	}
	// A CA of its own (httptest's servers all share one certificate).
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "another CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(dir, "other.pem")
	if err := os.WriteFile(wrong, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "SALESAGG_HTTP_TLS_PEER_CA_FILE="+wrong)
	if code, _, errOut := runHealthT(t, env); code != healthUnhealthy || !strings.Contains(errOut, "certificate") {
		t.Fatalf("health against another CA: %d %q", code, errOut)
	}
}
