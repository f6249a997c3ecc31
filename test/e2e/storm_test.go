//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// TestJoinStormInsideOneTransaction: on Apache Kafka, exactly-once with a 10 s commit
// interval, A runs the three tasks while events flow; three times, B joins and C joins the
// moment B runs a task, then both stop: several revokes of A's tasks land inside one of A's
// transactions (franz-go's transact session passes on only the first). No two instances ever
// run one task, every total is exact, and the changelog holds the same totals.
func TestJoinStormInsideOneTransaction(t *testing.T) {
	rng, appID, input, notif := begin(t, "storm", 0x73746f72)
	events := harness.GenEvents(rng, "st", 30, 4000)
	want := harness.TotalsOf(events)

	work := t.TempDir()
	cfg := func(dir string) harness.ServiceConfig {
		return harness.ServiceConfig{AppID: appID, StateDir: dir, Input: input, Notif: notif, CommitMs: 10000,
			Flags: []string{"--processing.guarantee", "exactly_once_v2"}}
	}
	fl := harness.NewFleet(func(dir string) *harness.Service { return startService(t, cfg(dir)) })
	start := func(name, dir string) *harness.Member {
		t.Helper()
		return fl.Start(name, filepath.Join(work, dir))
	}
	gone := func(m *harness.Member) {
		t.Helper()
		m.Terminate(t)
		fl.Forget(m)
	}

	a := start("A", "a")
	a.WaitRestored(t, 90*time.Second)
	sampler := fl.Sample(t)
	pp := harness.NewProducer(newClient(t, kgo.RecordPartitioner(harness.HeaderPartitioner{})), input, events).Start(t, 20, 100*time.Millisecond)
	runsOne := func(m *harness.Member) func() error {
		return func() error {
			if len(m.Running()) == 0 {
				return fmt.Errorf("%s runs no task", m.Name)
			}
			return nil
		}
	}
	for round := range 3 {
		b := start(fmt.Sprintf("B%d", round), "b")
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("round %d: B running a task", round), runsOne(b))
		c := start(fmt.Sprintf("C%d", round), "c")
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("round %d: C running a task", round), runsOne(c))
		t.Logf("round %d: B and C joined (producer at %d/%d)", round, pp.Sent(), len(events))
		gone(c)
		gone(b)
	}
	pp.Wait(t, 5*time.Minute)
	harness.Expect(t, 90*time.Second, "A to run every task and answer every exact total", func() error {
		if r := a.Running(); len(r) != harness.ScalePartitions {
			return fmt.Errorf("A runs %v", r)
		}
		return a.CheckTotals(want)
	})
	harness.Expect(t, 30*time.Second, "the changelog's latest committed totals to be exact", func() error {
		return checkChangelog(harness.ChangelogTopic(appID), want)
	})
	harness.ReportOwnership(t, sampler)
	if lines := strings.Count(strings.Join(a.StderrLines(), "\n"), "Stopping tasks the latest assignment does not leave running here"); lines > 0 {
		t.Logf("A stopped tasks whose revoke it was not told of %d times", lines)
	}
	a.Terminate(t)
}
