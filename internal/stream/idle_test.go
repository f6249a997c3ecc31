package stream_test

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/salesagg/salesagg/internal/config"
	th "github.com/salesagg/salesagg/test/harness"
)

// transactions reads salesagg_transactions_total{result} from the
// instance's metrics.
func transactions(t *testing.T, in *instance, result string) float64 {
	t.Helper()
	mfs, err := metricsOf(in.rt).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "salesagg_transactions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "result") == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestIdleExactlyOnceCommitsNothing(t *testing.T) {
	// Scenario: an exactly-once service with a 100 ms commit interval folds a few events and
	// commits them; then, with no input for 5 s (about 50 commit intervals), it commits no
	// transaction and aborts none: a cycle with nothing to write is not a transaction. The next
	// event is committed as usual.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.ProcessingGuarantee = config.ExactlyOnceV2
	in := h.start(h.cfg)
	in.waitReady()
	want := spread(h, "i", 5, 2)
	in.waitTotals(want)
	// The cycle that carried the events has ended once the count stops
	// moving for a few intervals.
	var settled float64
	th.WaitFor(t, 30*time.Second, "the events' transaction to be committed", th.Holds(func() bool {
		before := transactions(t, in, "committed")
		time.Sleep(300 * time.Millisecond)
		settled = transactions(t, in, "committed")
		return settled > 0 && settled == before
	}))
	aborted := transactions(t, in, "aborted")
	idleFor := 5 * time.Second
	deadline := time.Now().Add(idleFor)
	for time.Now().Before(deadline) {
		if got := transactions(t, in, "committed"); got != settled {
			t.Fatalf("an idle service committed %v transactions within %s", got-settled, idleFor)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := transactions(t, in, "aborted"); got != aborted {
		t.Fatalf("an idle service aborted %v transactions", got-aborted)
	}
	h.produce(event("i-next", "i-next", 7))
	want["i-next"] = 7
	in.waitTotals(want)
	th.WaitFor(t, 30*time.Second, "the next event's transaction", th.Holds(func() bool {
		return transactions(t, in, "committed") > settled
	}))
}

func TestInputPauseCommitsBeforeTheInterval(t *testing.T) {
	// Scenario: a commit interval of a minute, longer than the test waits for anything; events
	// arrive and stop. Each guarantee commits them within commit.idle.ms of the pause (a task
	// at-least-once, the poll loop's transaction exactly-once): the totals are answered over
	// HTTP and the changelog read with read_committed holds them, long before the interval ends.
	// A second burst is committed the same way.
	for _, guarantee := range []string{config.AtLeastOnce, config.ExactlyOnceV2} {
		t.Run(guarantee, func(t *testing.T) {
			h := newHarness(t)
			h.createInput(3)
			cfg := h.cfg
			cfg.ProcessingGuarantee = guarantee
			cfg.CommitInterval = time.Minute
			cfg.CommitIdle = 50 * time.Millisecond
			in := h.start(cfg)
			in.waitReady()
			for burst, prefix := range []string{"pa", "pb"} {
				want := spread(h, prefix, 4, 3)
				in.waitTotals(want) // 30 s at most, half the interval
				got, _, _ := h.changelog(cfg)
				for p, w := range want {
					if got[p] != w {
						t.Fatalf("burst %d: changelog (read_committed) %s=%d, want %d", burst, p, got[p], w)
					}
				}
			}
		})
	}
}
