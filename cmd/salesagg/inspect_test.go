package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
