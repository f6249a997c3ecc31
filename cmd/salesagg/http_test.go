package main

import (
	"testing"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
)

func TestRegistryHoldsTheRuntimeGoAndProcessMetrics(t *testing.T) {
	// Scenario: the registry the service serves at /metrics gathers the runtime's families
	// with the Go runtime's and the process's, as the Grafana dashboard expects.
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	reg, err := newRegistry(stream.New(cfg, zap.NewNop(), dir, stream.Knobs{}))
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, want := range []string{"salesagg_ready", "go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "process_cpu_seconds_total"} {
		if !have[want] {
			t.Errorf("no %s among %v", want, have)
		}
	}
}
