package stream_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestADroppedTasksRecordsInFlightNeverLandAfterTheNextOwnersWrites(t *testing.T) {
	// Scenario (at-least-once, which has no fencing): instance A runs every task, and is cut off
	// from the broker by a network partition just after a flush handed its changelog records to
	// the client, so they are in flight, held by the partition. A's lease lapses and it drops the
	// tasks; the group gives them to B, which folds the same events again from the committed
	// offsets and, with events that came since, higher totals. Then the partition heals. A's records of the old
	// flush must never land: had they, they would follow B's in the changelog with older
	// totals, a value going down, and the last value a store is rebuilt from would be wrong.
	// Read committed, every product's changelog values never go down and end at the truth.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.ProcessingGuarantee = config.AtLeastOnce
	h.cfg.SessionTimeout = 6 * time.Second // the broker's group.min.session.timeout.ms
	cfgA, cfgB := h.instanceCfg("a"), h.instanceCfg("b")
	cfgA.GroupInstanceID, cfgB.GroupInstanceID = "cutoff-a", "cutoff-b"

	// A reaches the broker only through the proxy; B directly.
	proxy, err := th.NewFaultProxy("127.0.0.1:0", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	var armed atomic.Bool
	cut := make(chan int, 1)
	a := h.startWith(cfgA, stream.Knobs{
		Dial: func(ctx context.Context, network, host string) (net.Conn, error) {
			if host == h.addr {
				host = proxy.Addr()
			}
			var d net.Dialer
			return d.DialContext(ctx, network, host)
		},
		FlushProduced: func(_ int32, records int) {
			if records > 0 && armed.CompareAndSwap(true, false) {
				proxy.Blackhole()
				cut <- records
			}
		},
	})
	a.waitReady()
	want := map[string]int64{}
	var events []*kgo.Record
	for i := range 30 {
		p := fmt.Sprintf("product%d", i)
		events = append(events, event(p, p, int64(10+i)))
		want[p] += int64(10 + i)
	}
	h.produce(events...)
	a.waitTotals(want)
	if got := a.runningTasks(); len(got) != 3 {
		t.Fatalf("A runs %v before the cut, want all three tasks", got)
	}

	// The next flush with records is cut off as it hands them to the client.
	armed.Store(true)
	events = events[:0]
	for i := range 30 {
		p := fmt.Sprintf("product%d", i)
		events = append(events, event(p, p, 1000))
		want[p] += 1000
	}
	h.produce(events...)
	var inFlight int
	select {
	case inFlight = <-cut:
	case <-time.After(30 * time.Second):
		t.Fatal("A flushed no records within 30 s of the events")
	}
	cutAt := time.Now()
	th.WaitFor(t, 10*time.Second, "the partition to hold what A sent after the cut", th.Holds(func() bool {
		up, _ := proxy.Held()
		return up > 0
	}))

	// More events for the same products while A is cut off: B folds them too, so its totals
	// are above those of A's held flush.
	events = events[:0]
	for i := range 30 {
		p := fmt.Sprintf("product%d", i)
		events = append(events, event(p, p, 5))
		want[p] += 5
	}
	h.produce(events...)
	b := h.start(cfgB)
	th.WaitFor(t, 60*time.Second, "B to run all three tasks", th.Holds(func() bool { return len(b.runningTasks()) == 3 }))
	b.waitTotals(want) // B's changelog records of these totals are acknowledged
	if _, ok := logTime(a.logs, "No heartbeat answered by the group coordinator"); !ok {
		t.Fatal("A did not log that it dropped its tasks for want of a heartbeat answer")
	}
	if _, ok := logTime(a.logs, "Cut the dropped tasks off"); !ok {
		t.Fatal("A did not log that it cut the dropped tasks off")
	}
	t.Logf("A cut off with %d records in flight; B ran every task %s later", inFlight, time.Since(cutAt).Round(time.Millisecond))

	// The partition heals: whatever it held is delivered now, and A rejoins.
	proxy.Pass()
	th.WaitFor(t, 10*time.Second, "the partition to deliver what it held", th.Holds(func() bool {
		up, down := proxy.Held()
		return up == 0 && down == 0
	}))
	waitSpread(t, a, b)

	// Events for other products after the heal: A produces again after its cut.
	after := map[string]int64{}
	events = events[:0]
	for i := range 30 {
		p := fmt.Sprintf("later%d", i)
		events = append(events, event(p, p, 7))
		after[p] = 7
		want[p] = 7
	}
	h.produce(events...)
	a.waitTotals(after)
	b.waitTotals(after)

	var mu sync.Mutex
	last := map[string]int64{}
	var decreases []string
	h.readCommitted(cfgA.ChangelogTopic(), func(r *kgo.Record) {
		v, err := sales.DecodeTotal(r.Value)
		if err != nil {
			t.Fatalf("changelog value: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		k := string(r.Key)
		if prev, ok := last[k]; ok && v < prev {
			decreases = append(decreases, fmt.Sprintf("%s from %d down to %d at %d@%d", k, prev, v, r.Partition, r.Offset))
		}
		last[k] = v
	})
	if len(decreases) > 0 {
		t.Errorf("%d changelog values went down (a dropped task's records landed after its next owner's): %s",
			len(decreases), strings.Join(decreases[:min(5, len(decreases))], "; "))
	}
	equalTotals(t, "changelog", last, want)
}
