package stream_test

import (
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest/observer"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

var summaryLine = regexp.MustCompile(`^Processed (\d+) total records, ran 0 punctuators, and committed (\d+) total tasks since the last update$`)

// summaries returns the summary lines logged so far and the records they add
// up to.
func (in *instance) summaries(t *testing.T) (lines []observer.LoggedEntry, records int64) {
	t.Helper()
	for _, e := range in.logs.FilterMessageSnippet("total records, ran").All() {
		m := summaryLine.FindStringSubmatch(e.Message)
		if m == nil || e.Level.String() != "info" {
			t.Fatalf("summary line %s %q does not read as Kafka Streams'", e.Level, e.Message)
		}
		f := e.ContextMap()
		n, _ := strconv.ParseInt(m[1], 10, 64)
		k, _ := strconv.ParseInt(m[2], 10, 64)
		if f["records"] != n || f["committed_tasks"] != k {
			t.Fatalf("summary %q has fields %v", e.Message, f)
		}
		if _, ok := f["rate"].(float64); !ok {
			t.Fatalf("summary %q has no rate: %v", e.Message, f)
		}
		if _, ok := f["lag"].(int64); !ok {
			t.Fatalf("summary %q has no lag: %v", e.Message, f)
		}
		lines = append(lines, e)
		records += n
	}
	return lines, records
}

func TestSummaryLogsProgressWhileCatchingUpAndNothingWhenIdle(t *testing.T) {
	// Scenario: an instance starts behind 30,000 events of one partition, with
	// log.summary.interval.ms=100 (default 120000, as Kafka Streams). While it catches up it logs,
	// at INFO, "Processed N total records, ran 0 punctuators, and committed K total tasks since
	// the last update" with the interval's rate and the current input lag (a line with lag > 0 is
	// seen while the poll loop is held after its first batch); the lines add up to the records
	// read. Once idle (nothing read, no lag) it logs no more lines, however many intervals pass.
	if d := config.Default().LogSummaryInterval; d != 2*time.Minute {
		t.Fatalf("log.summary.interval.ms defaults to %s, want 2m (Kafka Streams')", d)
	}
	eachGuarantee(t, func(t *testing.T, h *harness) {
		var keys []string
		for i := 0; len(keys) < 10; i++ {
			if k := fmt.Sprintf("k%d", i); sales.Partition([]byte(k), 3) == 0 {
				keys = append(keys, k)
			}
		}
		const events = 30_000
		recs := make([]*kgo.Record, 0, events)
		want := map[string]int64{}
		for i := range events {
			k := keys[i%len(keys)]
			recs = append(recs, event(k, k, 1))
			want[k]++
		}
		h.produce(recs...)

		cfg := h.cfg
		cfg.LogSummaryInterval = 100 * time.Millisecond
		lagSeen := make(chan struct{})
		var closeLag sync.Once
		var polls, idle atomic.Int64
		in := h.startWith(cfg, stream.Knobs{
			AfterPoll: func(n int) {
				// Hold the second poll with records: the first batch (at most
				// 10,000 records a poll) is folded, the rest is lag.
				if n > 0 && polls.Add(1) == 2 {
					select {
					case <-lagSeen:
					case <-time.After(30 * time.Second):
					}
				}
			},
			AfterSummary: func(logged bool) {
				if !logged {
					idle.Add(1)
				}
			},
		})
		t.Cleanup(func() { closeLag.Do(func() { close(lagSeen) }) })
		th.WaitFor(t, 30*time.Second, "a summary line with input lag", func() error {
			lines, _ := in.summaries(t)
			for _, l := range lines {
				f := l.ContextMap()
				if f["lag"].(int64) > 0 && f["records"].(int64) > 0 && f["rate"].(float64) > 0 {
					return nil
				}
			}
			return fmt.Errorf("summary lines: %v", lines)
		})
		closeLag.Do(func() { close(lagSeen) })
		in.waitTotals(want)
		th.WaitFor(t, 30*time.Second, "the summaries to add up to the events read", func() error {
			if lines, n := in.summaries(t); n != events {
				return fmt.Errorf("%d records in %d lines, want %d", n, len(lines), events)
			}
			return nil
		})
		lines, _ := in.summaries(t)
		last := lines[len(lines)-1].ContextMap()
		if last["lag"] != int64(0) {
			t.Fatalf("the last summary after catching up has lag %v: %v", last["lag"], last)
		}
		var committed int64
		for _, l := range lines {
			committed += l.ContextMap()["committed_tasks"].(int64)
		}
		if committed == 0 {
			t.Fatalf("no commit counted in %d summaries", len(lines))
		}
		from := idle.Load()
		th.WaitFor(t, 30*time.Second, "three idle intervals", th.Holds(func() bool { return idle.Load() >= from+3 }))
		if now, _ := in.summaries(t); len(now) != len(lines) {
			t.Fatalf("idle, it logged %d more summaries: %v", len(now)-len(lines), now[len(lines):])
		}
	})
}
