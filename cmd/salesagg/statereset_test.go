package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStateResetConfirmsAsResetDoes(t *testing.T) {
	// Scenario: state reset --task 0 on a stopped service's state dir. As reset does, it prints
	// what it would remove and, without a terminal, refuses without --yes (exit 2); --dry-run
	// changes nothing; --yes removes the store.
	root := t.TempDir()
	stateDirWithTask(t, root, "sales-aggregator")
	store := filepath.Join(root, "sales-aggregator", "0_0")
	args := []string{"state", "reset", "--state.dir", root, "--task", "0"}
	code, stdout, stderr := runBinary(t, nil, args...)
	if code != exitUsage || !strings.Contains(stderr, "refusing without --yes") || !strings.Contains(stdout, "0_0") {
		t.Errorf("without --yes nor a terminal: exit %d, want %d and the refusal:\n%s%s", code, exitUsage, stdout, stderr)
	}
	if _, err := os.Stat(store); err != nil {
		t.Fatalf("the store went without confirmation: %v", err)
	}
	code, stdout, stderr = runBinary(t, nil, append(args, "--dry-run")...)
	if code != 0 || !strings.Contains(stdout, "Dry run: nothing was changed.") {
		t.Errorf("--dry-run: exit %d:\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(store); err != nil {
		t.Fatalf("the store went in a dry run: %v", err)
	}
	code, stdout, stderr = runBinary(t, nil, append(args, "--yes")...)
	if code != 0 || !strings.Contains(stdout, "task 0_0: store removed") {
		t.Errorf("--yes: exit %d:\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(store); !os.IsNotExist(err) {
		t.Errorf("the store is still there after --yes: %v", err)
	}
}
