package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one started process under measurement: its output goes to log
// files and, line by line, to a callback; its RSS is sampled every 100 ms.
type proc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	pid     int
	done    chan struct{} // closed once the process has exited and been reaped
	exited  time.Time
	waitErr error
	logDir  string

	mu       sync.Mutex
	peakHWM  int64 // bytes, max VmHWM seen
	peakRSS  int64 // bytes, max VmRSS seen
	samples  int
	tail     map[string][]string // last lines per stream, for error reports
	stopping bool
}

const tailLines = 40

// startProc starts path with args in dir. onLine is called for every line of
// stdout ("stdout") and stderr ("stderr") with the time it was read.
func startProc(name, dir, logDir, path string, args, env []string, onLine func(stream string, at time.Time, line string)) (*proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
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
		f, err := os.Create(filepath.Join(logDir, name+"."+s))
		if err != nil {
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
	go p.sampleRSS()
	return p, nil
}

// sampleRSS polls /proc/<pid>/status every 100 ms until the process exits.
func (p *proc) sampleRSS() {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		p.sampleOnce()
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
	}
}

func (p *proc) sampleOnce() {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		return
	}
	var hwm, rss int64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if k == "VmHWM" {
			hwm = n * 1024
		} else {
			rss = n * 1024
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if hwm == 0 && rss == 0 {
		return // a zombie: no memory left
	}
	p.samples++
	p.peakHWM = max(p.peakHWM, hwm)
	p.peakRSS = max(p.peakRSS, rss)
}

// peak returns the peak resident set size seen so far: the kernel's high
// water mark (VmHWM) when available, else the largest sampled VmRSS.
//
// (wait4's ru_maxrss is no substitute: Go starts children with
// CLONE_VM|CLONE_VFORK, and exec folds the high water mark of the mm it
// replaces, the harness's own, into the child's ru_maxrss.)
func (p *proc) peak() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.peakHWM, p.peakRSS)
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
// signal), the signal, user+system CPU time.
func (p *proc) exitInfo() (code int, sig string, cpu time.Duration) {
	ps := p.cmd.ProcessState
	if ps == nil {
		return -1, "", 0
	}
	cpu = ps.UserTime() + ps.SystemTime()
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal().String(), cpu
	}
	return ps.ExitCode(), "", cpu
}

// stop sends SIGTERM and waits up to timeout for the exit, then SIGKILLs the
// process group. It returns how long the exit took after SIGTERM and whether
// SIGKILL was needed.
func (p *proc) stop(timeout time.Duration) (took time.Duration, killed bool) {
	if !p.running() {
		return 0, false
	}
	p.sampleOnce()
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
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

// kill ends the process at once (cleanup after a failure).
func (p *proc) kill() {
	if !p.running() {
		return
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
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
	code, sig, _ := p.exitInfo()
	how := fmt.Sprintf("exit code %d", code)
	if sig != "" {
		how = "signal " + sig
	}
	msg := fmt.Sprintf("%s exited (%s) %s after %s", p.name, how, while, p.exitedAt().Sub(p.started).Round(time.Millisecond))
	if t := p.tailText("stderr", 15); t != "" {
		msg += "\n--- last stderr lines (" + filepath.Join(p.logDir, p.name+".stderr") + ") ---\n" + t
	}
	if t := p.tailText("stdout", 5); t != "" {
		msg += "\n--- last stdout lines ---\n" + t
	}
	return errors.New(msg)
}
