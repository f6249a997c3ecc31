//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestRestoreAfterCompaction: many updates of few keys into a pre-created compacted changelog (1 s segments) until the broker compacts it; a restart without the state dir restores fewer records than were written, with exact totals.
func TestRestoreAfterCompaction(t *testing.T) {
	rng, appID, input, notif := begin(t, "cmp", 4)
	changelog := sales.ChangelogTopic(appID, sales.StoreName)
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

// TestMegabyteEventsAreDeadLettered: on Apache Kafka, under each guarantee, with a dead-letter
// topic: among ordinary events come one with a 1,000,000-byte value and one with a
// 1,000,000-byte key. The service stays up, every other total is exact, and both reach the
// dead-letter topic cut to dlq.max.record.bytes and marked so (before, the copy exceeded the
// producer's batch limit: under exactly-once it was committed past and lost, under
// at-least-once every instance taking the partition exited).
func TestMegabyteEventsAreDeadLettered(t *testing.T) {
	harness.EachGuarantee(t, func(t *testing.T, g string) {
		rng, appID, input, notif := begin(t, "mb-"+slug(g), 0x6d6567)
		dlq := appID + "-dead-letters"
		events := harness.GenEvents(rng, "mb", 20, 400)
		want := harness.TotalsOf(events)
		svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(t.TempDir(), "state"), Input: input, Notif: notif,
			Flags: []string{"--processing.guarantee", g, "--dlq.topic", dlq}})
		svc.WaitRestored(t, 90*time.Second)

		huge := strings.Repeat("m", 1_000_000)
		cl := newClient(t, kgo.ProducerBatchMaxBytes(1_040_000))
		var recs []*kgo.Record
		for i, e := range events {
			recs = append(recs, e.Record(input))
			if i == len(events)/2 {
				recs = append(recs,
					&kgo.Record{Topic: input, Key: []byte("mb-big"), Value: []byte(`{"product":"mb-big","value":1,"pad":"` + huge[:1_000_000-48] + `"}`)},
					&kgo.Record{Topic: input, Key: []byte(huge), Value: []byte(`{"value":1}`)})
			}
		}
		for _, r := range recs {
			if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
				t.Fatalf("producing a %d-byte record: %v", len(r.Key)+len(r.Value), err)
			}
		}
		harness.WaitFor(t, 2*time.Minute, "exact totals over HTTP", func() error {
			if !svc.Alive() {
				t.Fatalf("the service exited: %s", svc.DescribeExit())
			}
			return svc.CheckTotals(want)
		})
		harness.WaitFor(t, time.Minute, "both megabyte events in the dead-letter topic, cut and marked", func() error {
			c, err := readTopic(dlq, 30*time.Second)
			if err != nil {
				return err
			}
			if len(c.Records) != 2 {
				return fmt.Errorf("%d dead letters", len(c.Records))
			}
			for _, r := range c.Records {
				hd := map[string]string{}
				size := len(r.Key) + len(r.Value)
				for _, h := range r.Headers {
					hd[h.Key] = string(h.Value)
					size += len(h.Key) + len(h.Value)
				}
				if hd["salesagg.dlq.reason"] != "too_large" || hd["salesagg.dlq.truncated"] != "true" || size > 262144 {
					return fmt.Errorf("dead letter of %d bytes with headers %v", size, hd)
				}
			}
			return nil
		})
		if err := svc.Ready(); err != nil {
			t.Fatalf("not ready after the megabyte events: %v", err)
		}
		svc.Terminate(t)
	})
}
