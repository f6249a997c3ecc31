package stream_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/salesagg/salesagg/internal/state"
)

func TestCorruptedStoreIsQuarantinedAndRebuilt(t *testing.T) {
	// Scenario: a task's store is damaged while the service is stopped (garbage in its table files,
	// in its MANIFEST, its version markers gone, or the directory replaced by a file); the next start
	// moves it aside with a warning naming where, restores the task from the changelog, and serves
	// exact totals, without crashing.
	damage := map[string]func(t *testing.T, dir string){
		"garbage in table files": func(t *testing.T, dir string) { overwrite(t, dir, ".sst") },
		"garbage MANIFEST":       func(t *testing.T, dir string) { overwrite(t, dir, "MANIFEST-") },
		"version markers gone": func(t *testing.T, dir string) {
			ms, _ := filepath.Glob(filepath.Join(dir, "marker.*"))
			for _, m := range ms {
				_ = os.Remove(m)
			}
		},
		"directory replaced by a file": func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir, []byte("not a store"), 0o644); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, damageIt := range damage {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.seedAndStop(t)
			for p := int32(0); p < 3; p++ {
				damageIt(t, filepath.Join(h.stateDir, h.cfg.ApplicationID, state.TaskName(p)))
			}
			in := h.start(h.cfg)
			in.waitReady()
			in.waitTotals(sampleTotals)
			restored, _ := in.restored()
			_, records, _ := h.changelog(h.cfg)
			quarantined := in.logs.FilterMessageSnippet("Store is corrupted; moved it to").Len()
			switch {
			case quarantined == 3:
				q, _ := os.ReadDir(filepath.Join(h.stateDir, h.cfg.ApplicationID, "quarantine"))
				if len(q) != 3 {
					t.Fatalf("%d quarantined stores on disk, want 3", len(q))
				}
			case name == "version markers gone" && quarantined == 0:
				// Pebble reads a store without markers as a new, empty one:
				// no checkpoint, so a full restore, which is as safe.
				if in.logs.FilterMessageSnippet("did not find checkpoint offset").Len() != 3 {
					t.Fatal("store without markers neither quarantined nor restored from the start")
				}
			default:
				t.Fatalf("%d stores quarantined, want 3; logs: %v", quarantined, messages(in))
			}
			if restored != int64(records) {
				t.Fatalf("restored %d records, want the whole changelog (%d)", restored, records)
			}
		})
	}
}

func overwrite(t *testing.T, dir, nameContains string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if strings.Contains(e.Name(), nameContains) {
			path := filepath.Join(dir, e.Name())
			fi, _ := os.Stat(path)
			size := max(int(fi.Size()), 64)
			junk := []byte(strings.Repeat("garbage!", size/8+1))
			if err := os.WriteFile(path, junk[:size], 0o644); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no %q file in %s", nameContains, dir)
	}
}

func messages(in *instance) []string {
	var out []string
	for _, e := range in.logs.All() {
		out = append(out, e.Message)
	}
	return out
}
