package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

func TestSIGKILLDuringABulkRestoreRestoresAgainExactly(t *testing.T) {
	// Scenario: the state dir is lost, and the full restore of a changelog of 30,000 products (a bulk
	// load, under a memory budget small enough to spill sorted runs) is SIGKILLed after its second run,
	// then with its tables written just before their ingestion. Each next start trusts nothing of the
	// cut load: it restores the whole changelog again, once, and serves exact totals; a start after a
	// finished load restores nothing.
	broker := kfakeCluster(t, 1)
	stateDir := t.TempDir()
	groupArgs := []string{"--group.instance.id", "bulk-crash-test", "--session.timeout.ms", "6000"}
	small := "SALESAGGTEST_RESTORE_MEMORY=" + fmt.Sprint(256<<10)

	events := make([]harness.Event, 40_000)
	for i := range events {
		events[i] = harness.Event{Product: fmt.Sprintf("sku-%05d", i%30_000), Value: int64(1 + i%97)}
	}
	want := harness.TotalsOf(events)
	harness.Produce(t, harness.NewClient(t, broker), harness.Records("sales-events-v1", events)...)
	p := startService(t, broker, stateDir, nil, groupArgs...)
	p.WaitReady(t, 60*time.Second)
	p.WaitTotals(t, want, 2*time.Minute)
	p.Terminate(t)
	_, records := changelogTotals(t, broker)
	if records < 30_000 {
		t.Fatalf("the changelog holds %d records, want at least 30000 (a bulk load)", records)
	}

	loseStateDir := func() {
		t.Helper()
		entries, err := os.ReadDir(stateDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(stateDir + "/" + e.Name()); err != nil {
				t.Fatal(err)
			}
		}
	}
	loseStateDir()
	for _, point := range []string{"bulk-spilled:2", "bulk-ingest"} {
		p := startService(t, broker, stateDir, []string{small, "SALESAGGTEST_CRASH_POINT=" + point}, groupArgs...)
		harness.WaitFor(t, 2*time.Minute, "crash point "+point+" to be reached", func() error {
			if p.Alive() {
				return errors.New("still running")
			}
			return nil
		})
		if !p.KilledBy(syscall.SIGKILL) {
			t.Fatalf("crash point %s: process ended with %s, not SIGKILL", point, p.DescribeExit())
		}
		if len(p.LogsWith("Bulk-loaded the restored store")) != 0 {
			t.Fatalf("crash point %s: the load finished before the crash", point)
		}

		p = startService(t, broker, stateDir, []string{small}, groupArgs...)
		p.WaitReady(t, 2*time.Minute)
		p.WaitTotals(t, want, time.Minute)
		if got := p.RestoredTasks(t, 1); got.Lines != 1 || got.Total != int64(records) {
			t.Fatalf("after crash point %s: restored %d records in %d restores, want the whole changelog (%d records) once", point, got.Total, got.Lines, records)
		}
		bulk := p.LogsWith("Bulk-loaded the restored store")
		if len(bulk) != 1 || strings.Contains(bulk[0].Msg(), " in 0 sorted runs") {
			t.Fatalf("after crash point %s: bulk load lines %v, want one that spilled sorted runs", point, bulk)
		}
		p.Terminate(t)

		p = startService(t, broker, stateDir, nil, groupArgs...)
		p.WaitReady(t, time.Minute)
		p.WaitTotals(t, want, time.Minute)
		if got := p.RestoredTasks(t, 1); got.Total != 0 {
			t.Fatalf("after crash point %s: a start after the finished load restored %d records, want 0", point, got.Total)
		}
		p.Terminate(t)
		loseStateDir()
	}
}
