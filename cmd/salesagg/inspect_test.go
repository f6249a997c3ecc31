package main

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/salesagg/salesagg/internal/state"
)

// snapshotTree describes every file and directory under root: its mode,
// size, modification time and content hash. A Pebble store's LOCK file is
// described without its time: Pebble takes it even to read a store, which
// touches it; it stays empty.
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v %d", info.Mode(), info.Size())
		if d.Name() != "LOCK" {
			desc += fmt.Sprintf(" %d", info.ModTime().UnixNano())
		}
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		out[path] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestStateInspectChangesNothing(t *testing.T) {
	// Scenario: state inspect reads a stopped service's state dir and leaves every file as it was
	// (the lock file's holder line, the process metadata, the stores); a dir a service holds is
	// still refused, naming the holder.
	root := t.TempDir()
	stateDirWithTask(t, root, "sales-aggregator")
	before := snapshotTree(t, root)
	code, stdout, stderr := runBinary(t, nil, "state", "inspect", "--state.dir", root)
	if code != 0 || !strings.Contains(stdout, "0_0") {
		t.Fatalf("state inspect: exit %d\n%s%s", code, stdout, stderr)
	}
	after := snapshotTree(t, root)
	for path, was := range before {
		if now, ok := after[path]; !ok {
			t.Errorf("state inspect removed %s", path)
		} else if now != was {
			t.Errorf("state inspect changed %s: %s, was %s", path, now, was)
		}
	}
	for path := range after {
		if _, ok := before[path]; !ok {
			t.Errorf("state inspect wrote %s", path)
		}
	}

	held, err := state.OpenDir(root, "sales-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	code, _, stderr = runBinary(t, nil, "state", "inspect", "--state.dir", root)
	if code != exitError || !strings.Contains(stderr, "refusing while the service runs") || !strings.Contains(stderr, fmt.Sprintf("pid=%d", os.Getpid())) {
		t.Errorf("state inspect of a held dir: exit %d, want %d refusing and naming this process:\n%s", code, exitError, stderr)
	}
}

func TestStateInspectOfAKafkaStreamsDir(t *testing.T) {
	// Scenario: state inspect is pointed at the state dir of the Kafka Streams application salesagg
	// replaces (task dirs with rocksdb/ and .checkpoint). It says so and exits 1, instead of
	// "pebble: database does not exist" and exit 0, and writes nothing into it (no .lock, no
	// process-metadata).
	root := t.TempDir()
	app := filepath.Join(root, "sales-aggregator")
	if err := os.MkdirAll(filepath.Join(app, "0_0", "rocksdb", "PRODUCT_AGGREGATED_SALES"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "0_0", ".checkpoint"), []byte("0\n1\nsales-aggregator-PRODUCT_AGGREGATED_SALES-changelog 0 42\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runBinary(t, nil, "state", "inspect", "--state.dir", root)
	if code != exitError || !strings.Contains(stderr, "this looks like a Kafka Streams state dir (RocksDB") {
		t.Errorf("exit %d, want %d saying it is a Kafka Streams state dir:\n%s%s", code, exitError, stdout, stderr)
	}
	for _, name := range []string{".lock", "process-metadata"} {
		if _, err := os.Lstat(filepath.Join(app, name)); err == nil {
			t.Errorf("state inspect wrote %s into the Kafka Streams state dir", name)
		}
	}
}
