package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// API is the HTTP API of a salesagg instance.
type API struct {
	// Addr is its 127.0.0.1:PORT.
	Addr string
	// Client has a timeout: a request to an instance being killed must not
	// hang the test (or a sampling round).
	Client *http.Client
}

// NewAPI returns the API at addr, asked with a 3 s timeout.
func NewAPI(addr string) *API {
	return &API{Addr: addr, Client: &http.Client{Timeout: 3 * time.Second}}
}

// Get fetches path: status, body (at most 4 MiB), headers.
func (a *API) Get(path string) (int, []byte, http.Header, error) {
	resp, err := a.Client.Get("http://" + a.Addr + path)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(http.MaxBytesReader(nil, resp.Body, 4<<20))
	return resp.StatusCode, b.Bytes(), resp.Header, err
}

// GetJSON fetches path and decodes a 200's JSON body into v (if not nil).
// It returns the status code, and an error for any other status.
func (a *API) GetJSON(path string, v any) (int, error) {
	code, body, _, err := a.Get(path)
	if err != nil {
		return code, err
	}
	if code != http.StatusOK {
		return code, fmt.Errorf("GET %s: %d %s: %s", path, code, http.StatusText(code), strings.TrimSpace(string(body)))
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			return code, fmt.Errorf("GET %s: decoding %q: %w", path, body, err)
		}
	}
	return code, nil
}

// Ready returns nil when GET /readyz answers 200.
func (a *API) Ready() error {
	_, err := a.GetJSON("/readyz", nil)
	return err
}

// Total returns the total of product from GET /v1/products/{product}, and
// the status code.
func (a *API) Total(product string) (int64, int, error) {
	var body struct {
		Product string `json:"product"`
		Total   int64  `json:"total"`
	}
	code, err := a.GetJSON("/v1/products/"+product, &body)
	if err != nil {
		return 0, code, err
	}
	if body.Product != product {
		return 0, code, fmt.Errorf("GET /v1/products/%s answered product %q", product, body.Product)
	}
	return body.Total, code, nil
}

// CheckTotals returns nil when every product of want has its total over
// HTTP, else an error listing (up to 5 of) the differences.
func (a *API) CheckTotals(want map[string]int64) error {
	var diffs []string
	for _, p := range slices.Sorted(maps.Keys(want)) {
		got, code, err := a.Total(p)
		switch {
		case err != nil:
			diffs = append(diffs, fmt.Sprintf("%s: %v", p, err))
		case got != want[p]:
			diffs = append(diffs, fmt.Sprintf("%s: got %d want %d (HTTP %d)", p, got, want[p], code))
		}
	}
	return Summarize(diffs)
}

// Task is an entry of GET /v1/tasks.
type Task struct {
	Task       string `json:"task"`
	Partition  int32  `json:"partition"`
	Role       string `json:"role"` // active, standby or warmup
	State      string `json:"state"`
	Processed  int64  `json:"processed"`
	Duplicates int64  `json:"duplicates_skipped"`
	Forwarded  int64  `json:"forwarded"`
	BadEvents  int64  `json:"bad_events"`
	// ChangelogLag is a standby or warm-up copy's lag behind its changelog.
	ChangelogLag *int64 `json:"changelog_lag"`
}

// Active reports whether t is an active task (not a standby or warm-up
// copy).
func (t Task) Active() bool { return t.Role == "active" || t.Role == "" }

// Tasks reads GET /v1/tasks.
func (a *API) Tasks() ([]Task, error) {
	var body struct {
		Tasks []Task `json:"tasks"`
	}
	if _, err := a.GetJSON("/v1/tasks", &body); err != nil {
		return nil, err
	}
	return body.Tasks, nil
}

// Running returns the active tasks GET /v1/tasks lists as "running" (nil
// when it cannot be read: an instance starting or gone runs nothing the
// test can see).
func (a *API) Running() map[string]bool {
	ts, err := a.Tasks()
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, t := range ts {
		if t.Active() && t.State == "running" {
			out[t.Task] = true
		}
	}
	return out
}

// Counters are the counters of GET /v1/tasks summed over its entries, and
// each entry's task=state.
type Counters struct {
	Processed, Duplicates, Forwarded, Bad int64
	States                                []string
}

// Counters reads GET /v1/tasks and sums its counters.
func (a *API) Counters() (Counters, error) {
	var c Counters
	ts, err := a.Tasks()
	if err != nil {
		return c, err
	}
	for _, t := range ts {
		c.Processed += t.Processed
		c.Duplicates += t.Duplicates
		c.Forwarded += t.Forwarded
		c.Bad += t.BadEvents
		c.States = append(c.States, t.Task+"="+t.State)
	}
	return c, nil
}

// ServiceConfig is how StartService runs `salesagg run`. Empty fields leave
// the service's default.
type ServiceConfig struct {
	// Bin is the salesagg binary; Broker its bootstrap.servers.
	Bin, Broker string
	// Dir is the working directory ("": the test's).
	Dir string
	// AppID, StateDir, Input and Notif are application.id, state.dir,
	// input.topic and notification.topic.
	AppID, StateDir, Input, Notif string
	// CommitMs is commit.interval.ms (0: the service's default); from
	// 1000 on it comes with commit.idle.ms 0.
	CommitMs int
	// CrashPoint is SALESAGGTEST_CRASH_POINT ("": none).
	CrashPoint string
	// Env is more environment, Flags more flags (after the others: a flag
	// given again there wins).
	Env   []string
	Flags []string
}

// CrashPoints are the commit-cycle points SALESAGGTEST_CRASH_POINT accepts
// (a test build's hook: the process SIGKILLs itself there), per processing
// guarantee.
var CrashPoints = map[string][]string{
	"at_least_once":   {"flush-start", "changelog-produced", "changelog-flushed", "store-written", "offsets-committed"},
	"exactly_once_v2": {"changelog-produced", "transaction-committed", "store-written"},
}

// Service is a `salesagg run` process and its HTTP API.
type Service struct {
	*Proc
	*API
}

// serviceSeq numbers the services of each test (salesagg-01, -02, …) for
// their names and log files.
var serviceSeq struct {
	sync.Mutex
	n map[string]int
}

// StartService starts `salesagg run` with JSON logs and its HTTP API on a
// free loopback port. It does not wait for anything.
func StartService(t testing.TB, cfg ServiceConfig) *Service {
	t.Helper()
	serviceSeq.Lock()
	if serviceSeq.n == nil {
		serviceSeq.n = map[string]int{}
	}
	serviceSeq.n[t.Name()]++
	n := serviceSeq.n[t.Name()]
	serviceSeq.Unlock()
	addr := FreeAddr(t)
	args := []string{"run", "--bootstrap.servers", cfg.Broker}
	for _, f := range []struct{ flag, value string }{
		{"--application.id", cfg.AppID}, {"--state.dir", cfg.StateDir}, {"--input.topic", cfg.Input}, {"--notification.topic", cfg.Notif},
	} {
		if f.value != "" {
			args = append(args, f.flag, f.value)
		}
	}
	args = append(args, "--http.addr", addr, "--log.format", "json")
	if cfg.CommitMs > 0 {
		args = append(args, "--commit.interval.ms", strconv.Itoa(cfg.CommitMs))
	}
	if cfg.CommitMs >= 1000 {
		// A test's interval of a second or more holds what the service
		// folds uncommitted on purpose: no commit when the input pauses.
		args = append(args, "--commit.idle.ms", "0")
	}
	args = append(args, cfg.Flags...)
	env := slices.Clone(cfg.Env)
	crash := ""
	if cfg.CrashPoint != "" {
		env = append(env, "SALESAGGTEST_CRASH_POINT="+cfg.CrashPoint)
		crash = ", crash point " + cfg.CrashPoint
	}
	p := Start(t, Spec{Name: fmt.Sprintf("salesagg-%02d", n), Path: cfg.Bin, Args: args, Dir: cfg.Dir, Env: env})
	t.Logf("started %s (pid %d, http %s%s)", p.Name, p.PID, addr, crash)
	return &Service{Proc: p, API: NewAPI(addr)}
}

// Ready returns nil when GET /readyz answers 200; an error wrapping
// ErrGiveUp once the process has exited.
func (s *Service) Ready() error {
	if err := s.Exited(); err != nil {
		return err
	}
	return s.API.Ready()
}

// CheckTotals is API.CheckTotals, failing at once (ErrGiveUp) when the
// process has exited.
func (s *Service) CheckTotals(want map[string]int64) error {
	if err := s.Exited(); err != nil {
		return err
	}
	return s.API.CheckTotals(want)
}

// Folded returns nil once the service's tasks have processed an event.
func (s *Service) Folded() error {
	if err := s.Exited(); err != nil {
		return err
	}
	c, err := s.Counters()
	if err == nil && c.Processed == 0 {
		err = fmt.Errorf("%s processed 0 events; tasks %v", s.Name, c.States)
	}
	return err
}

// WaitReady waits until GET /readyz answers 200.
func (s *Service) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, s.Name+" to be ready", s.Ready)
}

// WaitRestored waits until the service is ready and has logged
// "Restoration took" (its tasks restored), and returns what it restored.
func (s *Service) WaitRestored(t testing.TB, timeout time.Duration) RestoreSummary {
	t.Helper()
	s.WaitReady(t, timeout)
	var sum RestoreSummary
	WaitFor(t, 10*time.Second, s.Name+` to log "Restoration took"`, func() error {
		if sum = s.Restored(t); sum.TookLine == "" {
			return errors.New(`no "Restoration took" line yet`)
		}
		return nil
	})
	return sum
}

// RestoredTasks waits until tasks "Finished restoring changelog" lines
// reached the test (through the process's log pipe, possibly after /readyz
// said ready) and returns what was restored.
func (s *Service) RestoredTasks(t testing.TB, tasks int) RestoreSummary {
	t.Helper()
	var sum RestoreSummary
	WaitFor(t, 15*time.Second, fmt.Sprintf("%d restore lines of %s", tasks, s.Name), func() error {
		if sum = s.Restored(t); sum.Lines < tasks {
			return fmt.Errorf("%d so far", sum.Lines)
		}
		return nil
	})
	return sum
}

// WaitTotals waits until every product of want has its total over HTTP.
func (s *Service) WaitTotals(t testing.TB, want map[string]int64, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, fmt.Sprintf("the totals of %d products over HTTP from %s", len(want), s.Name), func() error { return s.CheckTotals(want) })
}

// StartDevBroker runs `salesagg broker` (the embedded dev broker) on addr,
// persisting to dataDir ("": memory only), and waits until it listens.
func StartDevBroker(t testing.TB, bin, dataDir, addr string) *Proc {
	t.Helper()
	b := Start(t, Spec{Name: "dev-broker", Path: bin, Args: []string{"broker", "--data-dir", dataDir, "--listen", addr, "--log.format", "json"}})
	WaitFor(t, 30*time.Second, "the dev broker to listen", func() error {
		if err := b.Exited(); err != nil {
			return err
		}
		if len(b.LogsWith("Embedded dev broker started")) != 1 {
			return errors.New(`no "Embedded dev broker started" line yet`)
		}
		return nil
	})
	return b
}

// RepoRoot returns the main module's root, two levels above the test's
// package directory (where go test runs it).
func RepoRoot() (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	if !bytes.HasPrefix(b, []byte("module github.com/salesagg/salesagg\n")) {
		return "", fmt.Errorf("finding the repository root: %s is not the salesagg module's", filepath.Join(root, "go.mod"))
	}
	return root, nil
}

// Build builds cmd/salesagg of the module at root into out, with the go
// build flags given (e.g. -race, -tags salesaggtest), and returns go's
// output with the error.
func Build(root, out string, flags ...string) ([]byte, error) {
	cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", out, "./cmd/salesagg")...)
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		return b, fmt.Errorf("building salesagg: %w", err)
	}
	return b, nil
}

// EachGuarantee runs f as a subtest under each processing guarantee,
// exactly-once first, named after it.
func EachGuarantee(t *testing.T, f func(t *testing.T, guarantee string)) {
	t.Helper()
	for _, g := range []string{"exactly_once_v2", "at_least_once"} {
		t.Run(g, func(t *testing.T) { f(t, g) })
	}
}
