package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/salesagg/salesagg/test/harness"
)

func TestDevScriptStopsServiceThenBroker(t *testing.T) {
	// Scenario: `make run` (scripts/dev.sh) is stopped with Ctrl-C: the terminal sends SIGINT to
	// the whole foreground process group. The service stops first (commits its last cycle, leaves
	// the group), then the broker; nothing is logged at error level, every line (the script's own
	// included) is in the service's format (JSON, standard error not being a terminal), the script
	// exits 0, and the input offsets are committed.
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	work := t.TempDir()
	brokerAddr, httpAddr := harness.FreeAddr(t), harness.FreeAddr(t)
	cmd := exec.Command(filepath.Join("..", "..", "scripts", "dev.sh"))
	cmd.Env = harness.ChildEnv("BIN="+binary, "BUILD=0", "BROKER_LISTEN="+brokerAddr, "HTTP="+httpAddr, "DATA="+work)
	// Its own process group, as a shell started from a terminal is: SIGINT goes to the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var mu sync.Mutex
	var lines []string
	// One writer for both streams: exec copies them from one pipe, and
	// cmd.Wait returns once the copy is done.
	cmd.Stdout = &harness.LineWriter{Emit: func(l string) {
		mu.Lock()
		lines = append(lines, l)
		mu.Unlock()
	}}
	cmd.Stderr = cmd.Stdout
	output := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
	// A terminal's shell starts a job with SIGINT at its default action. This
	// test may run with SIGINT ignored (a background job of a script), which
	// the child would inherit and could not trap: while this process handles
	// SIGINT, the child starts with the default action instead.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT)
	err := cmd.Start()
	signal.Stop(sigs)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed when the script has exited
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// The script's children run in process groups of their own (job
		// control): kill them too, or they would hold the output pipe.
		select {
		case <-exited:
			return
		default:
		}
		for _, pid := range processesWith(work) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("dev.sh and its children not gone 10 s after SIGKILL")
		}
	})
	t.Cleanup(func() { // runs first
		if t.Failed() {
			t.Logf("dev.sh output:\n%s", strings.Join(output(), "\n"))
		}
	})

	svc := harness.NewAPI(httpAddr)
	harness.WaitFor(t, 60*time.Second, "the service to be ready", svc.Ready)
	produceSample(t, brokerAddr)
	harness.WaitFor(t, 30*time.Second, "the sample totals over HTTP", func() error { return svc.CheckTotals(harness.SampleTotals) })

	// Ctrl-C.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if exitErr != nil {
			t.Errorf("dev.sh exited with %v after SIGINT, want 0", exitErr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("dev.sh did not exit within 60 s of SIGINT")
	}

	var msgs []string
	for _, line := range output() {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("not a JSON log line: %q", line)
			continue
		}
		if m["level"] == "error" || m["level"] == "fatal" || m["level"] == "panic" {
			t.Errorf("error line on a normal stop: %s", line)
		}
		msg, _ := m["msg"].(string)
		msgs = append(msgs, msg)
	}
	index := func(msg string) int {
		for i, m := range msgs {
			if m == msg {
				return i
			}
		}
		t.Errorf("no %q line", msg)
		return -1
	}
	shutdown := index("Shutdown requested: flushing, checkpointing and leaving the group")
	left := index("Left the group")
	stopped := index("Stopped")
	brokerStop := index("Stopping embedded dev broker")
	brokerStopped := index("Embedded dev broker stopped")
	index("Dev broker ready; starting the service")
	if !(shutdown < left && left < stopped && stopped < brokerStop && brokerStop < brokerStopped) {
		t.Errorf("order: shutdown %d, left the group %d, stopped %d, broker stopping %d, broker stopped %d: want the service's lines before the broker's",
			shutdown, left, stopped, brokerStop, brokerStopped)
	}
	for _, m := range msgs {
		if strings.Contains(m, "unable to open connection") || strings.Contains(m, "connection refused") {
			t.Errorf("the service lost the broker before it stopped: %q", m)
		}
	}

	// The last cycle was committed: the group's offsets cover the 100 events.
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	cl := harness.NewClient(t, brokerAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offsets, err := kadm.NewClient(cl).FetchOffsets(ctx, "sales-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	var committed int64
	offsets.Each(func(o kadm.OffsetResponse) {
		if o.Topic == "sales-events-v1" {
			committed += o.At
		}
	})
	if committed != 100 {
		t.Errorf("committed input offsets add up to %d, want 100", committed)
	}
}

// processesWith returns the pids of the processes whose command line
// holds s.
func processesWith(s string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(b), s) {
			out = append(out, pid)
		}
	}
	return out
}
