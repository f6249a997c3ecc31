package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/child"
)

// StopGrace is how long a process is given to exit after SIGTERM: the
// service's own shutdown grace (30 s) and its last commit.
const StopGrace = 45 * time.Second

// Spec is how Start runs a process.
type Spec struct {
	// Name names the process in messages and its log file, <Name>.log.
	Name string
	// Path and Args are the program and its arguments.
	Path string
	Args []string
	// Dir is the working directory ("": the test's).
	Dir string
	// Env is added to ChildEnv().
	Env []string
	// Job runs the process as a shell runs a job from a terminal: the
	// leader of a process group of its own, with SIGINT at its default
	// action, so that SignalGroup (Ctrl-C) reaches it and the children
	// it does not move to groups of their own, and Stop signals them all.
	Job bool
}

// Proc is a child process of a test. Its standard output and error are kept
// line by line, in memory and in a log file (timestamped, both streams); it
// dies with the test process (Pdeathsig), and when its test ends it is
// stopped (SIGTERM, then SIGKILL after StopGrace) and, if the test failed,
// the last lines of its log are logged. It is signalled, stopped and
// inspected through its child.Process.
type Proc struct {
	*child.Process
	// LogPath is its log file.
	LogPath string

	mu     sync.Mutex
	stdout []string // guarded by mu
	stderr []string // guarded by mu
	log    *os.File // guarded by mu
}

// Start starts the process s describes; it does not wait for anything.
func Start(t testing.TB, s Spec) *Proc {
	t.Helper()
	f, path, err := createLog(LogDir(t), s.Name)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{LogPath: path, log: f}
	p.Process, err = child.Start(child.Spec{
		Name: s.Name, Path: s.Path, Args: s.Args, Dir: s.Dir,
		Env: ChildEnv(s.Env...), Job: s.Job, OnLine: p.line,
	})
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(StopGrace)
		if t.Failed() {
			where := "set E2E_LOG_DIR to keep full logs"
			if os.Getenv("E2E_LOG_DIR") != "" {
				where = "full log: " + p.LogPath
			}
			t.Logf("---- last lines of %s (%s) ----\n%s", p.Name, where, p.Tail(60))
		}
		p.mu.Lock()
		p.log.Close()
		p.mu.Unlock()
	})
	return p
}

// createLog creates <dir>/<name>.log, or <name>-2.log and so on when a
// process of that name logged there already.
func createLog(dir, name string) (*os.File, string, error) {
	for n := 1; ; n++ {
		path := filepath.Join(dir, name+".log")
		if n > 1 {
			path = filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, n))
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if !os.IsExist(err) {
			return f, path, err
		}
	}
}

// line keeps a line of the process's output (stream "stdout" or "stderr").
func (p *Proc) line(stream string, at time.Time, l string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	dst, tag := &p.stdout, "out"
	if stream == "stderr" {
		dst, tag = &p.stderr, "err"
	}
	*dst = append(*dst, l)
	fmt.Fprintf(p.log, "%s %s| %s\n", at.Format("15:04:05.000"), tag, l)
}

// LogDir returns where a test's process logs go: $E2E_LOG_DIR/<test> when
// set (kept after the run), else a temp dir of the test.
func LogDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("E2E_LOG_DIR"); d != "" {
		dir := filepath.Join(d, strings.NewReplacer("/", "_").Replace(t.Name()))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// ChildEnv is this process's environment without the variables that would
// configure salesagg behind the test's back, and with extra.
func ChildEnv(extra ...string) []string {
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

// Exited returns nil while the process runs, then an error wrapping
// ErrGiveUp that says how it ended: a condition given to WaitFor returns
// it first when the process must stay up.
func (p *Proc) Exited() error {
	if p.Alive() {
		return nil
	}
	return fmt.Errorf("%w: %s exited (%s)", ErrGiveUp, p.Name, p.DescribeExit())
}

// Terminate stops the process with SIGTERM and requires a clean exit (code
// 0) within StopGrace.
func (p *Proc) Terminate(t testing.TB) {
	t.Helper()
	if _, killed := p.Stop(StopGrace); killed {
		t.Fatalf("%s did not stop within %s of SIGTERM; killed", p.Name, StopGrace)
	}
	if code := p.ExitCode(); code != 0 {
		t.Fatalf("%s stopped with %s after SIGTERM, want exit code 0", p.Name, p.DescribeExit())
	}
	t.Logf("%s stopped cleanly", p.Name)
}

// StdoutLines returns the lines of standard output so far.
func (p *Proc) StdoutLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.stdout...)
}

// StderrLines returns the lines of standard error so far.
func (p *Proc) StderrLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.stderr...)
}

// Stderr returns standard error so far, each line ended by "\n": an offset
// into it marks a moment (only what comes after counts).
func (p *Proc) Stderr() string {
	var b strings.Builder
	for _, l := range p.StderrLines() {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// Tail returns the last n lines of the process's log file.
func (p *Proc) Tail(n int) string { return Tail(p.LogPath, n) }

// Tail returns the last n lines of the file at path (the error, if it
// cannot be read).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
