package kit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/salesagg/salesagg/test/child"
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
// benchmark dies. It is signalled, stopped and inspected through its
// child.Process.
type Proc struct {
	*child.Process
	// LogDir is set by Start and not changed.
	LogDir string

	mu      sync.Mutex
	tail    map[string][]string // guarded by mu: last lines per stream
	peakHWM int64               // guarded by mu: bytes, max VmHWM seen
	peakRSS int64               // guarded by mu: bytes, max VmRSS seen
	samples int                 // guarded by mu
	sample  bool
}

// Start starts the process s describes.
func Start(s Spec) (*Proc, error) {
	if err := os.MkdirAll(s.LogDir, 0o755); err != nil {
		return nil, err
	}
	p := &Proc{LogDir: s.LogDir, tail: map[string][]string{}, sample: s.SampleRSS}
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
	var err error
	p.Process, err = child.Start(child.Spec{
		Name: s.Name, Path: s.Path, Args: s.Args, Dir: s.Dir,
		Env:   append(os.Environ(), s.Env...),
		Group: true, DeathSignal: syscall.SIGTERM,
		OnLine: func(stream string, at time.Time, line string) {
			_, _ = files[stream].WriteString(line + "\n")
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
		},
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	go func() {
		<-p.Done()
		closeAll()
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
		case <-p.Done():
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

// ExitInfo describes how the process ended: exit code (-1: killed by a
// signal, or still running), the signal, user+system CPU time.
func (p *Proc) ExitInfo() (code int, sig string, cpu time.Duration) {
	ps := p.ExitState()
	if ps == nil {
		return -1, "", 0
	}
	return ps.ExitCode(), p.ExitSignal(), ps.UserTime() + ps.SystemTime()
}

// Stop samples the memory a last time (with Spec.SampleRSS), then stops the
// process as child.Process.Stop does.
func (p *Proc) Stop(timeout time.Duration) (took time.Duration, killed bool) {
	if p.sample && p.Alive() {
		p.sampleOnce()
	}
	return p.Process.Stop(timeout)
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
