package stream_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	th "github.com/salesagg/salesagg/test/harness"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkProcess measures events/s through the whole runtime (fetch, fold,
// changelog, Pebble, commit) and the full restore of the changelog it wrote,
// on the in-process broker. Each iteration is one run over 100,000 events
// over 10,000 products.
func BenchmarkProcess(b *testing.B) { benchProcess(b, nil, time.Time{}) }

// benchProcess is one run of BenchmarkProcess per iteration, with the
// window sizes given; events are stamped base + their share of 48 hours
// unless base is zero.
func benchProcess(b *testing.B, sizes []string, base time.Time) {
	const events, products = 100_000, 10_000
	for b.Loop() {
		b.StopTimer()
		h := newHarness(b)
		h.cfg.Windows.Sizes = sizes
		h.cfg.Windows.Grace = 48 * time.Hour // nothing late: the spread is by event, not by partition
		h.createInput(3)
		var recs []*kgo.Record
		for i := range events {
			p := fmt.Sprintf("product%d", i%products)
			r := &kgo.Record{Topic: h.cfg.InputTopic, Key: []byte(p), Value: []byte(fmt.Sprintf(`{"product":%q,"value":%d}`, p, i%100))}
			if !base.IsZero() {
				r.Timestamp = base.Add(time.Duration(i) * 48 * time.Hour / events)
			}
			recs = append(recs, r)
		}
		h.produce(recs...)
		adm := kadm.NewClient(h.client())
		b.StartTimer()

		start := time.Now()
		in := h.start(h.cfg)
		in.waitReady()
		th.WaitFor(b, 5*time.Minute, "the group to commit every input offset", th.Holds(func() bool {
			offs, err := adm.FetchOffsets(context.Background(), h.cfg.ApplicationID)
			if err != nil {
				return false
			}
			var done int64
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Topic == h.cfg.InputTopic {
					done += o.At
				}
			})
			return done == events
		}))
		process := time.Since(start)
		_ = in.stop()

		if err := os.RemoveAll(filepath.Join(h.stateDir, h.cfg.ApplicationID)); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		in = h.start(h.cfg)
		restored := in.waitRestored(3 * (1 + len(sizes)))
		restore := time.Since(start)
		_ = in.stop()

		b.ReportMetric(float64(events)/process.Seconds(), "events/s")
		b.ReportMetric(float64(restored)/restore.Seconds(), "restored-records/s")
		if len(sizes) > 0 {
			b.ReportMetric(restore.Seconds(), "restore-s")
		}
	}
}

// BenchmarkProcessWindows is BenchmarkProcess with no window size, one
// (1h) and two (1h, 24h), side by side over the same events, whose record
// timestamps spread over two days (48 hourly windows, 2 daily ones): the
// cost of windows per event, and of their restore. restored-records/s
// counts every store's records.
func BenchmarkProcessWindows(b *testing.B) {
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, sizes := range [][]string{nil, {"1h"}, {"1h", "24h"}} {
		b.Run(fmt.Sprintf("sizes=%d", len(sizes)), func(b *testing.B) { benchProcess(b, sizes, base) })
	}
}
