//go:build e2e

package k8s

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/salesagg/salesagg/test/child"
	"github.com/salesagg/salesagg/test/harness"
)

// container is one run of a pod's container as a local process, with the
// kubelet's probes of it: the startup probe until it passes, then the
// readiness and liveness probes, each on its own period, with their
// timeouts and thresholds.
type container struct {
	pod     *Pod
	run     int    // 0: the first start; 1: after the rolling update's restart
	listen  string // 127.0.0.1:PORT, standing for <pod IP>:<http port>
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	started time.Time

	startupPassed atomic.Bool
	ready         atomic.Bool
	stopProbes    context.CancelFunc
	probesDone    sync.WaitGroup

	mu      sync.Mutex
	log     *os.File
	stderr  []string
	readyAt time.Time
	// serviceReadyAt is when /readyz first answered 200 to the test's own
	// 50 ms poll: the service's readiness, before the kubelet's next probe.
	serviceReadyAt time.Time
	problems       []string // what would have made the kubelet restart it
	state          *os.ProcessState
}

// startContainer starts bin with the pod's arguments and environment, in
// the container's working directory ("/" by default), as the pod's
// runAsUser/runAsGroup with fsGroup as supplementary group when this process
// is root (else as this user), and starts its probes.
func startContainer(t *testing.T, pod *Pod, sec *corev1.PodSecurityContext, bin string, run int, listen, logDir string) *container {
	t.Helper()
	c := &container{pod: pod, run: run, listen: listen, done: make(chan struct{})}
	c.logPath = filepath.Join(logDir, fmt.Sprintf("%s.run%d.log", pod.Name, run))
	f, err := os.Create(c.logPath)
	if err != nil {
		t.Fatal(err)
	}
	c.log = f
	args := pod.Command
	if !pod.EntrypointFromImage {
		args = args[1:] // the image's path of the binary: ours instead
	}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Env = pod.Environ()
	c.cmd.Dir = pod.Container.WorkingDir
	if c.cmd.Dir == "" {
		c.cmd.Dir = "/"
	}
	c.cmd.Stdout = &child.LineWriter{Emit: func(l string) { c.line("out", l) }}
	c.cmd.Stderr = &child.LineWriter{Emit: func(l string) {
		c.mu.Lock()
		c.stderr = append(c.stderr, l)
		c.mu.Unlock()
		c.line("err", l)
	}}
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 && sec != nil && sec.RunAsUser != nil {
		cred := &syscall.Credential{Uid: uint32(*sec.RunAsUser), Gid: uint32(*sec.RunAsUser)}
		if sec.RunAsGroup != nil {
			cred.Gid = uint32(*sec.RunAsGroup)
		}
		if sec.FSGroup != nil {
			cred.Groups = []uint32{uint32(*sec.FSGroup)}
		}
		c.cmd.SysProcAttr.Credential = cred
	}
	c.started = time.Now()
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", pod.Name, err)
	}
	go func() {
		_ = c.cmd.Wait()
		c.mu.Lock()
		c.state = c.cmd.ProcessState
		c.mu.Unlock()
		close(c.done)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	c.stopProbes = cancel
	cont := pod.Container
	c.probe(ctx, "startup", cont.StartupProbe)
	c.probe(ctx, "readiness", cont.ReadinessProbe)
	c.probe(ctx, "liveness", cont.LivenessProbe)
	c.probesDone.Add(1)
	go c.watchReadyz(ctx)
	t.Cleanup(func() {
		c.stop(5 * time.Second)
		c.mu.Lock()
		c.log.Close()
		c.mu.Unlock()
		if t.Failed() {
			t.Logf("---- last lines of %s run %d (%s) ----\n%s", pod.Name, run, c.logPath, c.tail(40))
		}
	})
	return c
}

func (c *container) line(stream, l string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.log, "%s %s| %s\n", time.Now().Format("15:04:05.000"), stream, l)
}

func (c *container) note(format string, args ...any) {
	c.line("kubelet", fmt.Sprintf(format, args...))
}

// problem records what would have made the kubelet kill the container.
func (c *container) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.note("%s", msg)
	c.mu.Lock()
	c.problems = append(c.problems, msg)
	c.mu.Unlock()
}

func (c *container) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// probe runs one of the kubelet's probe workers: initialDelaySeconds, then
// every periodSeconds an HTTP GET with timeoutSeconds (200–399 passes).
// Readiness and liveness are not probed until the startup probe has passed.
// successThreshold consecutive passes make the result pass,
// failureThreshold consecutive failures make it fail: for readiness the pod
// is not ready, for startup and liveness the kubelet would kill the
// container (recorded as a problem: this rehearsal does not restart it).
func (c *container) probe(ctx context.Context, kind string, p *corev1.Probe) {
	if p == nil {
		if kind == "startup" {
			c.startupPassed.Store(true)
		}
		return
	}
	url := "http://" + c.listen + p.HTTPGet.Path
	client := &http.Client{Timeout: time.Duration(max(p.TimeoutSeconds, 1)) * time.Second}
	success, failure := max(p.SuccessThreshold, 1), max(p.FailureThreshold, 1)
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	c.probesDone.Add(1)
	go func() {
		defer c.probesDone.Done()
		if d := time.Duration(p.InitialDelaySeconds) * time.Second; d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		tick := time.NewTicker(period)
		defer tick.Stop()
		passes, fails := int32(0), int32(0)
		for {
			if kind == "startup" || c.startupPassed.Load() {
				ok, why := httpProbe(ctx, client, url)
				if ctx.Err() != nil {
					return
				}
				if ok {
					passes, fails = passes+1, 0
				} else {
					passes, fails = 0, fails+1
				}
				switch kind {
				case "startup":
					if passes >= 1 {
						c.note("startup probe passed %s after start", time.Since(c.started).Round(time.Millisecond))
						c.startupPassed.Store(true)
						return
					}
					if fails >= failure {
						c.problem("startup probe failed %d times (%s): the kubelet would restart the container", fails, why)
						return
					}
				case "readiness":
					if passes >= success && !c.ready.Load() {
						c.mu.Lock()
						c.readyAt = time.Now()
						c.mu.Unlock()
						c.ready.Store(true)
						c.note("ready %s after start", time.Since(c.started).Round(time.Millisecond))
					}
					if fails >= failure && c.ready.Load() {
						c.ready.Store(false)
						c.note("not ready: %s", why)
					}
				case "liveness":
					if fails >= failure {
						c.problem("liveness probe failed %d times (%s): the kubelet would restart the container", fails, why)
						fails = 0
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// watchReadyz polls /readyz every 50 ms until it first answers 200.
func (c *container) watchReadyz(ctx context.Context) {
	defer c.probesDone.Done()
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if ok, _ := httpProbe(ctx, client, "http://"+c.listen+"/readyz"); ok {
			c.mu.Lock()
			c.serviceReadyAt = time.Now()
			c.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func httpProbe(ctx context.Context, client *http.Client, url string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(http.MaxBytesReader(nil, resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 400 {
		return true, ""
	}
	return false, fmt.Sprintf("HTTP %d %s", resp.StatusCode, strings.TrimSpace(body.String()))
}

// waitReady waits up to timeout for the readiness probe to pass.
func (c *container) waitReady(timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !c.ready.Load() {
		select {
		case <-c.done:
			return fmt.Errorf("%s exited (%s) before it was ready", c.pod.Name, c.describeExit())
		case <-deadline.C:
			return fmt.Errorf("%s not ready after %s", c.pod.Name, timeout)
		case <-tick.C:
		}
	}
	return nil
}

// stop is the kubelet's termination: SIGTERM, then SIGKILL after grace.
// It returns how long the exit took and whether it came within grace.
func (c *container) stop(grace time.Duration) (time.Duration, bool) {
	t0 := time.Now()
	defer func() {
		c.stopProbes()
		c.probesDone.Wait()
	}()
	if !c.alive() {
		return 0, true
	}
	c.ready.Store(false) // the kubelet takes a terminating pod out of the endpoints
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return time.Since(t0), true
	case <-time.After(grace):
	}
	_ = c.cmd.Process.Kill()
	<-c.done
	return time.Since(t0), false
}

func (c *container) exitCode() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == nil {
		return -1
	}
	return c.state.ExitCode()
}

func (c *container) describeExit() string {
	c.mu.Lock()
	st := c.state
	c.mu.Unlock()
	if st == nil {
		return "still running"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit code %d", st.ExitCode())
}

func (c *container) problemsSoFar() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.problems...)
}

// logs returns the JSON log lines (stderr) so far.
func (c *container) logs() []harness.LogEntry {
	c.mu.Lock()
	lines := slices.Clone(c.stderr)
	c.mu.Unlock()
	return harness.JSONLines(lines)
}

func (c *container) tail(n int) string { return harness.Tail(c.logPath, n) }
