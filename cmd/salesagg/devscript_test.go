package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

func TestDevScriptExitsZeroOnCtrlC(t *testing.T) {
	// Scenario: scripts/dev.sh with the README's overrides (BIN, BUILD=0, BROKER_LISTEN, HTTP, DATA) runs
	// the service on them, and Ctrl-C (SIGINT to the whole foreground process group) ends the
	// script with exit code 0. What `make run` logs and does on the way (the service stops
	// first, then the broker; the last cycle committed) is TestReadmeWalkthrough's, which runs it
	// as the README's walkthrough says.
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	work := t.TempDir()
	brokerAddr, httpAddr := harness.FreeAddr(t), harness.FreeAddr(t)
	// A job, as a shell started from a terminal runs it: Ctrl-C is SIGINT to its group.
	p := harness.Start(t, harness.Spec{Name: "dev.sh", Path: filepath.Join("..", "..", "scripts", "dev.sh"), Job: true,
		Env: []string{"BIN=" + binary, "BUILD=0", "BROKER_LISTEN=" + brokerAddr, "HTTP=" + httpAddr, "DATA=" + work}})
	t.Cleanup(func() {
		// The script's children run in process groups of their own (job
		// control): kill them too if the script did not stop them.
		for _, pid := range processesWith(work) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	svc := harness.NewAPI(httpAddr)
	harness.WaitFor(t, 60*time.Second, "the service to be ready", func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		return svc.Ready()
	})
	if got := len(processesWith(work)); got < 2 {
		t.Errorf("%d processes hold %s, want the broker and the service", got, work)
	}

	// Ctrl-C.
	if err := p.SignalGroup(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !p.WaitExit(60 * time.Second) {
		t.Fatal("dev.sh did not exit within 60 s of SIGINT")
	}
	if p.ExitCode() != 0 {
		t.Errorf("dev.sh: %s after SIGINT, want exit code 0", p.DescribeExit())
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
