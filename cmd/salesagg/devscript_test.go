package main

import (
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

	"github.com/salesagg/salesagg/test/harness"
)

func TestDevScriptExitsZeroOnCtrlC(t *testing.T) {
	// Scenario: scripts/dev.sh with the README's overrides (BIN, BUILD=0, BROKER, HTTP, DATA) runs
	// the service on them, and Ctrl-C (SIGINT to the whole foreground process group) ends the
	// script with exit code 0. What `make run` logs and does on the way (the service stops
	// first, then the broker; the last cycle committed) is TestReadmeWalkthrough's, which runs it
	// as the README's walkthrough says.
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
	if got := len(processesWith(work)); got < 2 {
		t.Errorf("%d processes hold %s, want the broker and the service", got, work)
	}

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
	if left := processesWith(work); len(left) > 0 {
		t.Errorf("processes %v still hold %s after dev.sh exited", left, work)
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
