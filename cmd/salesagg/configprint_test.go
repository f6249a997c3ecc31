package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/salesagg/salesagg/internal/config"
)

func TestConfigPrintShowsDerivedValues(t *testing.T) {
	// Scenario: config print on a state dir a service has used. The keys whose value is derived
	// when not given (commit.interval.ms and transaction.timeout.ms from the guarantee,
	// memory.limit.bytes from cache.max.bytes, application.server from the host and http.addr,
	// group.instance.id from the state dir's process id) say "derived" and show the value the
	// service uses, not "default" beside an empty or unrelated value; config print writes nothing.
	stateDir := t.TempDir()
	app := filepath.Join(stateDir, "sales-aggregator")
	if err := os.Mkdir(app, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "process-metadata"), []byte(`{"processId":"1b2c3d"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runBinary(t, nil, "config", "print", "--state.dir", stateDir, "--http.addr", ":8123")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			lines[f[0]] = strings.Join(f[1:], " ")
		}
	}
	// 256 MiB + the 64 MiB entry cache; built without cgo, + the 128 MiB
	// block cache and 96 MiB of memtables as well.
	memoryLimit := int64(335544320)
	if config.StoreCachesInHeap {
		memoryLimit += 128<<20 + config.MemtablesInHeap
	}
	for key, want := range map[string]string{
		"commit.interval.ms":     "100 derived",
		"transaction.timeout.ms": "10000 derived",
		"memory.limit.bytes":     strconv.FormatInt(memoryLimit, 10) + " derived",
		"application.server":     host + ":8123 derived",
		"group.instance.id":      "sales-aggregator-1b2c3d derived",
		"input.topic":            "sales-events-v1 default",
	} {
		if got := lines[key]; got != want {
			t.Errorf("%s: %q, want %q", key, got, want)
		}
	}
	entries, err := os.ReadDir(app)
	if err != nil || len(entries) != 1 {
		t.Errorf("config print wrote into the state dir: %v %v", entries, err)
	}
}
