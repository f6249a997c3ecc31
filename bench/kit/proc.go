package kit

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

// TailLines is how many of the last lines of each stream a Proc keeps for
// its error reports.
const TailLines = 40

// Spec is how Start runs a process.
type Spec struct {
	// Name names it in messages and its log files, <LogDir>/<Name>.stdout
	// and .stderr.
	Name, LogDir string
	// Path, Args and Dir are the program, its arguments and its working
	// directory; Env is added to this process's environment.
	Path string
	Args []string
	Dir  string
	Env  []string
	// SampleRSS samples the process's resident set size every 100 ms (Peak).
	SampleRSS bool
	// OnLine, if not nil, is called with every line of stdout ("stdout")
	// and stderr ("stderr") and the time it was read, from a goroutine of
	// each stream.
	OnLine func(stream string, at time.Time, line string)
}

// Proc is one started process: its output goes to log files and, line by
// line, to a callback. It runs in a process group of its own (a Ctrl-C
// reaches only the benchmark, which stops it) and gets SIGTERM if the
// benchmark dies.
type Proc struct {
	// Name, PID, Started and LogDir are set by Start and not changed.
	Name    string
	PID     int
	Started time.Time
	LogDir  string

	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped

	mu      sync.Mutex
	exited  time.Time           // guarded by mu
	tail    map[string][]string // guarded by mu: last lines per stream
	peakHWM int64               // guarded by mu: bytes, max VmHWM seen
	peakRSS int64               // guarded by mu: bytes, max VmRSS seen
	samples int                 // guarded by mu
	sample  bool
}

// Start starts the process s describes.
func Start(s Spec) (*Proc, error) {
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), s.Env...)
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.LogDir, 0o755); err != nil {
		return nil, err
	}
	p := &Proc{Name: s.Name, LogDir: s.LogDir, cmd: cmd, done: make(chan struct{}), tail: map[string][]string{}, sample: s.SampleRSS}
	files := map[string]*os.File{}
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, stream := range []string{"stdout", "stderr"} {
		f, err := os.Create(filepath.Join(s.LogDir, s.Name+"."+stream))
		if err != nil {
			closeAll()
			return nil, err
		}
		files[stream] = f
	}
	if err := cmd.Start(); err != nil {
		closeAll()
		return nil, fmt.Errorf("starting %s: %w", s.Name, err)
	}
	p.Started = time.Now()
	p.PID = cmd.Process.Pid

	var readers sync.WaitGroup
	for stream, r := range map[string]io.Reader{"stdout": stdout, "stderr": stderr} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer files[stream].Close()
			br := bufio.NewReaderSize(r, 1<<16)
			for {
				line, err := br.ReadString('\n')
				if len(line) > 0 {
					at := time.Now()
					_, _ = files[stream].WriteString(line)
					line = strings.TrimRight(line, "\r\n")
					p.mu.Lock()
					t := append(p.tail[stream], line)
					if len(t) > TailLines {
						t = t[len(t)-TailLines:]
					}
					p.tail[stream] = t
					p.mu.Unlock()
					if s.OnLine != nil {
						s.OnLine(stream, at, line)
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
		_ = cmd.Wait()
		p.mu.Lock()
		p.exited = time.Now()
		p.mu.Unlock()
		close(p.done)
	}()
	if p.sample {
		go p.sampleRSS()
	}
	return p, nil
}

// sampleRSS polls /proc/<pid>/status every 100 ms until the process exits.
func (p *Proc) sampleRSS() {
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

func (p *Proc) sampleOnce() {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
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

// Peak returns the peak resident set size seen so far (with
// Spec.SampleRSS): the kernel's high water mark (VmHWM) when available, else
// the largest sampled VmRSS.
//
// (wait4's ru_maxrss is no substitute: Go starts children with
// CLONE_VM|CLONE_VFORK, and exec folds the high water mark of the mm it
// replaces, the benchmark's own, into the child's ru_maxrss.)
func (p *Proc) Peak() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.peakHWM, p.peakRSS)
}

// Samples is how many RSS samples Peak is made of.
func (p *Proc) Samples() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.samples
}

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ExitInfo describes how the process ended: exit code (-1: killed by a
// signal, or still running), the signal, user+system CPU time.
func (p *Proc) ExitInfo() (code int, sig string, cpu time.Duration) {
	if p.Running() {
		return -1, "", 0
	}
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

// Stop sends SIGTERM and waits up to timeout for the exit, then SIGKILLs the
// process group. It returns how long the exit took after SIGTERM and whether
// SIGKILL was needed.
func (p *Proc) Stop(timeout time.Duration) (took time.Duration, killed bool) {
	if !p.Running() {
		return 0, false
	}
	if p.sample {
		p.sampleOnce()
	}
	t0 := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.ExitedAt().Sub(t0), false
	case <-time.After(timeout):
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	return time.Since(t0), true
}

// Kill9 sends SIGKILL to the process group and returns the time right after
// the signal was sent; it waits (up to 10 s) for the process to be reaped.
func (p *Proc) Kill9() (time.Time, error) {
	if !p.Running() {
		return time.Time{}, fmt.Errorf("%s is not running", p.Name)
	}
	if err := syscall.Kill(-p.PID, syscall.SIGKILL); err != nil {
		_ = p.cmd.Process.Kill()
	}
	at := time.Now()
	select {
	case <-p.done:
		return at, nil
	case <-time.After(10 * time.Second):
		return at, fmt.Errorf("%s (pid %d) not reaped 10 s after SIGKILL", p.Name, p.PID)
	}
}

// Kill ends the process at once if it runs (cleanup after a failure).
func (p *Proc) Kill() { _, _ = p.Kill9() }

// ExitedAt is when the process exited (zero while it runs).
func (p *Proc) ExitedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// TailText returns the last n lines (at most TailLines) of a stream.
func (p *Proc) TailText(stream string, n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tail[stream]
	if len(t) > n {
		t = t[len(t)-n:]
	}
	return strings.Join(t, "\n")
}

// ExitError describes an unexpected exit while doing what, with the end of
// its output.
func (p *Proc) ExitError(while string) error {
	code, sig, _ := p.ExitInfo()
	how := fmt.Sprintf("exit code %d", code)
	if sig != "" {
		how = "signal " + sig
	}
	msg := fmt.Sprintf("%s exited (%s) %s, %s after its start", p.Name, how, while, p.ExitedAt().Sub(p.Started).Round(time.Millisecond))
	if t := p.TailText("stderr", 15); t != "" {
		msg += "\n--- last stderr lines (" + filepath.Join(p.LogDir, p.Name+".stderr") + ") ---\n" + t
	}
	if t := p.TailText("stdout", 5); t != "" {
		msg += "\n--- last stdout lines ---\n" + t
	}
	return errors.New(msg)
}
