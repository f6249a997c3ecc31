// Package child starts and stops the processes tests and benchmarks run:
// the service, brokers, the reference application. test/harness adds a
// test's cleanup and logs to it, bench/kit its log files and memory samples;
// both signal, stop and inspect a process through Process.
package child

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ReapTimeout bounds how long Kill waits for a process to be reaped after
// SIGKILL.
const ReapTimeout = 10 * time.Second

// Spec is how Start runs a process.
type Spec struct {
	// Name names the process in messages.
	Name string
	// Path and Args are the program and its arguments.
	Path string
	Args []string
	// Dir is the working directory ("": this process's).
	Dir string
	// Env is the process's whole environment (nil: this process's).
	Env []string
	// Job runs the process as a shell runs a job from a terminal: the
	// leader of a process group of its own, with SIGINT at its default
	// action, so that SignalGroup (Ctrl-C) reaches it and the children it
	// does not move to groups of their own, and Stop signals them all.
	Job bool
	// Group runs the process in a process group of its own (a Ctrl-C at
	// the terminal reaches only this process, which stops it); Stop sends
	// SIGTERM to the process alone, Kill SIGKILLs the group. Job implies
	// it.
	Group bool
	// DeathSignal is sent to the process if this one dies (default
	// SIGKILL).
	DeathSignal syscall.Signal
	// OnLine, if not nil, is called with every line of standard output
	// ("stdout") and standard error ("stderr"), without its line ending,
	// and the time it was read. It is called from a goroutine of each
	// stream, never after Done is closed.
	OnLine func(stream string, at time.Time, line string)
}

// Process is a started process. It is safe for concurrent use.
type Process struct {
	// Name, PID and Started are set by Start and not changed.
	Name    string
	PID     int
	Started time.Time

	cmd   *exec.Cmd
	group bool          // the leader of a process group of its own
	job   bool          // Spec.Job: signals go to the group
	done  chan struct{} // closed once the process has exited and its output is read

	mu     sync.Mutex
	state  *os.ProcessState // guarded by mu
	exited time.Time        // guarded by mu
}

// Start starts the process s describes; it does not wait for anything.
func Start(s Spec) (*Process, error) {
	death := s.DeathSignal
	if death == 0 {
		death = syscall.SIGKILL
	}
	p := &Process{Name: s.Name, group: s.Job || s.Group, job: s.Job, done: make(chan struct{})}
	p.cmd = exec.Command(s.Path, s.Args...)
	p.cmd.Dir = s.Dir
	p.cmd.Env = s.Env
	out := &LineWriter{Emit: emitter(s.OnLine, "stdout")}
	errw := &LineWriter{Emit: emitter(s.OnLine, "stderr")}
	p.cmd.Stdout, p.cmd.Stderr = out, errw
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: death, Setpgid: p.group}
	if err := startCmd(p.cmd, s.Job); err != nil {
		return nil, fmt.Errorf("starting %s: %w", s.Name, err)
	}
	p.Started = time.Now()
	p.PID = p.cmd.Process.Pid
	go func() {
		_ = p.cmd.Wait() // also waits for the output to be copied
		out.Flush()
		errw.Flush()
		p.mu.Lock()
		p.state = p.cmd.ProcessState
		p.exited = time.Now()
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// emitter is the Emit of a stream's LineWriter.
func emitter(onLine func(string, time.Time, string), stream string) func(string) {
	if onLine == nil {
		return func(string) {}
	}
	return func(l string) { onLine(stream, time.Now(), l) }
}

// startCmd starts cmd. A job must not inherit an ignored SIGINT (this
// process may run as a background job of a script, where SIGINT is
// ignored): a shell could not trap it, and Ctrl-C would do nothing. While
// this process handles SIGINT, a child starts with the default action
// instead.
func startCmd(cmd *exec.Cmd, job bool) error {
	if !job {
		return cmd.Start()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT)
	defer signal.Stop(sigs)
	return cmd.Start()
}

// Signal sends sig to the process (SIGSTOP and SIGCONT pause and resume it).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// SignalGroup sends sig to the process group of a Job, as a terminal sends
// Ctrl-C (SIGINT) to its foreground job.
func (p *Process) SignalGroup(sig syscall.Signal) error {
	if !p.job {
		return fmt.Errorf("signalling %s's group: it is not a job (Spec.Job)", p.Name)
	}
	return syscall.Kill(-p.PID, sig)
}

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Alive reports whether the process has not exited.
func (p *Process) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// WaitExit waits up to timeout for the process to exit by itself.
func (p *Process) WaitExit(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Stop sends SIGTERM (to the group of a Job), waits up to grace for the
// exit, then SIGKILLs as Kill does. It returns how long the exit took after
// SIGTERM and whether SIGKILL was needed (0 and false when the process had
// exited already).
func (p *Process) Stop(grace time.Duration) (took time.Duration, killed bool) {
	if !p.Alive() {
		return 0, false
	}
	t0 := time.Now()
	if p.job {
		_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	} else {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	if p.WaitExit(grace) {
		return p.ExitedAt().Sub(t0), false
	}
	_, _ = p.Kill()
	return time.Since(t0), true
}

// Kill SIGKILLs the process (its group, when it leads one) if it runs, and
// waits up to ReapTimeout for it to be reaped. It returns the time right
// after the signal was sent.
func (p *Process) Kill() (time.Time, error) {
	if !p.Alive() {
		return time.Time{}, fmt.Errorf("%s is not running", p.Name)
	}
	if !p.group || syscall.Kill(-p.PID, syscall.SIGKILL) != nil {
		_ = p.cmd.Process.Kill()
	}
	at := time.Now()
	if !p.WaitExit(ReapTimeout) {
		return at, fmt.Errorf("%s (pid %d) not reaped %s after SIGKILL", p.Name, p.PID, ReapTimeout)
	}
	return at, nil
}

// ExitState returns how the process ended (nil while it runs).
func (p *Process) ExitState() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// ExitedAt is when the process exited (zero while it runs).
func (p *Process) ExitedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// ExitCode is the process's exit code: -1 while it runs or when a signal
// ended it.
func (p *Process) ExitCode() int {
	st := p.ExitState()
	if st == nil {
		return -1
	}
	return st.ExitCode()
}

// ExitSignal is the signal that ended the process ("" while it runs or
// when it exited by itself).
func (p *Process) ExitSignal() string {
	st := p.ExitState()
	if st == nil {
		return ""
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal().String()
	}
	return ""
}

// DescribeExit says how the process ended, for messages.
func (p *Process) DescribeExit() string {
	if p.ExitState() == nil {
		return "still running"
	}
	if sig := p.ExitSignal(); sig != "" {
		return "killed by " + sig
	}
	return fmt.Sprintf("exit code %d", p.ExitCode())
}

// KilledBy reports whether the signal sig ended the process.
func (p *Process) KilledBy(sig syscall.Signal) bool {
	st := p.ExitState()
	if st == nil {
		return false
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// LineWriter is an io.Writer that hands Emit each complete line written to
// it, without its line ending. A process's output goes through one: exec
// copies it from a goroutine of its own, so Emit must be safe to call from
// another goroutine than the one that started the process.
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

// Flush emits the last line if it was not ended: once nothing more is
// written.
func (w *LineWriter) Flush() {
	if len(w.buf) > 0 {
		w.Emit(strings.TrimRight(string(w.buf), "\r"))
		w.buf = nil
	}
}
