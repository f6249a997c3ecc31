package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// idle is a Backend with nothing assigned, for testing the server itself.
type idle struct{}

func (idle) Total(string) (int64, bool, error) {
	return 0, false, Unavailable(errors.New("task not ready"))
}
func (idle) Products(string, int) ([]state.Total, []string, error) { return nil, nil, nil }
func (idle) TopProducts(context.Context, int) ([]state.Total, []string, error) {
	return nil, nil, nil
}
func (idle) StandbyPage(_ context.Context, task, _ string, _ int, _ bool) ([]state.Total, int64, error) {
	return nil, 0, Unavailable(errors.New("no standby copy of task " + task + " here"))
}
func (idle) Tasks() []status.Task         { return nil }
func (idle) Ready() (bool, string)        { return false, "no partitions assigned yet" }
func (idle) Healthy() (bool, string)      { return true, "ok" }
func (idle) BadEvents() int64             { return 0 }
func (idle) InstanceID() string           { return "idle-0" }
func (idle) TaskOf(string) string         { return "" }
func (idle) Instances() []status.Instance { return nil }
func (idle) StandbyTotal(string) (int64, bool, int64, error) {
	return 0, false, 0, Unavailable(errors.New("partition not hosted by this instance"))
}
func (idle) StandbyServers(string) []status.Peer { return nil }
func (idle) WindowSizes() []time.Duration        { return nil }
func (idle) ProductWindows(string, time.Duration, int64, int64) ([]state.WindowTotal, error) {
	return nil, Unavailable(errors.New("task not ready"))
}
func (idle) StandbyWindows(string, time.Duration, int64, int64) ([]state.WindowTotal, int64, error) {
	return nil, 0, Unavailable(errors.New("partition not hosted by this instance"))
}
func (idle) StandbyWindowPage(context.Context, string, time.Duration, int64, string, int, bool) ([]state.Total, int64, error) {
	return nil, 0, Unavailable(errors.New("task not hosted by this instance"))
}
func (idle) WindowStarts(time.Duration, int64, int) ([]int64, []string, error) {
	return nil, nil, nil
}
func (idle) WindowPage(time.Duration, int64, string, int) ([]state.Total, []string, error) {
	return nil, nil, nil
}
func (idle) WindowTop(context.Context, time.Duration, int64, int) ([]state.Total, []string, error) {
	return nil, nil, nil
}
func (idle) ScanStore(task, _ string, _ int) ([]state.Total, error) {
	return nil, errors.New("task " + task + " does not run here")
}

func TestServerLimits(t *testing.T) {
	// Scenario: the HTTP server drops a client that sends its headers too slowly, refuses oversized
	// headers, and answers 503 with Retry-After for a product while nothing is assigned.
	s, err := Listen("127.0.0.1:0", idle{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { _ = s.Shutdown(t.Context()) })

	resp, err := http.Get("http://" + s.Addr() + "/v1/products/p1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("product while not ready: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	req, _ := http.NewRequest("GET", "http://"+s.Addr()+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("x", 64<<10))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("64 KiB header: %d, want 431", resp.StatusCode)
	}

	// A client that never finishes its headers is cut off after the read-header timeout.
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	_, err = bufio.NewReader(c).ReadString('\n')
	if err == nil {
		t.Fatal("server answered a request whose headers never ended")
	}
	if d := time.Since(start); d > 12*time.Second {
		t.Fatalf("slow client held the connection %s", d)
	}
}

func TestShutdownWithAConnectionThatSentNothing(t *testing.T) {
	// Scenario: another instance's HTTP client opened a connection and sent no request yet when
	// the server shuts down: the shutdown ends at its deadline without an error (a clean stop
	// exits 0) and the connection is closed.
	s, err := Listen("127.0.0.1:0", idle{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Let the server accept it (a request on another connection is answered after the accept).
	if resp, err := http.Get("http://" + s.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown = %v, want nil", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the idle connection is still open after the shutdown")
	}
}

func TestPprofOnlyWhenEnabled(t *testing.T) {
	// Scenario: with http.pprof on, a CPU profile and a heap profile can be fetched under
	// /debug/pprof/; with it off (the default) the paths are not served.
	for _, on := range []bool{false, true} {
		s, err := Listen("127.0.0.1:0", idle{}, zap.NewNop(), WithPprof(on))
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = s.Serve() }()
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
			resp, err := http.Get("http://" + s.Addr() + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case on && (resp.StatusCode != http.StatusOK || len(body) == 0):
				t.Errorf("pprof on: GET %s = %d, %d bytes", path, resp.StatusCode, len(body))
			case !on && resp.StatusCode != http.StatusNotFound:
				t.Errorf("pprof off: GET %s = %d, want 404", path, resp.StatusCode)
			}
		}
		_ = s.Shutdown(t.Context())
	}
}

func TestUnroutedRequestsAreAnsweredInJSON(t *testing.T) {
	// Scenario: a path the API does not serve is 404 and a method a path does not take is 405
	// with Allow, both as JSON with an "error" like every other answer (not the mux's plain text).
	srv := httptest.NewServer(Handler(idle{}))
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
		allow, says  string
	}{
		{http.MethodGet, "/nope", http.StatusNotFound, "", "no such path: /nope"},
		{http.MethodGet, "/v1/product", http.StatusNotFound, "", "no such path: /v1/product"},
		{http.MethodPost, "/v1/tasks", http.StatusMethodNotAllowed, "GET, HEAD", "method POST not allowed"},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || err != nil || !strings.Contains(body.Error, tc.says) ||
			resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s = %d %q %q (Allow %q, decode %v), want %d %q", tc.method, tc.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), body.Error, resp.Header.Get("Allow"), err, tc.code, tc.says)
		}
	}
}
