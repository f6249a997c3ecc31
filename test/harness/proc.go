package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
// the last lines of its log are logged.
type Proc struct {
	// Name names the process in messages.
	Name string
	// LogPath is its log file.
	LogPath string
	cmd     *exec.Cmd

	mu     sync.Mutex
	stdout []string // guarded by mu
	stderr []string // guarded by mu
	log    *os.File // guarded by mu

	done  chan struct{} // closed once the process has exited and its output is read
	state *os.ProcessState
	job   bool // the leader of a process group of its own (Spec.Job)
}

// Start starts the process s describes; it does not wait for anything.
func Start(t testing.TB, s Spec) *Proc {
	t.Helper()
	f, path, err := createLog(LogDir(t), s.Name)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: s.Name, LogPath: path, log: f, done: make(chan struct{}), job: s.Job}
	p.cmd = exec.Command(s.Path, s.Args...)
	p.cmd.Dir = s.Dir
	p.cmd.Env = ChildEnv(s.Env...)
	p.cmd.Stdout = &LineWriter{Emit: func(l string) { p.line(&p.stdout, "out", l) }}
	p.cmd.Stderr = &LineWriter{Emit: func(l string) { p.line(&p.stderr, "err", l) }}
	// If the test process dies, its children die with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: s.Job}
	if err := startCmd(p.cmd, s.Job); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", s.Name, err)
	}
	go func() {
		_ = p.cmd.Wait() // also waits for the output to be copied
		p.mu.Lock()
		p.state = p.cmd.ProcessState
		p.mu.Unlock()
		close(p.done)
	}()
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

// startCmd starts cmd. A job must not inherit an ignored SIGINT (this test
// may run as a background job of a script, where SIGINT is ignored): a
// shell could not trap it, and Ctrl-C would do nothing. While this process
// handles SIGINT, a child starts with the default action instead.
func startCmd(cmd *exec.Cmd, job bool) error {
	if !job {
		return cmd.Start()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT)
	defer signal.Stop(sigs)
	return cmd.Start()
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

func (p *Proc) line(dst *[]string, stream, l string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	*dst = append(*dst, l)
	fmt.Fprintf(p.log, "%s %s| %s\n", time.Now().Format("15:04:05.000"), stream, l)
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

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (SIGSTOP and SIGCONT pause and resume it).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// SignalGroup sends sig to the process group of a Job, as a terminal sends
// Ctrl-C (SIGINT) to its foreground job.
func (p *Proc) SignalGroup(sig syscall.Signal) error {
	if !p.job {
		return fmt.Errorf("signalling %s's group: it is not a job (Spec.Job)", p.Name)
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited returns nil while the process runs, then an error wrapping
// ErrGiveUp that says how it ended: a condition given to WaitFor returns
// it first when the process must stay up.
func (p *Proc) Exited() error {
	if p.Alive() {
		return nil
	}
	return fmt.Errorf("%w: %s exited (%s)", ErrGiveUp, p.Name, p.DescribeExit())
}

// Alive reports whether the process has not exited.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// WaitExit waits up to timeout for the process to exit by itself.
func (p *Proc) WaitExit(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Stop sends SIGTERM, waits up to grace, then SIGKILLs. It reports whether
// the process exited within grace (true also if it had exited already).
func (p *Proc) Stop(grace time.Duration) bool {
	if !p.Alive() {
		return true
	}
	p.signalAll(syscall.SIGTERM)
	if p.WaitExit(grace) {
		return true
	}
	p.Kill()
	return false
}

// Kill SIGKILLs the process and waits for it.
func (p *Proc) Kill() {
	if !p.Alive() {
		return
	}
	p.signalAll(syscall.SIGKILL)
	<-p.done
}

// signalAll sends sig to the process, and to its group if it is a job.
func (p *Proc) signalAll(sig syscall.Signal) {
	if p.job {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
		return
	}
	_ = p.cmd.Process.Signal(sig)
}

// Terminate stops the process with SIGTERM and requires a clean exit (code
// 0) within StopGrace.
func (p *Proc) Terminate(t testing.TB) {
	t.Helper()
	if !p.Stop(StopGrace) {
		t.Fatalf("%s did not stop within %s of SIGTERM; killed", p.Name, StopGrace)
	}
	if code := p.ExitCode(); code != 0 {
		t.Fatalf("%s stopped with %s after SIGTERM, want exit code 0", p.Name, p.DescribeExit())
	}
	t.Logf("%s stopped cleanly", p.Name)
}

// ExitState returns how the process ended (nil while it runs).
func (p *Proc) ExitState() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// ExitCode is the process's exit code: -1 while it runs or when a signal
// ended it.
func (p *Proc) ExitCode() int {
	st := p.ExitState()
	if st == nil {
		return -1
	}
	return st.ExitCode()
}

// DescribeExit says how the process ended, for messages.
func (p *Proc) DescribeExit() string {
	st := p.ExitState()
	if st == nil {
		return "still running"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit code %d", st.ExitCode())
}

// KilledBy reports whether the signal sig ended the process.
func (p *Proc) KilledBy(sig syscall.Signal) bool {
	st := p.ExitState()
	if st == nil {
		return false
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
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

// LineWriter is an io.Writer that hands Emit each complete line written to
// it, without its line ending. A process's output goes through one: exec
// copies it from a goroutine of its own, so Emit must be safe to call from
// another goroutine than the test's.
type LineWriter struct {
	Emit func(string)
	buf  []byte
}

// Write buffers b and emits every line it completes.
func (w *LineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.Emit(strings.TrimRight(string(w.buf[:i]), "\r"))
		w.buf = w.buf[i+1:]
	}
	return len(b), nil
}
