package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// windowAgg is one window size of a task: each product's total per
// tumbling window of the size, by event time, in the task's store beside
// the totals (state.Windows) with a changelog of its own. The task
// goroutine owns it; the atomics are read by status queries.
//
// Stream time is the latest event time folded. A window closes once stream
// time reaches its end plus the grace: later events of it are late, left
// out of it (they still count in the product's total). A window is deleted
// once stream time is its retention past its start, from the store and,
// with a tombstone, from the changelog.
type windowAgg struct {
	size                      time.Duration
	sizeMS, graceMS, retainMS int64
	changelog                 string
	topicID                   [16]byte
	storeName                 string
	// dirty are the windows changed in the current cycle.
	dirty map[windowKey]*state.Entry
	// streamTime is the stream time with the cycle's events (-1: none
	// yet), committed the stream time the store holds: a dropped cycle
	// goes back to it.
	streamTime, committed int64
	// expired: every window starting before it is gone from the store.
	expired int64
	// final: windowed notifications are written once, when a window
	// closes (windows.notify final); closedFrom is the first start whose
	// window was open at the stream time before the cycle: every window
	// before it had its final notification written.
	final      bool
	closedFrom int64
	// cp is the checkpoint of the size's changelog the store holds.
	cp state.Checkpoint
	// current is the cycle in progress, produced to the changelog and not
	// yet committed there (nil: none); pending are the cycles committed
	// and not yet written to the store, oldest first (more than one when
	// the store could not take a write and exactly-once cycles went on).
	current *windowPending
	pending []*windowPending
	// late counts the events left out of a closed window, badTime those
	// whose time field could not be read.
	late, badTime atomic.Int64
	// shownTime and shownCheckpoint are the committed stream time and
	// checkpoint offset, for the status.
	shownTime, shownCheckpoint atomic.Int64
	// v is the size's key space of store vOf (see view).
	v   *state.Windows
	vOf *state.Store
}

// maybeStored reports whether the store may hold a window starting at
// start, so that a fold must read it. Every window the store holds was
// folded at a stream time at or past its start, so none starts after the
// stream time the store holds (committed), when that is known and no cycle
// waits to be written to the store: then a window starting later is new,
// as the windows of events replayed in time order mostly are.
func (w *windowAgg) maybeStored(start int64) bool {
	return w.committed < 0 || w.current != nil || len(w.pending) > 0 || start <= w.committed
}

// windowKey names one window of one product.
type windowKey struct {
	product string
	start   int64
}

// windowPending is what a cycle produced for one window size: the store
// write that follows once the cycle commits.
type windowPending struct {
	updates      []state.WindowUpdate
	expireBefore int64
	streamTime   int64
	maxOffset    *atomic.Int64
}

func newWindowAgg(size, grace, retention time.Duration, changelog, storeName string, topicID [16]byte) *windowAgg {
	w := &windowAgg{
		size: size, sizeMS: size.Milliseconds(), graceMS: grace.Milliseconds(), retainMS: retention.Milliseconds(),
		changelog: changelog, storeName: storeName, topicID: topicID,
		dirty: map[windowKey]*state.Entry{}, streamTime: -1, committed: -1,
	}
	w.shownTime.Store(-1)
	w.shownCheckpoint.Store(-1)
	return w
}

// status is the size's line of the task's status.
func (w *windowAgg) status() status.Window {
	return status.Window{Size: sales.FormatWindowSize(w.size), StreamTime: w.shownTime.Load(), Checkpoint: w.shownCheckpoint.Load(),
		Late: w.late.Load(), BadTime: w.badTime.Load()}
}

// view returns the size's key space in st, made once per store.
func (w *windowAgg) view(st *state.Store) *state.Windows {
	if w.vOf != st {
		w.v, w.vOf = st.Windows(w.size), st
	}
	return w.v
}

// expireBefore returns the first window start still kept at stream time
// st: a window is deleted once st - start reaches the retention.
func (w *windowAgg) expireBefore(st int64) int64 {
	x := st - w.retainMS
	if st < 0 || x < 0 {
		return 0
	}
	return sales.WindowStart(x, w.sizeMS) + w.sizeMS
}

// closedBefore returns the first window start still open at stream time
// st: every window starting before it is closed.
func (w *windowAgg) closedBefore(st int64) int64 {
	x := st - w.sizeMS - w.graceMS
	if st < 0 || x < 0 {
		return 0
	}
	return sales.WindowStart(x, w.sizeMS) + w.sizeMS
}

// closed reports whether the window starting at start takes no more
// events at stream time st.
func (w *windowAgg) closed(start, st int64) bool {
	return st >= 0 && start+w.sizeMS+w.graceMS <= st
}

// foldResult is what folding an event into a window did.
type foldResult int

const (
	foldAdded foldResult = iota
	// foldDup: the window reflects the event already.
	foldDup
	// foldLate: the window is closed; the event is left out of it.
	foldLate
)

// fold adds value, of an event at time ts, to product key's window of ts,
// unless the window reflects src already or is closed. bad is an overflow
// of the window's total (the event is left out of it).
func (w *windowAgg) fold(st *state.Store, key []byte, value, ts int64, src source) (res foldResult, bad, err error) {
	w.streamTime = max(w.streamTime, ts)
	start := sales.WindowStart(ts, w.sizeMS)
	k := windowKey{product: string(key), start: start}
	e, owned := w.dirty[k]
	if !owned {
		var committed state.Entry
		if start >= w.expired && w.maybeStored(start) {
			if committed, _, err = w.view(st).Get(k.product, start); err != nil {
				return 0, nil, err
			}
		}
		if committed.Offsets.Reflects(src.topic, src.partition, src.offset) {
			return foldDup, nil, nil
		}
		if w.closed(start, w.streamTime) {
			return foldLate, nil, nil
		}
		e = &state.Entry{Total: committed.Total, Offsets: committed.Offsets.Clone()}
	} else if e.Offsets.Reflects(src.topic, src.partition, src.offset) {
		return foldDup, nil, nil
	} else if w.closed(start, w.streamTime) {
		return foldLate, nil, nil
	}
	total, bad := sales.Add(e.Total, value)
	if bad != nil {
		return 0, bad, nil
	}
	e.Total = total
	if src.record {
		e.Offsets.Set(src.topic, src.partition, src.offset)
	}
	w.dirty[k] = e
	return foldAdded, nil, nil
}

// records builds the cycle's records of the changed windows and hands each
// to emit (changelog true for a changelog record): per window its changelog
// record (WindowKeySchema key, the total, the offsets header, the stream
// time within the window as its timestamp) and, at or above the threshold,
// a windowed notification; and a tombstone for each window the stream time
// expired (read from st). It keeps the store write for once the cycle
// commits (pending) and returns how many records it built.
func (w *windowAgg) records(st *state.Store, spec recordSpec, maxOffset *atomic.Int64, emit func(rec *kgo.Record, changelog bool)) (int, error) {
	p := &windowPending{expireBefore: w.expireBefore(w.streamTime), streamTime: w.streamTime, maxOffset: maxOffset}
	n := 0
	if p.expireBefore > w.expired {
		// Every window of the store now past its retention: tombstoned.
		err := w.view(st).EachBetween(w.expired, p.expireBefore, func(wt state.WindowTotal) error {
			emit(w.tombstone(spec, wt.Product, wt.Start), true)
			n++
			return nil
		})
		if err != nil {
			return 0, err
		}
	} else {
		p.expireBefore = 0
	}
	size := sales.FormatWindowSize(w.size)
	if w.final {
		// The cycle's windows closed: their final totals, read before
		// the cycle's changes and expiry are written. Exactly-once they
		// are in the transaction of the changelog records that carry the
		// stream time closing them, so a restore (which rebuilds that
		// stream time) never writes them again.
		if to := w.closedBefore(w.streamTime); to > w.closedFrom {
			finals := map[windowKey]int64{}
			err := w.view(st).EachBetween(w.closedFrom, to, func(wt state.WindowTotal) error {
				finals[windowKey{product: wt.Product, start: wt.Start}] = wt.Total
				return nil
			})
			if err != nil {
				return 0, err
			}
			for k, e := range w.dirty {
				if k.start >= w.closedFrom && k.start < to {
					finals[k] = e.Total
				}
			}
			for k, total := range finals {
				if sales.Notify(total, spec.threshold) {
					emit(w.notification(spec, k, total, size, true), false)
					n++
				}
			}
			w.closedFrom = to
		}
	}
	for k, e := range w.dirty {
		if k.start < p.expireBefore {
			// Folded and expired in one cycle (stream time jumped past
			// its retention): its tombstone went out with the others, or
			// the store never had it.
			emit(w.tombstone(spec, k.product, k.start), true)
			n++
			continue
		}
		rec := &kgo.Record{
			Topic: w.changelog, Partition: spec.partition,
			Key:       sales.AppendWindowKey(nil, []byte(k.product), k.start),
			Value:     sales.EncodeTotal(e.Total),
			Headers:   []kgo.RecordHeader{{Key: sales.OffsetsHeader, Value: e.Offsets.AppendEncode(nil)}},
			Timestamp: time.UnixMilli(min(w.streamTime, k.start+w.sizeMS-1)),
		}
		emit(rec, true)
		n++
		if !w.final && sales.Notify(e.Total, spec.threshold) {
			emit(w.notification(spec, k, e.Total, size, false), false)
			n++
		}
		p.updates = append(p.updates, state.WindowUpdate{Product: k.product, Start: k.start, Entry: *e})
	}
	clear(w.dirty)
	w.current = p
	return n, nil
}

// notification returns the windowed notification of window k's total
// (final: once it closed).
func (w *windowAgg) notification(spec recordSpec, k windowKey, total int64, size string, final bool) *kgo.Record {
	key := []byte(k.product)
	return &kgo.Record{
		Topic:     spec.notifications,
		Partition: sales.Partition(key, spec.notificationPartitions),
		Key:       key,
		Value:     sales.AppendWindowNotification(nil, k.product, total, size, k.start, k.start+w.sizeMS, final),
		Headers:   []kgo.RecordHeader{{Key: sales.WindowHeader, Value: []byte(size)}},
	}
}

// tombstone returns the changelog tombstone of product's window at start.
func (w *windowAgg) tombstone(spec recordSpec, product string, start int64) *kgo.Record {
	return &kgo.Record{Topic: w.changelog, Partition: spec.partition,
		Key: sales.AppendWindowKey(nil, []byte(product), start), Timestamp: time.UnixMilli(max(w.streamTime, 0))}
}

// write takes the cycle in progress as committed and returns the store
// write of the cycles committed and not yet written, merged (nil: none):
// their updates in order, less those of windows a later one expired; the
// latest expiry and stream time; the checkpoint after the changelog
// offsets acknowledged.
func (w *windowAgg) write(st *state.Store) *state.WindowWrite {
	if w.current != nil {
		w.pending = append(w.pending, w.current)
		w.current = nil
	}
	if len(w.pending) == 0 {
		return nil
	}
	cp := w.cp
	cp.ChangelogTopicID = w.topicID
	ww := &state.WindowWrite{Windows: w.view(st), Checkpoint: cp, StreamTime: state.NoStreamTime}
	for _, p := range w.pending {
		if m := p.maxOffset.Load(); m >= 0 {
			ww.Checkpoint.ChangelogOffset = max(ww.Checkpoint.ChangelogOffset, m+1)
		}
		ww.ExpireBefore = max(ww.ExpireBefore, p.expireBefore)
		ww.StreamTime = max(ww.StreamTime, p.streamTime)
	}
	for _, p := range w.pending {
		for _, u := range p.updates {
			if u.Start >= ww.ExpireBefore {
				ww.Updates = append(ww.Updates, u)
			}
		}
	}
	return ww
}

// written records that the pending cycles are in the store as ww.
func (w *windowAgg) written(ww *state.WindowWrite) {
	w.cp = ww.Checkpoint
	w.committed = max(w.committed, ww.StreamTime)
	w.shownTime.Store(w.committed)
	w.shownCheckpoint.Store(w.cp.ChangelogOffset)
	w.expired = max(w.expired, ww.ExpireBefore)
	w.pending = nil
}

// drop forgets the cycle in progress (it commits nothing): its windows,
// and the stream time goes back to what the committed cycles reached.
func (w *windowAgg) drop() {
	clear(w.dirty)
	w.current = nil
	w.streamTime = w.committed
	for _, p := range w.pending {
		w.streamTime = max(w.streamTime, p.streamTime)
	}
	w.closedFrom = w.closedBefore(w.streamTime)
}

// restored sets what the store holds after a restore: its checkpoint and
// stream time.
func (w *windowAgg) restored(cp state.Checkpoint, streamTime int64) {
	w.cp = cp
	w.streamTime, w.committed = streamTime, streamTime
	w.closedFrom = w.closedBefore(streamTime)
	w.shownTime.Store(streamTime)
	w.shownCheckpoint.Store(cp.ChangelogOffset)
	// The first cycle tombstones and deletes what is past retention,
	// whatever the changelog held (a retention shortened since).
	w.expired = 0
	clear(w.dirty)
	w.current, w.pending = nil, nil
}

// eventTime is the time r's event is folded into windows at: its
// windows.time.field, or without one its record timestamp. An amount
// forwarded alone (config.ForwardsAmounts) has its time field in an
// EventTimeHeader, read by the forwarder (task.forward), or a BadTimeHeader
// when it could not be; without either (no time field, or forwarded by
// Kafka Streams) its record timestamp. An EventTimeHeader that is not 8
// bytes is a bad time, never the record timestamp in its place.
func (t *task) eventTime(topic string, r *kgo.Record) (int64, error) {
	cfg := &t.deps.env.cfg
	if topic != cfg.InputTopic && cfg.ForwardsAmounts() {
		for _, h := range r.Headers {
			switch {
			case h.Key == sales.BadTimeHeader:
				return 0, &sales.BadEventError{Reason: sales.ReasonBadTime, Detail: string(h.Value)}
			case h.Key == sales.EventTimeHeader:
				if len(h.Value) != 8 {
					return 0, &sales.BadEventError{Reason: sales.ReasonBadTime, Detail: fmt.Sprintf("%s header of %d bytes, not 8", sales.EventTimeHeader, len(h.Value))}
				}
				return int64(binary.BigEndian.Uint64(h.Value)), nil
			}
		}
		return r.Timestamp.UnixMilli(), nil
	}
	if cfg.Windows.TimeField == "" {
		return r.Timestamp.UnixMilli(), nil
	}
	return sales.EventTime(r.Value, cfg.Windows.TimeField)
}

// allWindows is an ExpireBefore that clears a size's whole key space.
const allWindows = math.MaxInt64

// windowsWith is the message of a window size for the log.
func (w *windowAgg) String() string {
	return fmt.Sprintf("%s (%s)", sales.FormatWindowSize(w.size), w.changelog)
}

// reasonLate names an event left out of a closed window.
const reasonLate = "late"

// foldWindows folds an event into its window of each size. An event whose
// time cannot be read, or whose window closed, is left out of it: counted,
// logged (rate limited) and dead-lettered when dlq.topic is set; it still
// counts in its product's total.
func (t *task) foldWindows(ctx context.Context, topic string, r *kgo.Record, key []byte, value int64, src source) error {
	ts, err := t.eventTime(topic, r)
	if err != nil {
		for _, w := range t.windows {
			w.badTime.Add(1)
		}
		t.windowSkip(ctx, topic, r, err, sales.ReasonBadTime, nil)
		return nil
	}
	st := t.totals.store.Load()
	for _, w := range t.windows {
		res, bad, err := w.fold(st, key, value, ts, src)
		switch {
		case err != nil:
			return err
		case bad != nil:
			// A window's total out of range while the product's is not
			// (negative amounts): left out like a late event.
			w.late.Add(1)
			t.windowSkip(ctx, topic, r, bad, sales.Reason(bad), w)
		case res == foldLate:
			w.late.Add(1)
			start := sales.WindowStart(ts, w.sizeMS)
			t.windowSkip(ctx, topic, r, fmt.Errorf("event time %d is in window [%d, %d) of %s, closed at stream time %d (grace %d ms)",
				ts, start, start+w.sizeMS, sales.FormatWindowSize(w.size), w.streamTime, w.graceMS), reasonLate, w)
		}
	}
	return nil
}

// windowSkip records an event left out of the window of w (of every size
// when w is nil): a warning (rate limited) and, with dlq.topic, a
// dead-letter copy.
func (t *task) windowSkip(_ context.Context, topic string, r *kgo.Record, err error, reason string, w *windowAgg) {
	if dlq := t.deps.env.cfg.DLQTopic; dlq != "" {
		rec := deadLetter(topic, r, err, reason, int(t.deps.env.cfg.DLQMaxRecordBytes))
		rec.Topic, rec.Partition = dlq, r.Partition%t.deps.topo.dlqPartitions
		t.out.outbox = append(t.out.outbox, rec)
	}
	if ok, suppressed := t.in.windowLog.allow(time.Now()); ok {
		window := "every window size"
		if w != nil {
			window = sales.FormatWindowSize(w.size)
		}
		t.log.Warn("Event left out of its window (it counts in the product's total)",
			zap.String("topic", topic),
			zap.Int64("offset", r.Offset),
			zap.String("window", window),
			zap.String("reason", reason),
			zap.String("key", snippet(r.Key)),
			zap.Int64("suppressed", suppressed),
			zap.Error(err))
	}
}

// ErrUnknownWindow is returned by the window queries for a size that is
// not one of windows.sizes.
var ErrUnknownWindow = errors.New("not a configured window size")

// checkWindowSize returns an error wrapping ErrUnknownWindow, naming the
// configured sizes, unless size is one of them.
func (rt *Runtime) checkWindowSize(size time.Duration) error {
	sizes := rt.env.cfg.WindowSizes()
	if slices.Contains(sizes, size) {
		return nil
	}
	names := make([]string, len(sizes))
	for i, s := range sizes {
		names[i] = sales.FormatWindowSize(s)
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: %s (windows.sizes is empty: no windows are kept)", ErrUnknownWindow, sales.FormatWindowSize(size))
	}
	return fmt.Errorf("%w: %s (windows.sizes: %s)", ErrUnknownWindow, sales.FormatWindowSize(size), strings.Join(names, ", "))
}

// WindowSizes returns the configured window sizes.
func (rt *Runtime) WindowSizes() []time.Duration { return rt.env.cfg.WindowSizes() }

// ProductWindows returns product's windows of size starting from from to
// to (ms, both included), from the task that owns it here; errors as Total.
func (rt *Runtime) ProductWindows(product string, size time.Duration, from, to int64) ([]state.WindowTotal, error) {
	if err := rt.checkWindowSize(size); err != nil {
		return nil, err
	}
	s, err := rt.productStore(product)
	if err != nil {
		return nil, err
	}
	return s.Windows(size).Fetch(product, from, to)
}

// StandbyWindows returns product's windows of size from from to to (ms,
// both included) from this instance's standby copy of its task, when the
// copy's totals and its windows of the size are each within
// acceptable.recovery.lag; lag is the larger of the two. It fails
// (ErrNotHosted, ErrNotReady, ErrUnknownWindow) otherwise.
func (rt *Runtime) StandbyWindows(product string, size time.Duration, from, to int64) (ws []state.WindowTotal, lag int64, err error) {
	if err := rt.checkWindowSize(size); err != nil {
		return nil, 0, err
	}
	n := rt.reg.topology().partitions
	if n == 0 {
		return nil, 0, ErrNotReady
	}
	sb := rt.reg.standby(sales.Partition([]byte(product), n))
	acceptable := rt.env.cfg.AcceptableRecoveryLag
	st, lag, err := usableStandby(sb, acceptable)
	if err != nil {
		return nil, lag, err
	}
	f := sb.follower(size)
	if f == nil {
		return nil, lag, fmt.Errorf("%w: the standby copy of task %s keeps no %s windows", ErrNotReady, sb.name, sales.FormatWindowSize(size))
	}
	wlag, err := f.usable(sb.name, acceptable)
	if err != nil {
		return nil, wlag, err
	}
	ws, err = st.Windows(size).Fetch(product, from, to)
	return ws, max(lag, wlag), err
}

// WindowPage lists up to limit products of the window of size starting at
// start, sorted by product, after the product after, from every running
// task here; unavailable names the tasks assigned here but not running.
func (rt *Runtime) WindowPage(size time.Duration, start int64, after string, limit int) (page []state.Total, unavailable []string, err error) {
	if err := rt.checkWindowSize(size); err != nil {
		return nil, nil, err
	}
	unavailable, err = rt.eachRunningStore(func(s *state.Store) (err error) {
		page, err = windowPage(s.Windows(size), start, after, limit, page)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
	if len(page) > limit {
		page = page[:limit]
	}
	return page, unavailable, nil
}

// windowPage appends up to limit products of v's window starting at start,
// after the product after, to page.
func windowPage(v *state.Windows, start int64, after string, limit int, page []state.Total) ([]state.Total, error) {
	got, err := v.Scan(start, after, limit)
	if err != nil {
		return page, err
	}
	for _, wt := range got {
		page = append(page, state.Total{Product: wt.Product, Total: wt.Total})
	}
	return page, nil
}

// windowTop offers every product of v's window starting at start to h,
// read in chunks (it stops at ctx's end).
func windowTop(ctx context.Context, v *state.Windows, start int64, limit int, h *state.TopTotals) error {
	for after := ""; ; {
		page, err := v.Scan(start, after, topChunk)
		if err != nil {
			return err
		}
		for _, wt := range page {
			h.Offer(state.Total{Product: wt.Product, Total: wt.Total}, limit)
		}
		if len(page) < topChunk {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		after = page[len(page)-1].Product
	}
}

// WindowStarts returns up to limit starts of windows of size that the
// running tasks here hold, from from on, sorted and each once;
// unavailable names the tasks assigned here but not running.
func (rt *Runtime) WindowStarts(size time.Duration, from int64, limit int) (starts []int64, unavailable []string, err error) {
	if err := rt.checkWindowSize(size); err != nil {
		return nil, nil, err
	}
	unavailable, err = rt.eachRunningStore(func(s *state.Store) error {
		got, err := s.Windows(size).Starts(from, limit)
		starts = append(starts, got...)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	slices.Sort(starts)
	starts = slices.Compact(starts)
	if len(starts) > limit {
		starts = starts[:limit]
	}
	return starts, unavailable, nil
}

// WindowTop lists the limit largest totals (equal totals by product) of
// the window of size starting at start, over this instance's running
// tasks, each read whole in chunks (it stops at ctx's end); unavailable as
// WindowPage's.
func (rt *Runtime) WindowTop(ctx context.Context, size time.Duration, start int64, limit int) (top []state.Total, unavailable []string, err error) {
	if err := rt.checkWindowSize(size); err != nil {
		return nil, nil, err
	}
	var h state.TopTotals
	unavailable, err = rt.eachRunningStore(func(s *state.Store) error { return windowTop(ctx, s.Windows(size), start, limit, &h) })
	if err != nil {
		return nil, nil, err
	}
	return h.Sorted(), unavailable, nil
}

// StandbyWindowPage lists the products of the window of size starting at
// start from this instance's standby copy of task, as StandbyPage lists
// its totals: when the copy's totals and its windows of the size are each
// within acceptable.recovery.lag, up to limit after the product after, or
// with byTotal the limit largest; lag is the larger of the two.
func (rt *Runtime) StandbyWindowPage(ctx context.Context, task string, size time.Duration, start int64, after string, limit int, byTotal bool) (page []state.Total, lag int64, err error) {
	if err := rt.checkWindowSize(size); err != nil {
		return nil, 0, err
	}
	p, ok := state.ParseTaskName(task)
	if !ok {
		return nil, 0, fmt.Errorf("%w: %q is not a task name", ErrNotHosted, task)
	}
	sb := rt.reg.standby(p)
	st, lag, err := usableStandby(sb, rt.env.cfg.AcceptableRecoveryLag)
	if err != nil {
		return nil, lag, err
	}
	f := sb.follower(size)
	if f == nil {
		return nil, lag, fmt.Errorf("%w: the standby copy of task %s keeps no %s windows", ErrNotReady, sb.name, sales.FormatWindowSize(size))
	}
	wlag, err := f.usable(sb.name, rt.env.cfg.AcceptableRecoveryLag)
	if err != nil {
		return nil, wlag, err
	}
	lag = max(lag, wlag)
	if !byTotal {
		page, err = windowPage(st.Windows(size), start, after, limit, nil)
		return page, lag, err
	}
	var h state.TopTotals
	if err := windowTop(ctx, st.Windows(size), start, limit, &h); err != nil {
		return nil, lag, err
	}
	return h.Sorted(), lag, nil
}
