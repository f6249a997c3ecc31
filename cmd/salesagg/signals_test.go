package main

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSIGHUPStopsCleanly(t *testing.T) {
	// Scenario: the bare binary gets SIGHUP (its terminal closed, or a supervisor's reload key):
	// it stops as on SIGTERM, flushing, checkpointing and leaving the group, and exits 0.
	broker := kfakeCluster(t, 3)
	s := startService(t, broker, t.TempDir(), nil)
	s.WaitReady(t, 60*time.Second)
	if err := s.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !s.WaitExit(45 * time.Second) {
		t.Fatal("no exit within 45 s of SIGHUP")
	}
	if s.ExitCode() != 0 {
		t.Fatalf("exit after SIGHUP: %s, want 0", s.DescribeExit())
	}
	for _, want := range []string{"Shutdown requested", "Left the group", `"Stopped"`} {
		if !strings.Contains(s.Stderr(), want) {
			t.Errorf("standard error lacks %s:\n%s", want, s.Stderr())
		}
	}
}
