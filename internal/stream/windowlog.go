package stream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// Reading a window size's changelog into its key space of a task's store:
// the restore (windowReplay up to the changelog's end) and a standby copy
// (windowFollower, until stopped) share it.

// windowReplay writes a size's changelog records into its key space with
// the checkpoint and stream time they bring. Owned by one goroutine.
type windowReplay struct {
	// w is the size; only its constants (grid, changelog, topic id, store
	// name) are read, never its cycle state.
	w    *windowAgg
	st   *state.Store
	v    *state.Windows
	tp   string
	name string
	log  *zap.Logger
	// cp is the checkpoint the key space holds, streamTime the stream time
	// (-1: none).
	cp         state.Checkpoint
	streamTime int64
	updates    []state.WindowUpdate
}

func newWindowReplay(w *windowAgg, st *state.Store, partition int32, name string, log *zap.Logger) *windowReplay {
	return &windowReplay{w: w, st: st, v: st.Windows(w.size), tp: fmt.Sprintf("%s-%d", w.changelog, partition), name: name, log: log, streamTime: -1}
}

// start reads the size's checkpoint and stream time. When there is no
// checkpoint, or it is of another topic or outside the changelog's offsets
// logStart to end, the size's windows are cleared and the replay starts at
// logStart: fresh reports that.
func (r *windowReplay) start(logStart, end int64) (fresh bool, err error) {
	cp, found, err := r.v.Checkpoint()
	if err != nil {
		return false, err
	}
	streamTime, hasTime, err := r.v.StreamTime()
	if err != nil {
		return false, err
	}
	if !hasTime {
		streamTime = -1
	}
	if found && cp.ChangelogTopicID == r.w.topicID && cp.ChangelogOffset >= logStart && cp.ChangelogOffset <= end {
		r.cp, r.streamTime = cp, streamTime
		return false, nil
	}
	if !found {
		r.log.Info(fmt.Sprintf("task [%s] State store %s did not find checkpoint offset, hence would default to the starting offset at changelog %s",
			r.name, r.w.storeName, r.tp))
	} else {
		r.log.Warn(fmt.Sprintf("task [%s] The checkpoint of store %s (offset %d) does not fit changelog %s (offsets %d to %d, or another topic): clearing its windows and restoring from the start",
			r.name, r.w.storeName, cp.ChangelogOffset, r.tp, logStart, end))
	}
	r.cp = state.Checkpoint{ChangelogOffset: logStart, InputOffset: -1, ChangelogTopicID: r.w.topicID}
	r.streamTime = -1
	return true, r.st.ApplyWindows([]state.WindowWrite{{Windows: r.v, ExpireBefore: allWindows, Checkpoint: r.cp, StreamTime: state.ClearStreamTime}}, false)
}

// decode turns the records of b below end into r.updates, moving the
// stream time, and returns how many it read. An unreadable record is
// logged and passed.
func (r *windowReplay) decode(b changelog.Batch, end int64) int64 {
	r.updates = r.updates[:0]
	var n int64
	for _, rec := range b.Records {
		if rec.Offset >= end {
			break
		}
		product, start, err := sales.DecodeWindowKey(rec.Key)
		if err == nil && (start < 0 || start%r.w.sizeMS != 0) {
			err = fmt.Errorf("window start %d is not on the %s grid", start, sales.FormatWindowSize(r.w.size))
		}
		var total int64
		if err == nil && rec.Value != nil {
			total, err = sales.DecodeTotal(rec.Value)
		}
		if err != nil {
			changelog.LogUnreadable(r.log, r.tp, rec.Offset, err)
			continue
		}
		u := state.WindowUpdate{Product: string(product), Start: start, Delete: rec.Value == nil}
		if !u.Delete {
			u.Entry.Total = total
			for _, h := range rec.Headers {
				if h.Key == sales.OffsetsHeader {
					if offs, err := sales.DecodeOffsets(h.Value); err == nil {
						u.Entry.Offsets = offs
					}
				}
			}
		}
		r.updates = append(r.updates, u)
		r.streamTime = max(r.streamTime, rec.Timestamp.UnixMilli())
		n++
	}
	return n
}

// apply writes the records of b below end in one batch, with the
// checkpoint past them (synced unless unsynced), and returns how many it
// read.
func (r *windowReplay) apply(b changelog.Batch, end int64, unsynced bool) (int64, error) {
	n := r.decode(b, end)
	next := min(b.Next, end)
	if next <= r.cp.ChangelogOffset {
		return n, nil
	}
	cp := r.cp
	cp.ChangelogOffset = next
	if err := r.write(cp, unsynced); err != nil {
		return n, err
	}
	return n, nil
}

// write writes r.updates with checkpoint cp and the stream time.
func (r *windowReplay) write(cp state.Checkpoint, unsynced bool) error {
	ww := state.WindowWrite{Windows: r.v, Updates: r.updates, Checkpoint: cp, StreamTime: max(r.streamTime, state.NoStreamTime)}
	if err := r.st.ApplyWindows([]state.WindowWrite{ww}, unsynced); err != nil {
		return err
	}
	r.cp = cp
	return nil
}

// bulk reads the changelog from the checkpoint to end into a bulk load of
// the size's empty key space (sorted in the memory the process's loads
// share and written once, see state.BulkLoad), then writes the checkpoint
// and stream time. It returns how many records it read. A crash before
// that write leaves the checkpoint from before the load, from which a
// restore replays the same records again over the loaded windows.
func (r *windowReplay) bulk(ctx context.Context, cr *changelog.Reader, end int64, o state.BulkOptions) (int64, error) {
	load, err := r.v.BulkLoad(o)
	if err != nil {
		return 0, err
	}
	defer load.Close()
	var n int64
	next := r.cp.ChangelogOffset
	for next < end {
		b, err := cr.Next(ctx)
		if err != nil {
			return n, err
		}
		n += r.decode(b, end)
		if err := load.AddWindows(r.updates); err != nil {
			return n, err
		}
		next = min(b.Next, end)
	}
	began := time.Now()
	st, err := load.FinishWindows(ctx)
	if err != nil {
		return n, err
	}
	d := time.Since(began)
	r.log.Info(fmt.Sprintf("task [%s] Bulk-loaded the restored store %s: %d windows from %d records in %d sorted runs, %d tables ingested in %d ms",
		r.name, r.w.storeName, st.Products, st.Updates, st.Runs, st.Tables, d.Milliseconds()),
		zap.String("store", r.w.storeName), zap.Int64("windows", st.Products), zap.Int("runs", st.Runs), zap.Int("tables", st.Tables), zap.Duration("duration", d))
	cp := r.cp
	cp.ChangelogOffset = next
	r.updates = r.updates[:0]
	return n, r.write(cp, false)
}

// restoreWindows brings the task's windows of w's size up to the end of
// their changelog: from their checkpoint in the store, or from the start
// (the size's windows cleared) when there is none or it is not of this
// changelog or out of its range. The stream time is the stored one, or the
// latest record timestamp restored (each record's is the stream time
// within its window). It logs what it restored as the totals' restore
// does, per store.
func (t *task) restoreWindows(ctx context.Context, w *windowAgg) error {
	e := t.deps.env
	began := time.Now()
	r := newWindowReplay(w, t.totals.store.Load(), t.partition, t.name, t.log)
	onRetry, done := t.listRetry(r.tp)
	logStart, end, err := changelog.Bounds(ctx, e.client, w.changelog, t.partition, onRetry)
	done()
	if err != nil {
		return err
	}
	fresh, err := r.start(logStart, end)
	if err != nil {
		return err
	}
	var n int64
	if r.cp.ChangelogOffset < end {
		cr, err := changelog.Open(changelog.Options{Client: e.kafkaOpts(), Topic: w.changelog, TopicID: w.topicID,
			Partition: t.partition, From: r.cp.ChangelogOffset, FetchBytes: restoreFetchBytes, Log: t.log})
		if err != nil {
			return err
		}
		defer cr.Close()
		if fresh && end-r.cp.ChangelogOffset >= bulkRestoreMin {
			n, err = r.bulk(ctx, cr, end, state.BulkOptions{Budget: e.bulkBudget})
			if err != nil {
				return err
			}
		}
		for r.cp.ChangelogOffset < end {
			b, err := cr.Next(ctx)
			if err != nil {
				return err
			}
			got, err := r.apply(b, end, min(b.Next, end) < end)
			n += got
			if err != nil {
				return err
			}
		}
	}
	w.restored(r.cp, r.streamTime)
	t.log.Info(fmt.Sprintf("Finished restoring changelog %s to store %s with a total number of %d records", r.tp, w.storeName, n),
		zap.Int64("records", n), zap.Duration("duration", time.Since(began)))
	return nil
}

// windowFollower keeps a standby copy's windows of one size: it tails the
// size's changelog into the copy's store, with the size's checkpoint and
// stream time, so that the task restores only what it lacks when it moves
// here, and the copy can answer window queries. Its goroutine is the
// copy's; pos is read by status queries.
type windowFollower struct {
	w   *windowAgg
	pos copyPosition
	// streamTime is the stream time the copy's windows hold (-1: none).
	streamTime atomic.Int64
}

func newWindowFollower(w *windowAgg) *windowFollower {
	f := &windowFollower{w: w}
	f.pos.position.Store(-1)
	f.pos.end.Store(-1)
	f.streamTime.Store(-1)
	return f
}

// status is the size's line of the copy's status.
func (f *windowFollower) status() status.Window {
	ws := status.Window{Size: sales.FormatWindowSize(f.w.size), StreamTime: f.streamTime.Load(), Checkpoint: f.pos.position.Load()}
	if lag := f.lag(); lag >= 0 {
		ws.ChangelogLag = &lag
	}
	return ws
}

// follower returns the copy's follower of the window size, nil when it
// keeps none.
func (s *standby) follower(size time.Duration) *windowFollower {
	for _, f := range s.windows {
		if f.w.size == size {
			return f
		}
	}
	return nil
}

// usable returns nil when the copy's windows of this size may answer
// queries (tailing within acceptable records of their changelog's end),
// an ErrNotReady error naming the task otherwise; lag is how far behind
// they may be.
func (f *windowFollower) usable(name string, acceptable int64) (lag int64, err error) {
	lag = f.lag()
	if lag < 0 {
		return lag, fmt.Errorf("%w: the standby copy of store %s of task %s is not tailing yet", ErrNotReady, f.w.storeName, name)
	}
	if lag > acceptable {
		return lag, fmt.Errorf("%w: the standby copy of store %s of task %s is %d records behind (acceptable.recovery.lag %d)", ErrNotReady, f.w.storeName, name, lag, acceptable)
	}
	return lag, nil
}

// lag is how far the copy's windows of this size are behind the last
// stable offset last seen (-1: unknown).
func (f *windowFollower) lag() int64 {
	pos, end := f.pos.position.Load(), f.pos.end.Load()
	if pos < 0 || end < 0 {
		return -1
	}
	return max(0, end-pos)
}

// run tails until ctx is done; a failure is logged and the tail starts
// over after standbyRetry (a changelog whose start moved past the copy
// clears the size: its checkpoint no longer fits).
func (f *windowFollower) run(ctx context.Context, s *standby, st *state.Store) {
	for {
		err := f.tail(ctx, s, st)
		f.pos.position.Store(-1)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn(fmt.Sprintf("task [%s] Standby copy of store %s failed; starting over in %s", s.name, f.w.storeName, standbyRetry), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(standbyRetry):
		}
	}
}

func (f *windowFollower) tail(ctx context.Context, s *standby, st *state.Store) error {
	e := s.deps.env
	r := newWindowReplay(f.w, st, s.partition, s.name, s.log)
	logStart, end, err := changelog.Bounds(ctx, e.client, f.w.changelog, s.partition, boundsRetryLog(s.log, r.tp))
	if err != nil {
		return err
	}
	if _, err := r.start(logStart, end); err != nil {
		return err
	}
	f.pos.end.Store(end)
	f.pos.position.Store(r.cp.ChangelogOffset)
	f.streamTime.Store(r.streamTime)
	cr, err := changelog.Open(changelog.Options{Client: e.kafkaOpts(), Topic: f.w.changelog, TopicID: f.w.topicID,
		Partition: s.partition, From: r.cp.ChangelogOffset, FetchBytes: standbyFetchBytes, Log: s.log})
	if err != nil {
		return err
	}
	defer cr.Close()
	s.log.Info(fmt.Sprintf("task [%s] %s copy tailing changelog %s from offset %d (%d behind)", s.name, s.role(), r.tp, r.cp.ChangelogOffset, max(0, end-r.cp.ChangelogOffset)),
		zap.Int64("from", r.cp.ChangelogOffset), zap.Int64("end_offset", end))
	for {
		b, err := cr.Next(ctx)
		if errors.Is(err, changelog.ErrOutOfRange) {
			return fmt.Errorf("the start of changelog %s moved past the copy: %w", r.tp, err)
		}
		if err != nil {
			return err
		}
		if b.StableEnd >= 0 {
			f.pos.end.Store(b.StableEnd)
		}
		n, err := r.apply(b, math.MaxInt64, true)
		if err != nil {
			return err
		}
		f.pos.position.Store(r.cp.ChangelogOffset)
		f.pos.applied.Add(n)
		f.streamTime.Store(r.streamTime)
	}
}

// windowAggs returns the task's window sizes as configured, each with its
// changelog's topic id from topo.
func windowAggs(e *env, topo topology) []*windowAgg {
	cfg := e.cfg
	var ws []*windowAgg
	for i, size := range cfg.WindowSizes() {
		var id [16]byte
		if i < len(topo.windowIDs) {
			id = topo.windowIDs[i]
		}
		ws = append(ws, newWindowAgg(size, cfg.Windows.Grace, cfg.WindowRetention(size),
			cfg.WindowChangelogTopic(size), sales.WindowStoreName(cfg.StoreName, size), id))
	}
	return ws
}

// follow starts the copy's window followers on st, and returns a stop
// that cancels them and waits until they are done (before the store is
// wiped or closed).
func (s *standby) follow(ctx context.Context, st *state.Store) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, f := range s.windows {
		wg.Go(func() { f.run(ctx, s, st) })
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
