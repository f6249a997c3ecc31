//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// TestRestoreAfterCompaction: many updates of few keys into a pre-created compacted changelog (1 s segments) until the broker compacts it; a restart without the state dir restores fewer records than were written, with exact totals.
func TestRestoreAfterCompaction(t *testing.T) {
	rng, appID, input, notif := begin(t, "cmp", 4)
	changelog := harness.ChangelogTopic(appID)
	// The service accepts an existing changelog with as many partitions as
	// the input, whatever its other settings.
	str := func(s string) *string { return &s }
	createTopic(t, changelog, 3, map[string]*string{
		"cleanup.policy":            str("compact"),
		"segment.ms":                str("1000"),
		"min.cleanable.dirty.ratio": str("0.01"),
	})
	events := harness.GenEvents(rng, "cp", 10, 5000)

	stateDir := filepath.Join(t.TempDir(), "state")
	cfg := harness.ServiceConfig{AppID: appID, StateDir: stateDir, Input: input, Notif: notif, CommitMs: 100}
	svc := startService(t, cfg)
	svc.WaitRestored(t, 90*time.Second)

	// 5,000 events over 10 s: with a 100 ms commit interval each product
	// gets a changelog record about every cycle.
	cl := newClient(t)
	pp := harness.NewProducer(cl, input, events).Start(t, 50, 100*time.Millisecond)
	pp.Wait(t, 3*time.Minute)
	want := harness.TotalsOf(events)
	harness.WaitFor(t, time.Minute, "exact totals over HTTP", func() error { return svc.CheckTotals(want) })
	c, err := readTopic(changelog, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after %d events: the changelog has %d records written, %d readable", len(events), c.Written(), len(c.Records))

	// The cleaner only cleans closed segments, and a segment closes when a
	// record arrives after segment.ms: a trickle (one event per product a
	// second) keeps records coming until compaction shows.
	var trickle []harness.Event
	lastTrickle := time.Time{}
	harness.WaitFor(t, 90*time.Second, "the broker to compact the changelog", func() error {
		if time.Since(lastTrickle) >= time.Second {
			var recs []*kgo.Record
			for p := range 10 {
				e := harness.Event{Product: fmt.Sprintf("cp%03d", p), Value: 1}
				trickle = append(trickle, e)
				recs = append(recs, e.Record(input))
			}
			harness.Produce(t, cl, recs...)
			lastTrickle = time.Now()
		}
		c, err := readTopic(changelog, 30*time.Second)
		if err != nil {
			return err
		}
		if int64(len(c.Records)) >= c.Written() {
			return fmt.Errorf("%d records readable of %d written", len(c.Records), c.Written())
		}
		t.Logf("compacted: %d records readable of %d written (%d trickle events sent)", len(c.Records), c.Written(), len(trickle))
		return nil
	})
	want = harness.TotalsOf(events, trickle)
	harness.WaitFor(t, time.Minute, "exact totals over HTTP after the trickle", func() error { return svc.CheckTotals(want) })
	svc.Terminate(t)

	c, err = readTopic(changelog, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	written, readable := c.Written(), int64(len(c.Records))
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	svc = startService(t, cfg)
	sum := svc.WaitRestored(t, 90*time.Second)
	t.Logf("restart without state dir: %s; restored %d records %v; the changelog has %d written, %d readable", sum.TookLine, sum.Total, sum.Partitions, written, readable)
	if sum.Total >= written {
		t.Errorf("restored %d records, want fewer than the %d written (compacted away)", sum.Total, written)
	}
	if sum.Total > readable {
		t.Errorf("restored %d records, more than the %d readable in the changelog", sum.Total, readable)
	}
	if sum.Total < int64(len(want)) {
		t.Errorf("restored %d records, fewer than the %d products", sum.Total, len(want))
	}
	harness.WaitFor(t, time.Minute, "exact totals over HTTP after restoring the compacted changelog", func() error { return svc.CheckTotals(want) })
	if err := checkChangelog(changelog, want); err != nil {
		t.Error(err)
	}
	svc.Terminate(t)
}
