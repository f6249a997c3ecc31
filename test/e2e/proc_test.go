//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/port"
)

// waitFor polls cond every 200 ms until it returns nil, failing the test
// with what and cond's last error when timeout passes first.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
	}
}

// poll is waitFor without the test: it returns cond's last error on timeout.
func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}

// logDir returns where the test's process logs go: $E2E_LOG_DIR/<test> when
// set (kept after the run), else a temp dir of the test.
func logDir(t *testing.T) string {
	if d := os.Getenv("E2E_LOG_DIR"); d != "" {
		dir := filepath.Join(d, strings.NewReplacer("/", "_").Replace(t.Name()))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// proc is a child process whose stdout and stderr lines are kept in memory
// and in a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string

	mu     sync.Mutex
	stdout []string
	stderr []string
	log    *os.File

	done  chan struct{} // closed when the process has exited
	state *os.ProcessState
}

// startProc starts argv with env (the whole environment) in dir. It is
// stopped (SIGTERM, then SIGKILL) when the test ends; on failure the tail of
// its output is logged.
func startProc(t *testing.T, name, dir string, env []string, argv ...string) *proc {
	t.Helper()
	logPath := filepath.Join(logDir(t), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, logPath: logPath, log: f, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Dir = dir
	p.cmd.Env = env
	p.cmd.Stdout = &lineWriter{emit: func(l string) { p.line(&p.stdout, "out", l) }}
	p.cmd.Stderr = &lineWriter{emit: func(l string) { p.line(&p.stderr, "err", l) }}
	// If this test process dies, its children die with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait() // also waits for the output to be copied
		p.mu.Lock()
		p.state = p.cmd.ProcessState
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(45 * time.Second)
		if t.Failed() {
			where := "set E2E_LOG_DIR to keep full logs"
			if os.Getenv("E2E_LOG_DIR") != "" {
				where = "full log: " + logPath
			}
			t.Logf("---- last lines of %s (%s) ----\n%s", name, where, p.tail(60))
		}
		p.mu.Lock()
		p.log.Close()
		p.mu.Unlock()
	})
	return p
}

func (p *proc) line(dst *[]string, stream, l string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	*dst = append(*dst, l)
	fmt.Fprintf(p.log, "%s %s| %s\n", time.Now().Format("15:04:05.000"), stream, l)
}

// tail returns the last n lines of the process's log file.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// alive reports whether the process has not exited.
func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exitState returns how the process ended (nil while it runs).
func (p *proc) exitState() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// waitExit waits up to timeout for the process to exit by itself.
func (p *proc) waitExit(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs. It reports whether
// the process exited within grace (true also if it had exited already).
func (p *proc) stop(grace time.Duration) bool {
	if !p.alive() {
		return true
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if p.waitExit(grace) {
		return true
	}
	p.kill()
	return false
}

// kill SIGKILLs the process and waits for it.
func (p *proc) kill() {
	if !p.alive() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) stdoutLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.stdout...)
}

func (p *proc) stderrLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.stderr...)
}

// describeExit says how the process ended, for messages.
func (p *proc) describeExit() string {
	st := p.exitState()
	if st == nil {
		return "still running"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit code %d", st.ExitCode())
}

// killedBy reports whether the process ended by the signal sig.
func (p *proc) killedBy(sig syscall.Signal) bool {
	st := p.exitState()
	if st == nil {
		return false
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// lineWriter splits what is written into lines.
type lineWriter struct {
	buf  []byte
	emit func(string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.emit(strings.TrimRight(string(w.buf[:i]), "\r"))
		w.buf = w.buf[i+1:]
	}
	return len(b), nil
}

// freeAddr returns a free 127.0.0.1:PORT.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := port.Free()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// childEnv is this process's environment without the variables that would
// change how salesagg is configured behind the test's back.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SALESAGG_") || name == "SALESAGGTEST_CRASH_POINT" || name == "KAFKA_BOOTSTRAP_SERVERS" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// ---------------------------------------------------------------------------
// salesagg

// serviceConfig is how a test runs salesagg.
type serviceConfig struct {
	appID      string
	stateDir   string
	input      string
	notif      string
	commitMs   int      // 0: the service's default
	crashPoint string   // SALESAGGTEST_CRASH_POINT, "" for none
	extra      []string // more flags
}

// service is one salesagg process.
type service struct {
	*proc
	httpAddr string
	http     *http.Client
}

var serviceSeq = map[string]int{}
var serviceSeqMu sync.Mutex

// startService starts `salesagg run` with JSON logs, on a free loopback
// port. It does not wait for anything.
func startService(t *testing.T, cfg serviceConfig) *service {
	t.Helper()
	serviceSeqMu.Lock()
	serviceSeq[t.Name()]++
	n := serviceSeq[t.Name()]
	serviceSeqMu.Unlock()
	addr := freeAddr(t)
	args := []string{binPath, "run",
		"--bootstrap.servers", bootstrap,
		"--application.id", cfg.appID,
		"--state.dir", cfg.stateDir,
		"--input.topic", cfg.input,
		"--notification.topic", cfg.notif,
		"--http.addr", addr,
		"--log.format", "json",
	}
	if cfg.commitMs > 0 {
		args = append(args, "--commit.interval.ms", strconv.Itoa(cfg.commitMs))
	}
	args = append(args, cfg.extra...)
	var env []string
	if cfg.crashPoint != "" {
		env = append(env, "SALESAGGTEST_CRASH_POINT="+cfg.crashPoint)
	}
	name := fmt.Sprintf("salesagg-%02d", n)
	p := startProc(t, name, repoRoot, childEnv(env...), args...)
	t.Logf("started %s (pid %d, http %s%s)", name, p.pid(), addr, map[bool]string{true: ", crash point " + cfg.crashPoint}[cfg.crashPoint != ""])
	return &service{proc: p, httpAddr: addr, http: &http.Client{Timeout: 3 * time.Second}}
}

// logEntry is one JSON log line of salesagg.
type logEntry map[string]any

func (e logEntry) msg() string { s, _ := e["msg"].(string); return s }

func (e logEntry) int(key string) (int64, bool) {
	switch v := e[key].(type) {
	case float64:
		return int64(v), true
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	}
	return 0, false
}

// logs returns the JSON lines logged so far (others are skipped).
func (s *service) logs() []logEntry {
	var out []logEntry
	for _, l := range s.stderrLines() {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var e logEntry
		if json.Unmarshal([]byte(l), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

var finishedRestoring = regexp.MustCompile(`^Finished restoring changelog (\S+)-(\d+) to store (\S+) with a total number of (\d+) records`)

// restoreSummary is what a start logged about restoring its tasks.
type restoreSummary struct {
	partitions map[int]int64 // changelog partition → records restored
	total      int64
	tookLine   string // the "Restoration took ..." line, "" if none yet
}

// restored reads the "Finished restoring changelog" and "Restoration took"
// lines logged so far. The record count comes from the JSON field "records"
// and must agree with the number in the message.
func (s *service) restored(t *testing.T) restoreSummary {
	t.Helper()
	sum := restoreSummary{partitions: map[int]int64{}}
	for _, e := range s.logs() {
		m := e.msg()
		if strings.HasPrefix(m, "Restoration took ") {
			sum.tookLine = m
		}
		g := finishedRestoring.FindStringSubmatch(m)
		if g == nil {
			continue
		}
		p, _ := strconv.Atoi(g[2])
		inMsg, _ := strconv.ParseInt(g[4], 10, 64)
		n, ok := e.int("records")
		if !ok || n != inMsg {
			t.Errorf("%s: restore line %q has field records=%v, want %d", s.name, m, e["records"], inMsg)
		}
		sum.partitions[p] += n
		sum.total += n
	}
	return sum
}

// get fetches path from the service's HTTP API and decodes the JSON body
// into v (if not nil). It returns the status code.
func (s *service) get(path string, v any) (int, error) {
	resp, err := s.http.Get("http://" + s.httpAddr + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := readAllLimited(resp)
	if err != nil {
		return resp.StatusCode, err
	}
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			return resp.StatusCode, fmt.Errorf("GET %s: decoding %q: %w", path, body, err)
		}
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	return resp.StatusCode, nil
}

func readAllLimited(resp *http.Response) ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(http.MaxBytesReader(nil, resp.Body, 4<<20))
	return b.Bytes(), err
}

// ready reports nil when GET /readyz answers 200.
func (s *service) ready() error {
	if !s.alive() {
		return fmt.Errorf("%s exited (%s)", s.name, s.describeExit())
	}
	_, err := s.get("/readyz", nil)
	return err
}

// waitReady waits until /readyz answers 200 and the restore is logged.
func (s *service) waitReady(t *testing.T, timeout time.Duration) restoreSummary {
	t.Helper()
	waitFor(t, timeout, s.name+" to be ready", s.ready)
	var sum restoreSummary
	waitFor(t, 10*time.Second, s.name+" to log \"Restoration took\"", func() error {
		sum = s.restored(t)
		if sum.tookLine == "" {
			return errors.New("no \"Restoration took\" line yet")
		}
		return nil
	})
	return sum
}

// total returns the total of product from GET /v1/products/{product}.
func (s *service) total(product string) (int64, int, error) {
	var body struct {
		Product string `json:"product"`
		Total   int64  `json:"total"`
	}
	code, err := s.get("/v1/products/"+product, &body)
	if err != nil {
		return 0, code, err
	}
	if body.Product != product {
		return 0, code, fmt.Errorf("GET /v1/products/%s answered product %q", product, body.Product)
	}
	return body.Total, code, nil
}

// checkTotals returns nil when every product of want has its total over
// HTTP, else an error listing (up to 5 of) the differences.
func (s *service) checkTotals(want map[string]int64) error {
	if !s.alive() {
		return fmt.Errorf("%s exited (%s)", s.name, s.describeExit())
	}
	var diffs []string
	for _, p := range sortedKeys(want) {
		got, code, err := s.total(p)
		switch {
		case err != nil:
			diffs = append(diffs, fmt.Sprintf("%s: %v", p, err))
		case got != want[p]:
			diffs = append(diffs, fmt.Sprintf("%s: got %d want %d (HTTP %d)", p, got, want[p], code))
		}
	}
	return summarize(diffs)
}

// taskCounters sums the counters of GET /v1/tasks.
type taskCounters struct {
	Processed, Duplicates, Forwarded, Bad int64
	States                                []string
}

func (s *service) tasks() (taskCounters, error) {
	var body struct {
		Tasks []struct {
			Task       string `json:"task"`
			State      string `json:"state"`
			Processed  int64  `json:"processed"`
			Duplicates int64  `json:"duplicates_skipped"`
			Forwarded  int64  `json:"forwarded"`
			BadEvents  int64  `json:"bad_events"`
		} `json:"tasks"`
	}
	var c taskCounters
	if _, err := s.get("/v1/tasks", &body); err != nil {
		return c, err
	}
	for _, t := range body.Tasks {
		c.Processed += t.Processed
		c.Duplicates += t.Duplicates
		c.Forwarded += t.Forwarded
		c.Bad += t.BadEvents
		c.States = append(c.States, t.Task+"="+t.State)
	}
	return c, nil
}

// terminate stops the service with SIGTERM and requires a clean exit (code
// 0) within the shutdown grace period.
func (s *service) terminate(t *testing.T) {
	t.Helper()
	if !s.stop(45 * time.Second) {
		t.Fatalf("%s did not stop within 45 s of SIGTERM; killed", s.name)
	}
	if st := s.exitState(); st == nil || st.ExitCode() != 0 {
		t.Fatalf("%s stopped with %s after SIGTERM, want exit code 0", s.name, s.describeExit())
	}
	t.Logf("%s stopped cleanly", s.name)
}

func summarize(diffs []string) error {
	if len(diffs) == 0 {
		return nil
	}
	n, more := len(diffs), ""
	if n > 5 {
		more = fmt.Sprintf(" (and %d more)", n-5)
		diffs = diffs[:5]
	}
	return fmt.Errorf("%d differences: %s%s", n, strings.Join(diffs, "; "), more)
}

// scanLines reads the key:json lines of a file as kafka-console-producer
// with parse.key=true does: the key ends at the first ':'.
func scanLines(t *testing.T, path string) [][2]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("%s: line without ':': %q", path, line)
		}
		out = append(out, [2]string{k, v})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
