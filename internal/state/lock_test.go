package state

import (
	"errors"
	"testing"

	"go.uber.org/zap"
)

func TestOpenOfAStoreOpenHereIsLockedNotCorrupt(t *testing.T) {
	// Scenario: a store is open in this process (a standby copy still closing it) when its task
	// opens it too: that open fails with ErrStoreLocked, never as corruption (which makes the
	// owner quarantine a live store), read-only or not; once the first holder closed it, the
	// store opens again.
	path := t.TempDir() + "/0_0"
	first, err := Open(path, zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Apply([]Update{{Product: "p", Entry: Entry{Total: 7}}}, Checkpoint{ChangelogOffset: 1, InputOffset: -1}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []OpenOptions{{}, {ReadOnly: true}} {
		second, err := Open(path, zap.NewNop(), o)
		if err == nil {
			_ = second.Close()
			t.Fatalf("read-only %v: a second open of an open store succeeded", o.ReadOnly)
		}
		if IsCorrupt(err) {
			t.Fatalf("read-only %v: a second open is reported as corruption: %v", o.ReadOnly, err)
		}
		if !errors.Is(err, ErrStoreLocked) {
			t.Fatalf("read-only %v: a second open: %v, want ErrStoreLocked", o.ReadOnly, err)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(path, zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatalf("open after the holder closed: %v", err)
	}
	defer again.Close()
	if e, ok, err := again.Get("p"); err != nil || !ok || e.Total != 7 {
		t.Fatalf("after reopening: %+v %v %v", e, ok, err)
	}
}
