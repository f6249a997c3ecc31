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
