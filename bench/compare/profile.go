package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// profiled is a driver whose instances serve Go's net/http/pprof handlers
// (salesagg started with --http.pprof true).
type profiled interface {
	// pprofURL is the instance's /debug/pprof base URL, without a slash.
	pprofURL(in *instance) string
}

// profiledDriver returns d as a profiled driver when --profile is set and d
// can be profiled.
func profiledDriver(e *env, d driver) (profiled, bool) {
	if !e.o.profile {
		return nil, false
	}
	p, ok := d.(profiled)
	return p, ok
}

// profilePath is where a profile of run goes: next to the JSON results,
// <stem>-<system>-<run>.<kind>.pprof.
func (e *env) profilePath(d driver, run, kind string) string {
	return e.stem + "-" + d.name() + "-" + run + "." + kind + ".pprof"
}

// profileFiles are the profiles taken of one run (JSON).
type profileFiles struct {
	CPU        string `json:"cpu,omitempty"`
	CPUSeconds int    `json:"cpu_seconds,omitempty"`
	// The CPU profile's window began about this long after the process
	// started (when the accepted request was sent).
	CPUFromStartMs int64  `json:"cpu_from_start_ms,omitempty"`
	Heap           string `json:"heap,omitempty"`
	// The heap profile (after a forced GC) was taken this long after start.
	HeapAtMs int64    `json:"heap_at_ms,omitempty"`
	Errors   []string `json:"errors,omitempty"`
}

// cpuProfile is a CPU profile being fetched in the background.
type cpuProfile struct {
	path    string
	seconds int
	cancel  context.CancelFunc
	done    chan struct{}
	// set by the fetching goroutine before done is closed
	sentAt    time.Time
	err       error
	abandoned bool
}

// startCPUProfile asks for /debug/pprof/profile?seconds=N in the
// background. While the instance's HTTP server refuses connections (it is
// still starting) the request is repeated every 20 ms, so that a profile
// started right after launch covers the start-up.
func startCPUProfile(ctx context.Context, in *instance, base, path string, seconds int) *cpuProfile {
	ctx, cancel := context.WithCancel(ctx)
	cp := &cpuProfile{path: path, seconds: seconds, cancel: cancel, done: make(chan struct{})}
	url := fmt.Sprintf("%s/profile?seconds=%d", base, seconds)
	// The server writes the profile when the window ends; its write timeout
	// is 30 s from the request, hence at most 29 s.
	client := &http.Client{Timeout: time.Duration(seconds)*time.Second + 30*time.Second}
	go func() {
		defer close(cp.done)
		for {
			sent := time.Now()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := client.Do(req)
			if err != nil {
				if errors.Is(err, syscall.ECONNREFUSED) && in.Alive() && ctx.Err() == nil {
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				cp.err = err
				return
			}
			cp.sentAt = sent
			cp.err = saveProfile(resp, path)
			return
		}
	}()
	return cp
}

// finish waits for the profile (the caller then stops the process) and
// records it in m.
func (cp *cpuProfile) finish(in *instance, m *runMetrics, res *systemResult, system, run string) {
	if cp.abandoned {
		return
	}
	select {
	case <-cp.done:
	default:
		logf("%s: %s run: waiting for the CPU profile (%d s window) before stopping the process", system, run, cp.seconds)
		<-cp.done
	}
	cp.cancel()
	if cp.err != nil {
		msg := fmt.Sprintf("CPU profile: %v", cp.err)
		m.Profiles.Errors = append(m.Profiles.Errors, msg)
		res.anomaly("%s run: %s", run, msg)
		return
	}
	m.Profiles.CPU, m.Profiles.CPUSeconds = cp.path, cp.seconds
	m.Profiles.CPUFromStartMs = cp.sentAt.Sub(in.Started).Milliseconds()
	logf("%s: %s run: CPU profile (%d s from %.2f s after start): %s", system, run, cp.seconds,
		cp.sentAt.Sub(in.Started).Seconds(), cp.path)
}

// abandon cancels the profile (the run failed) and waits for its goroutine.
// A nil profile is a no-op.
func (cp *cpuProfile) abandon() {
	if cp == nil {
		return
	}
	cp.cancel()
	<-cp.done
	cp.abandoned = true
}

// heapProfile saves /debug/pprof/heap?gc=1 (in-use figures as of a GC run
// for it) to path and records it in m.
func heapProfile(ctx context.Context, in *instance, m *runMetrics, res *systemResult, base, path string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	at := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/heap?gc=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		err = saveProfile(resp, path)
	}
	if err != nil {
		msg := fmt.Sprintf("heap profile: %v", err)
		m.Profiles.Errors = append(m.Profiles.Errors, msg)
		res.anomaly("%s run: %s", m.Run, msg)
		return
	}
	m.Profiles.Heap, m.Profiles.HeapAtMs = path, at.Sub(in.Started).Milliseconds()
	logf("%s: %s run: heap profile at %.2f s after start: %s", res.System, m.Run, at.Sub(in.Started).Seconds(), path)
}

// saveProfile writes a 200 response's body to path (via a .tmp file and a
// rename) and closes it.
func saveProfile(resp *http.Response, path string) error {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n == 0 {
		err = errors.New("empty profile")
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
