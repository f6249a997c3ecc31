package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/test/harness"
)

func TestStateVerifyAndReset(t *testing.T) {
	// Scenario: after a run of the sample events, `state verify` finds every task's store equal to
	// its changelog (exit 0). A store tampered with (a wrong total, a lost product, a product the
	// changelog never had) is reported key by key (exit 1). `state reset --task` refuses while the
	// service runs, then wipes that task's store; the next start restores that task only, from the
	// changelog, and verify is clean again with the same totals.
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	stateDir := filepath.Join(work, "state")
	svc := startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	produceSample(t, brokerAddr)
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)

	// While the service runs, both refuse: the state dir is locked.
	for _, args := range [][]string{
		{"state", "verify", "--state.dir", stateDir, "--bootstrap.servers", brokerAddr},
		{"state", "reset", "--state.dir", stateDir, "--task", "0_1"},
	} {
		code, _, stderr := runBinary(t, nil, args...)
		if code != exitError || !strings.Contains(stderr, "refusing while the service runs") || !strings.Contains(stderr, "is held by pid=") {
			t.Fatalf("%v while the service runs: exit %d, %s", args, code, stderr)
		}
	}
	svc.Terminate(t)

	verify := func() (int, string) {
		code, stdout, stderr := runBinary(t, nil, "state", "verify", "--state.dir", stateDir, "--bootstrap.servers", brokerAddr)
		return code, stdout + stderr
	}
	if code, out := verify(); code != 0 || !strings.Contains(out, "all 3 tasks match their changelog") || strings.Count(out, "  OK: ") != 3 {
		t.Fatalf("verify after a clean stop: exit %d\n%s", code, out)
	}

	// Tamper with task 0_0's store, keeping its checkpoint.
	dir, err := state.OpenDir(stateDir, "sales-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	s, err := state.Open(dir.TaskPath(0), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	totals, err := s.Scan("", 100)
	if err != nil || len(totals) < 2 {
		t.Fatalf("task 0_0 holds %v, %v", totals, err)
	}
	cp, _, err := s.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	wrong, lost := totals[0], totals[1]
	if err := s.Apply([]state.Update{
		{Product: wrong.Product, Entry: state.Entry{Total: wrong.Total + 1}},
		{Product: lost.Product, Delete: true},
		{Product: "product-never-sold", Entry: state.Entry{Total: 5}},
	}, cp); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	_ = dir.Close()
	code, out := verify()
	if code != exitError {
		t.Fatalf("verify of a tampered store: exit %d, want 1\n%s", code, out)
	}
	for _, want := range []string{
		"1 of 3 tasks differ from the changelog",
		`DIFFERS "` + wrong.Product + `": store `,
		`DIFFERS "` + lost.Product + `": not in the store, changelog `,
		`DIFFERS "product-never-sold": store 5, changelog no record below the checkpoint`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "DIFFERS") != 3 || strings.Count(out, "  OK: ") != 2 {
		t.Errorf("want 3 differences in one task, 2 tasks OK:\n%s", out)
	}

	// Reset the tampered task: only its store goes.
	code, stdout, stderr := runBinary(t, nil, "state", "reset", "--state.dir", stateDir, "--task", "0_0")
	if code != 0 || !strings.Contains(stdout, "task 0_0: store removed") {
		t.Fatalf("reset: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "sales-aggregator", "0_0")); !os.IsNotExist(err) {
		t.Fatalf("task 0_0's store is still there: %v", err)
	}
	for _, task := range []string{"0_1", "0_2"} {
		if _, err := os.Stat(filepath.Join(stateDir, "sales-aggregator", task)); err != nil {
			t.Fatalf("task %s's store is gone: %v", task, err)
		}
	}
	if code, _, stderr := runBinary(t, nil, "state", "reset", "--state.dir", stateDir, "--task", "0_7"); code != exitError || !strings.Contains(stderr, "no task 0_7") {
		t.Fatalf("reset of a task that is not there: exit %d %s", code, stderr)
	}

	svc = startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	if lines := svc.LogsWith("did not find checkpoint offset"); len(lines) != 1 || lines[0]["task"] != "0_0" {
		t.Fatalf("after the reset, want task 0_0 alone restored from the start: %v", lines)
	}
	svc.Terminate(t)
	if code, out := verify(); code != 0 {
		t.Fatalf("verify after the reset and a restore: exit %d\n%s", code, out)
	}
}
