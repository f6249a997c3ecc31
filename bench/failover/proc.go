package main

// Process handling, after bench/compare/proc.go (without the RSS sampling).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one started process: its output goes to log files and, line by
// line, to a callback.
type proc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	pid     int
	done    chan struct{} // closed once the process has exited and been reaped
	logDir  string

	mu      sync.Mutex
	exited  time.Time
	waitErr error
	tail    map[string][]string // last lines per stream, for error reports
}

const tailLines = 40

// startProc starts path with args in dir. onLine is called for every line of
// stdout ("stdout") and stderr ("stderr") with the time it was read.
func startProc(name, dir, logDir, path string, args []string, onLine func(stream string, at time.Time, line string)) (*proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	cmd.Stdin = nil
	// Own process group (a Ctrl-C reaches only the harness, which stops the
	// process itself); SIGTERM to the child if the harness dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), logDir: logDir, tail: map[string][]string{}}
	files := map[string]*os.File{}
	for _, s := range []string{"stdout", "stderr"} {
		f, err := os.OpenFile(filepath.Join(logDir, name+"."+s), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files[s] = f
	}
	if err := cmd.Start(); err != nil {
		for _, f := range files {
			f.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p.started = time.Now()
	p.pid = cmd.Process.Pid

	var readers sync.WaitGroup
	for s, r := range map[string]io.Reader{"stdout": stdout, "stderr": stderr} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer files[s].Close()
			br := bufio.NewReaderSize(r, 1<<16)
			for {
				line, err := br.ReadString('\n')
				if len(line) > 0 {
					at := time.Now()
					_, _ = files[s].WriteString(line)
					line = strings.TrimRight(line, "\r\n")
					p.mu.Lock()
					t := append(p.tail[s], line)
					if len(t) > tailLines {
						t = t[len(t)-tailLines:]
					}
					p.tail[s] = t
					p.mu.Unlock()
					if onLine != nil {
						onLine(s, at, line)
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() {
		readers.Wait()
		err := cmd.Wait()
		p.mu.Lock()
		p.exited = time.Now()
		p.waitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exitInfo describes how the process ended: exit code (-1: killed by a
// signal or still running) and the signal.
func (p *proc) exitInfo() (code int, sig string) {
	if p.running() {
		return -1, ""
	}
	ps := p.cmd.ProcessState
	if ps == nil {
		return -1, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal().String()
	}
	return ps.ExitCode(), ""
}

// stop sends SIGTERM and waits up to timeout for the exit, then SIGKILLs the
// process group. It returns how long the exit took after SIGTERM and whether
// SIGKILL was needed.
func (p *proc) stop(timeout time.Duration) (took time.Duration, killed bool) {
	if !p.running() {
		return 0, false
	}
	t0 := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitedAt().Sub(t0), false
	case <-time.After(timeout):
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	return time.Since(t0), true
}

// kill9 sends SIGKILL to the process group and returns the time right after
// the signal was sent; it waits (bounded) for the process to be reaped.
func (p *proc) kill9() (time.Time, error) {
	if !p.running() {
		return time.Time{}, fmt.Errorf("%s is not running", p.name)
	}
	if err := syscall.Kill(-p.pid, syscall.SIGKILL); err != nil {
		_ = p.cmd.Process.Kill()
	}
	at := time.Now()
	select {
	case <-p.done:
		return at, nil
	case <-time.After(10 * time.Second):
		return at, fmt.Errorf("%s (pid %d) not reaped 10 s after SIGKILL", p.name, p.pid)
	}
}

func (p *proc) exitedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// tailText returns the last lines of a stream.
func (p *proc) tailText(stream string, n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tail[stream]
	if len(t) > n {
		t = t[len(t)-n:]
	}
	return strings.Join(t, "\n")
}

// exitError describes an unexpected exit, with the end of its output.
func (p *proc) exitError(while string) error {
	code, sig := p.exitInfo()
	how := fmt.Sprintf("exit code %d", code)
	if sig != "" {
		how = "signal " + sig
	}
	msg := fmt.Sprintf("%s exited (%s) %s, %s after its start", p.name, how, while, p.exitedAt().Sub(p.started).Round(time.Millisecond))
	if t := p.tailText("stderr", 15); t != "" {
		msg += "\n--- last stderr lines (" + filepath.Join(p.logDir, p.name+".stderr") + ") ---\n" + t
	}
	if t := p.tailText("stdout", 5); t != "" {
		msg += "\n--- last stdout lines ---\n" + t
	}
	return errors.New(msg)
}
