package stream

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestIdleFlushMoves walks the pause detector through its moves: off
// (zero, at or above the interval, exactly-once), armed by a batch at the
// partition's end, disarmed by one behind it or by the interval's flush,
// fired once per pause.
func TestIdleFlushMoves(t *testing.T) {
	at := func(last, hwm int64) batch {
		return batch{recs: []*kgo.Record{{Offset: last}}, hwm: hwm}
	}
	for _, off := range []*idleFlush{
		newIdleFlush(0, time.Second, true),
		newIdleFlush(time.Second, time.Second, true),
		newIdleFlush(time.Millisecond, time.Second, false),
	} {
		off.received(at(9, 10))
		if off.c() != nil {
			t.Fatalf("%+v: armed while off", off)
		}
		off.stop()
	}

	f := newIdleFlush(time.Millisecond, time.Hour, true)
	defer f.stop()
	if f.c() != nil {
		t.Fatal("armed before any batch")
	}
	f.received(at(5, 10)) // behind the end: more is on its way
	if f.c() != nil {
		t.Fatal("armed by a batch behind its partition's end")
	}
	f.received(batch{recs: []*kgo.Record{{Offset: 9}}, hwm: -1})
	if f.c() != nil {
		t.Fatal("armed by a batch with no known high watermark")
	}
	f.received(at(9, 10))
	select {
	case <-f.c():
		f.fired()
	case <-time.After(10 * time.Second):
		t.Fatal("a batch at its partition's end did not fire the pause")
	}
	if f.c() != nil {
		t.Fatal("still armed after its fire was taken")
	}
	f.received(at(19, 20))
	f.received(at(20, 30)) // the next batch lags: disarmed
	if f.c() != nil {
		t.Fatal("a lagging batch left the pause armed")
	}
	f.received(at(29, 30))
	f.fired() // the interval's flush came first
	if f.c() != nil {
		t.Fatal("the interval's flush left the pause armed")
	}
}

// TestInputEndsMoves walks the exactly-once pause's end detector: a
// partition polled behind its end keeps the input from being at its end
// until a poll reaches it; under read_committed the last stable offset is
// the end; a partition not polled for the forget interval is forgotten.
func TestInputEndsMoves(t *testing.T) {
	fetch := func(topic string, p int32, last, hwm, lso int64) kgo.Fetches {
		return kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: topic, Partitions: []kgo.FetchPartition{
			{Partition: p, HighWatermark: hwm, LastStableOffset: lso, Records: []*kgo.Record{{Topic: topic, Partition: p, Offset: last}}},
		}}}}}
	}
	t0 := time.Unix(1000, 0)
	e := newInputEnds(time.Second)
	if !e.atEnd(t0) {
		t.Fatal("nothing polled: the input should be at its end (nothing is behind)")
	}
	e.polled(fetch("in", 0, 9, 10, 10), t0)
	if !e.atEnd(t0) {
		t.Fatal("partition 0 polled up to its end: not at the end")
	}
	e.polled(fetch("in", 1, 4, 10, 10), t0.Add(100*time.Millisecond))
	if e.atEnd(t0.Add(200 * time.Millisecond)) {
		t.Fatal("partition 1 polled 5 records short of its end: at the end")
	}
	// An empty poll (the fetch fell behind) changes nothing.
	e.polled(kgo.Fetches{}, t0.Add(300*time.Millisecond))
	if e.atEnd(t0.Add(300 * time.Millisecond)) {
		t.Fatal("an empty poll took partition 1 to its end")
	}
	e.polled(fetch("in", 1, 9, 10, 10), t0.Add(400*time.Millisecond))
	if !e.atEnd(t0.Add(400 * time.Millisecond)) {
		t.Fatal("partition 1 reached its end: the input is still behind")
	}
	// read_committed: the records stop at the last stable offset (an open
	// transaction of the input's producer lies beyond it).
	e.polled(fetch("in", 2, 6, 20, 7), t0.Add(500*time.Millisecond))
	if !e.atEnd(t0.Add(500 * time.Millisecond)) {
		t.Fatal("partition 2 reached its last stable offset: not at the end")
	}
	e.polled(fetch("in", 2, 5, 20, 7), t0.Add(600*time.Millisecond))
	if e.atEnd(t0.Add(600 * time.Millisecond)) {
		t.Fatal("partition 2 polled short of its last stable offset: at the end")
	}
	// Not polled again within the forget interval, partition 2 is
	// forgotten (revoked, or the interval's cycle commits it).
	if !e.atEnd(t0.Add(1600 * time.Millisecond)) {
		t.Fatal("partition 2, not polled for the forget interval, still holds the input behind")
	}
	if len(e.parts) != 0 {
		t.Fatalf("after the forget interval %d partitions are kept, want none", len(e.parts))
	}
	// An unknown end is not an end.
	e.polled(fetch("in", 0, 9, -1, -1), t0.Add(2*time.Second))
	if e.atEnd(t0.Add(2 * time.Second)) {
		t.Fatal("a partition with no known end counts as at its end")
	}
}
