package stream

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

const minMS = int64(time.Minute / time.Millisecond)

func TestWindowCyclesCloseExpireAndRollBack(t *testing.T) {
	// Scenario: one 1m window size (grace 30s, retention 3m) on a real store. Events fold into
	// their windows and a redelivery is recognised; a window closes at its end plus the grace;
	// a dropped cycle takes stream time back; cycles committed while the store cannot be
	// written are written together, less the windows a later one expired; the expiry tombstones
	// every window of the store past retention.
	st, err := state.Open(t.TempDir(), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := newWindowAgg(time.Minute, 30*time.Second, 3*time.Minute, "app-S-1m-changelog", "S-1m", [16]byte{1})
	w.restored(state.Checkpoint{InputOffset: -1, ChangelogTopicID: [16]byte{1}}, -1)
	in := [16]byte{9}
	fold := func(product string, value, ts, offset int64) foldResult {
		t.Helper()
		res, bad, err := w.fold(st, []byte(product), value, ts, source{topic: in, partition: 0, offset: offset, record: true})
		if err != nil || bad != nil {
			t.Fatalf("fold: %v %v", bad, err)
		}
		return res
	}
	var emitted []*kgo.Record
	cycle := func() {
		t.Helper()
		emitted = emitted[:0]
		maxOff := new(atomic.Int64)
		maxOff.Store(-1)
		if _, err := w.records(st, recordSpec{threshold: 1 << 40}, maxOff, func(r *kgo.Record, _ bool) { emitted = append(emitted, r) }); err != nil {
			t.Fatal(err)
		}
		maxOff.Store(int64(100 + len(w.pending)))
	}
	commit := func() {
		t.Helper()
		ww := w.write(st)
		if err := st.ApplyWindows([]state.WindowWrite{*ww}, false); err != nil {
			t.Fatal(err)
		}
		w.written(ww)
	}
	total := func(product string, start int64) int64 {
		t.Helper()
		e, _, err := st.Windows(time.Minute).Get(product, start)
		if err != nil {
			t.Fatal(err)
		}
		return e.Total
	}

	if fold("p", 5, 10_000, 0) != foldAdded || fold("p", 7, 50_000, 1) != foldAdded || fold("p", 1, 70_000, 2) != foldAdded {
		t.Fatal("events of open windows not added")
	}
	if fold("p", 7, 50_000, 1) != foldDup {
		t.Fatal("a redelivery in the cycle was added again")
	}
	cycle()
	commit()
	if total("p", 0) != 12 || total("p", minMS) != 1 {
		t.Fatalf("windows = %d, %d; want 12, 1", total("p", 0), total("p", minMS))
	}
	if fold("p", 7, 50_000, 1) != foldDup {
		t.Fatal("a redelivery of a committed event was added again")
	}
	// Stream time 70s: window 0 closes at 60s + 30s.
	if fold("p", 3, 20_000, 3) != foldAdded {
		t.Fatal("an event within the grace is late")
	}
	if fold("q", 1, 90_000, 4) != foldAdded || fold("p", 3, 20_000, 5) != foldLate {
		t.Fatal("an event past the grace is not late")
	}
	// The cycle is dropped (an aborted transaction): stream time goes back to 70s, so the event
	// at 20s folds again when read again.
	w.drop()
	if w.streamTime != 70_000 {
		t.Fatalf("stream time after a dropped cycle = %d, want 70000", w.streamTime)
	}
	if fold("p", 3, 20_000, 3) != foldAdded {
		t.Fatal("after the drop, an event within the grace is late")
	}
	cycle()
	commit()
	if total("p", 0) != 15 {
		t.Fatalf("window 0 = %d, want 15", total("p", 0))
	}

	// The store cannot be written: two cycles wait, the second expiring windows the first
	// changed (stream time 4m30s: retention 3m past starts 0 and 1m).
	fold("p", 2, 100_000, 6) // window 1m
	cycle()
	_ = w.write(st) // committed in Kafka, the store write fails
	fold("q", 4, 270_000, 7)
	cycle()
	var tombs []string
	for _, r := range emitted {
		if r.Value == nil {
			tombs = append(tombs, string(r.Key[:1]))
		}
	}
	if len(tombs) != 2 {
		t.Fatalf("expiry tombstones = %v, want p's windows 0 and 1m (the ones the store holds)", tombs)
	}
	ww := w.write(st)
	if ww.ExpireBefore != 2*minMS || len(ww.Updates) != 1 || ww.Updates[0].Product != "q" || ww.Checkpoint.ChangelogOffset != 102 {
		t.Fatalf("merged write = expire before %d, updates %+v, checkpoint %d; want 120000, q's only, 102", ww.ExpireBefore, ww.Updates, ww.Checkpoint.ChangelogOffset)
	}
	if err := st.ApplyWindows([]state.WindowWrite{*ww}, false); err != nil {
		t.Fatal(err)
	}
	w.written(ww)
	if starts, err := st.Windows(time.Minute).Starts(0, 10); err != nil || len(starts) != 1 || starts[0] != 4*minMS {
		t.Fatalf("windows left = %v, %v; want 4m only", starts, err)
	}
	if st, ok, err := st.Windows(time.Minute).StreamTime(); err != nil || !ok || st != 270_000 {
		t.Fatalf("stored stream time = %d, %v, %v", st, ok, err)
	}
}

func TestWindowsCountTowardTheChangedBound(t *testing.T) {
	// Scenario (at-least-once, maxDirty lowered to 50, commit interval of the default): one
	// product's 200 events, each in a 1m window of its own, come in one batch. The task then
	// keeps 1 product and 200 windows changed, past the bound: it flushes at the batch's end, so
	// the windows are in the store and none is left changed in memory. (Counting the totals'
	// products alone, it kept all 200 until the commit interval.)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	l.task.deps.env.knobs.maxDirty = 50
	cl, err := kgo.NewClient(l.seed...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := l.cfg.WindowChangelogTopic(time.Minute)
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	ids, err := adm.ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	id := [16]byte(ids[topic].ID)
	w := newWindowAgg(time.Minute, 0, 24*time.Hour, topic, "S-1m", id)
	w.restored(state.Checkpoint{InputOffset: -1, ChangelogTopicID: id}, -1)
	l.task.windows = append(l.task.windows, w)
	l.running()
	product := "product0"
	for i := 1; sales.Partition([]byte(product), 3) != 0; i++ {
		product = fmt.Sprintf("product%d", i)
	}
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var recs []*kgo.Record
	for i := range 200 {
		recs = append(recs, &kgo.Record{Topic: l.cfg.InputTopic, Partition: 0, Offset: int64(i), Key: []byte(product),
			Value: fmt.Appendf(nil, `{"product":%q,"value":1}`, product), Timestamp: base.Add(time.Duration(i) * time.Minute)})
	}
	if err := l.task.processBatch(ctx, batch{topic: l.cfg.InputTopic, recs: recs, hwm: 200}); err != nil {
		t.Fatal(err)
	}
	if n := len(w.dirty); n != 0 {
		t.Fatalf("the task keeps %d windows changed after a batch past maxDirty, want 0 (flushed)", n)
	}
	stored := 0
	if err := l.store.Windows(time.Minute).Each(func(state.WindowTotal) error { stored++; return nil }); err != nil {
		t.Fatal(err)
	}
	if stored != 200 {
		t.Fatalf("the store holds %d 1m windows after the early flush, want 200", stored)
	}
}
