package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
)

// storeWithData creates a store holding one product and closes it.
func storeWithData(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "0_0")
	s, err := Open(dir, zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]Update{{Product: "p", Entry: Entry{Total: 7}}}, Checkpoint{ChangelogOffset: 1, InputOffset: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Opened once more, the store flushes what its log holds: a later
	// open has nothing to flush in the background.
	if s, err = Open(dir, zap.NewNop(), OpenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestOpenOutOfFileDescriptorsIsNotCorrupt(t *testing.T) {
	// Scenario: the process runs out of file descriptors (RLIMIT_NOFILE) while it opens a healthy
	// store, at every point of Pebble's open in turn. Each failure is EMFILE and not corruption
	// (the store is not quarantined: the task retries), and once descriptors are free the store
	// opens with its data.
	dir := storeWithData(t)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	defer restore()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	// Pebble's open takes a descriptor for the directory, again for its
	// data directory, then the MANIFEST, then the OPTIONS file: with 0 to 3
	// to spare, one of these opens fails. (With more, the open gets far
	// enough to start a background flush, and one that fails is fatal.)
	for extra := 0; extra < 4; extra++ {
		low := lim
		low.Cur = uint64(len(fds) + extra)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, zap.NewNop(), OpenOptions{})
		restore()
		if err == nil {
			_ = s.Close()
			t.Fatalf("with %d descriptors to spare, Open succeeded: the scenario did not happen", extra)
		}
		if IsCorrupt(err) {
			t.Errorf("with %d descriptors to spare, Open reported corruption: %v", extra, err)
		}
		if !errors.Is(err, syscall.EMFILE) {
			t.Errorf("with %d descriptors to spare, Open failed but not with EMFILE: %v", extra, err)
		}
	}
	s, err := Open(dir, zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if e, ok, err := s.Get("p"); err != nil || !ok || e.Total != 7 {
		t.Fatalf("the store after the failed opens holds p = %v %v %v, want 7", e.Total, ok, err)
	}
}

func TestOpenOfADamagedStoreIsCorrupt(t *testing.T) {
	// Scenario: a store's files are damaged (garbage MANIFEST or OPTIONS, a table of the wrong
	// size or missing); Open reports corruption, so the task quarantines the store.
	damage := map[string]func(t *testing.T, dir string){
		"garbage MANIFEST": func(t *testing.T, dir string) { damageFiles(t, dir, "MANIFEST-", false) },
		"garbage OPTIONS":  func(t *testing.T, dir string) { damageFiles(t, dir, "OPTIONS-", false) },
		"garbage table":    func(t *testing.T, dir string) { damageFiles(t, dir, ".sst", false) },
		"missing table":    func(t *testing.T, dir string) { damageFiles(t, dir, ".sst", true) },
	}
	for name, damageIt := range damage {
		t.Run(name, func(t *testing.T) {
			dir := storeWithData(t)
			damageIt(t, dir)
			s, err := Open(dir, zap.NewNop(), OpenOptions{})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open of the damaged store succeeded")
			}
			if !IsCorrupt(err) {
				t.Fatalf("Open of the damaged store is not corruption: %v", err)
			}
		})
	}
}

func damageFiles(t *testing.T, dir, nameContains string, remove bool) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if !strings.Contains(e.Name(), nameContains) {
			continue
		}
		n++
		p := filepath.Join(dir, e.Name())
		if remove {
			err = os.Remove(p)
		} else {
			err = os.WriteFile(p, []byte(strings.Repeat("garbage!", 100)), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n == 0 {
		t.Fatalf("no file named *%s* in %s", nameContains, dir)
	}
}
