package stream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// TaskState is where a task is in its life.
type TaskState int32

// Task states, in the order a task goes through them.
const (
	TaskCreated TaskState = iota
	TaskRestoring
	TaskRunning
	TaskStopping
	TaskClosed
	TaskFailed
	// TaskStalled: the store cannot take writes (disk full, read-only);
	// the task stopped processing and checks again every second.
	TaskStalled
)

func (s TaskState) String() string {
	switch s {
	case TaskCreated:
		return "created"
	case TaskRestoring:
		return "restoring"
	case TaskRunning:
		return "running"
	case TaskStopping:
		return "stopping"
	case TaskClosed:
		return "closed"
	case TaskFailed:
		return "failed"
	case TaskStalled:
		return "stalled"
	}
	return fmt.Sprintf("TaskState(%d)", int32(s))
}

// maxDirty bounds the products a task keeps changed in memory between
// commits; past it the task flushes early (at-least-once) or asks the poll
// loop for the transaction cycle now (exactly-once; the products folded
// until that cycle prepares add at most the task's inbox).
const maxDirty = 100_000

// inboxDepth is how many polled batches (up to 10,000 records each) wait for
// a task: enough to keep it busy while the poll loop fetches, few enough
// that the records held in memory stay bounded (about 2.5 MB a batch).
const inboxDepth = 4

// batch is records of one partition handed from the poll loop to a task.
type batch struct {
	topic string
	recs  []*kgo.Record
	hwm   int64
	// epoch is the task's rewind epoch when the poll loop dispatched it: a
	// batch read before a rewind (see task.rewind) is dropped.
	epoch int64
}

// task owns one partition: its goroutine, its inbox and its store. Fields
// under "owned by the task goroutine" are touched by nothing else; the atomic
// fields are read by status queries.
type task struct {
	rt        *Runtime
	partition int32
	name      string
	log       *zap.Logger

	inbox chan batch
	// quit is closed by requestStop; flushOnStop says how to close: flush
	// before closing (revoked at-least-once, shutdown) or drop (lost, and
	// always exactly-once).
	quit        chan struct{}
	quitOnce    sync.Once
	flushOnStop atomic.Bool
	done        chan struct{}
	// cycle carries the exactly-once commit cycle's requests from the poll
	// loop (see eos.go); unused at-least-once.
	cycle chan cycleReq

	state atomic.Int32
	// store is set once opened; it is read by queries while running.
	store atomic.Pointer[state.Store]

	// owned by the task goroutine
	// dirty are the entries changed in the current cycle, not yet produced;
	// they are the task's own (see process) and come from arena.
	dirty      map[string]*state.Entry
	arena      entryArena
	cp         state.Checkpoint
	inputNext  int64 // next input offset to process, -1 before the first record
	repartNext int64 // next repartition offset to process, -1 before the first record
	pending    sync.WaitGroup
	plain      func(*kgo.Record, error) // the produce callback of records other than the changelog's
	produceErr atomic.Pointer[error]
	badLog     rateLimiter
	// prepared is the exactly-once cycle's batch, produced in the open
	// transaction and written to the store only once it commits.
	prepared *preparedBatch
	// stalled is the batch the store could not take (see stall), nil
	// while it can be written.
	stalled  *stalledBatch
	retryLog rateLimiter
	// held are batches read from the inbox while stalled (at-least-once),
	// processed once the store takes writes again: a stalled task keeps
	// reading its inbox so that the poll loop never blocks on it. Bounded:
	// the task's partitions are paused while it is stalled.
	held []batch
	// memberLog rate-limits the warning about a flush skipped because this
	// member may no longer own the task; memberUnknownAt is when that check
	// last failed (zero: it passed), memberPaused whether the task paused
	// its partitions meanwhile (its changed products reached maxDirty).
	memberLog       rateLimiter
	memberUnknownAt time.Time
	memberPaused    bool
	// memberRefused: the last check failed (its trouble is to clear).
	memberRefused bool
	// outbox are the records the cycle produces besides the changelog and
	// notifications: events forwarded to their owner's task, dead-letter
	// copies. Produced with the cycle, after the membership check, so that
	// a member that lost the task writes none of them.
	outbox []*kgo.Record
	// Rewinds (at-least-once): after a cycle whose records failed to
	// produce, the task folds its input again from the offsets it last
	// committed. wantEpoch is the rewind epoch the task waits for: batches
	// dispatched before the poll loop moved the position are dropped.
	// reported and first are, per topic (input 0, repartition 1), the last
	// offset reported for commit and the first offset read (-1: none).
	// backoff is the wait before the next attempt; resumeAt when the
	// task's partitions, paused after a failure, are resumed (zero: not
	// paused).
	wantEpoch       int64
	reported, first [2]int64
	backoff         time.Duration
	resumeAt        time.Time
	// cycleRecords are the records the task's last cycle produced.
	cycleRecords int
	produceLog   rateLimiter
	// fdLog rate-limits the warning about a write whose check found the
	// process out of file descriptors.
	fdLog rateLimiter
	// rewindEpoch is the epoch the poll loop stamps this task's batches
	// with; it adds one after each rewind it applies.
	rewindEpoch atomic.Int64

	stats taskStats
	// trouble is what keeps the task from progressing, read by status.
	trouble trouble
	// standbyAt is the changelog offset the standby copy this task took
	// over had reached (-1: none), for the promotion log line.
	standbyAt int64
	// standbyApplied are the changelog records that copy applied since it
	// started (its catch-up), for the same line.
	standbyApplied int64
	// cache holds entries the store holds, in front of it.
	cache *entryCache
}

// trouble is what keeps a task from making progress: a wait it cannot
// shorten (for stable offsets, for the changelog's bounds), or a failure it
// retries with backoff (a restore that errors, a cycle whose records could
// not be produced). Written by the task goroutine, read by status queries.
type trouble struct {
	mu sync.Mutex
	// waiting says what the task waits for, "" when nothing; guarded by mu.
	waiting string
	// err is the latest failure, "" when the last attempt succeeded;
	// attempts counts the failures in a row. Guarded by mu.
	err      string
	attempts int
	// since is when the current wait or run of failures began, counted
	// from when it stops being expected (a wait for stable offsets is
	// expected for a transaction timeout); zero when none. Guarded by mu.
	since time.Time
	// began is when it began as the operator sees it. Guarded by mu.
	began time.Time
}

// wait records what the task waits for; expected is how long such a wait
// can last in a healthy cluster (it counts toward task.timeout.ms only
// after that).
func (tr *trouble) wait(what string, expected time.Duration) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.waiting == "" && tr.err == "" {
		now := time.Now()
		tr.began, tr.since = now, now.Add(expected)
	}
	tr.waiting = what
}

// fail records a failure and returns how many came in a row and since when.
func (tr *trouble) fail(err error) (int, time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.since.IsZero() {
		tr.began, tr.since = time.Now(), time.Now()
	}
	tr.waiting = ""
	tr.err = err.Error()
	tr.attempts++
	return tr.attempts, tr.began
}

// clear records that the task progresses again.
func (tr *trouble) clear() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.waiting, tr.err, tr.attempts = "", "", 0
	tr.since, tr.began = time.Time{}, time.Time{}
}

// snapshot returns the trouble for status: what it waits for, the latest
// failure and attempts, since when, and whether it lasted past timeout.
func (tr *trouble) snapshot(timeout time.Duration) (waiting, err string, attempts int, began time.Time, overdue bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	overdue = !tr.since.IsZero() && time.Since(tr.since) > timeout
	return tr.waiting, tr.err, tr.attempts, tr.began, overdue
}

// taskStats are counters read by status queries.
type taskStats struct {
	processed     atomic.Int64
	duplicates    atomic.Int64
	bad           atomic.Int64
	forwarded     atomic.Int64
	inputHWM      atomic.Int64
	inputPos      atomic.Int64
	restoreFrom   atomic.Int64
	restoreTo     atomic.Int64
	restored      atomic.Int64
	restoreMillis atomic.Int64
	checkpoint    atomic.Int64
	badReasons    badReasons
}

func newTask(rt *Runtime, partition int32) *task {
	t := &task{
		rt:         rt,
		partition:  partition,
		name:       state.TaskName(partition),
		inbox:      make(chan batch, inboxDepth),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
		cycle:      make(chan cycleReq),
		dirty:      make(map[string]*state.Entry),
		inputNext:  -1,
		repartNext: -1,
		badLog:     rateLimiter{every: 10 * time.Second, burst: 5},
		retryLog:   rateLimiter{every: 30 * time.Second, burst: 1},
		memberLog:  rateLimiter{every: 10 * time.Second, burst: 1},
		produceLog: rateLimiter{every: 10 * time.Second, burst: 3},
		fdLog:      rateLimiter{every: 30 * time.Second, burst: 1},
		reported:   [2]int64{-1, -1},
		first:      [2]int64{-1, -1},
		standbyAt:  -1,
		cache:      newEntryCache(rt.cacheBytesPerTask()),
	}
	t.log = rt.log.With(zap.String("task", t.name), zap.Int32("partition", partition))
	t.plain = t.promise(nil)
	t.stats.inputPos.Store(-1)
	t.stats.checkpoint.Store(-1)
	return t
}

// requestStop asks the task to stop; it returns at once. A task still
// restoring abandons its restore within a second.
func (t *task) requestStop(flush bool) {
	t.quitOnce.Do(func() {
		t.flushOnStop.Store(flush)
		close(t.quit)
	})
}

// State returns the task's state.
func (t *task) State() TaskState { return TaskState(t.state.Load()) }

func (t *task) setState(s TaskState) { t.state.Store(int32(s)) }

// run is the task goroutine. It restores the store, then processes records
// until told to stop. It returns an error only for a failure that leaves the
// task unable to go on; the runtime then stops.
func (t *task) run(ctx context.Context) (err error) {
	defer close(t.done)
	defer func() {
		if err != nil && state.IsCorrupt(err) {
			// The store is closed by now: move it aside so that the next
			// start restores the task from the changelog instead of failing
			// again on the same corruption.
			if to, qerr := t.rt.dir.Quarantine(t.partition); qerr == nil {
				err = fmt.Errorf("%w; the store was moved to %s and is restored from the changelog at the next start", err, to)
			}
		}
		if err != nil {
			t.setState(TaskFailed)
			t.log.Error("Task failed", zap.Error(err))
		} else {
			t.setState(TaskClosed)
		}
	}()
	t.setState(TaskRestoring)
	// The restore is canceled when the task is stopped: a revoked task
	// lets go at once, however long its restore.
	rctx, cancelRestore := context.WithCancel(ctx)
	go func() {
		select {
		case <-t.quit:
			cancelRestore()
		case <-rctx.Done():
		}
	}()
	err = t.restoreRetrying(rctx)
	cancelRestore()
	if err != nil {
		// Only a stop ends the retries.
		if s := t.store.Swap(nil); s != nil {
			_ = s.Close()
		}
		t.log.Info(fmt.Sprintf("task [%s] Restore canceled: the task was stopped", t.name))
		return nil
	}
	select {
	case <-t.quit:
		return t.close(ctx, false, nil)
	default:
	}
	t.setState(TaskRunning)
	t.rt.taskRestored(t)

	// At-least-once, the task runs its own commit cycle on a ticker;
	// exactly-once, the poll loop drives one cycle for all tasks.
	var tick <-chan time.Time
	if !t.rt.eos {
		ticker := time.NewTicker(t.rt.cfg.CommitInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	// ended handles an error of processing: it fails the task.
	ended := func(err error) error { return t.close(ctx, false, err) }
	for {
		// A stalled task processes nothing until its store takes writes
		// again; what it still receives is held. A task paused after a
		// failed cycle, or for want of a membership answer, checks every
		// second too.
		var retryC <-chan time.Time
		if t.stalled != nil || !t.resumeAt.IsZero() || t.memberPaused {
			retryC = retry.C
		}
		select {
		case b := <-t.inbox:
			if b.epoch < t.wantEpoch {
				continue // read before the rewind: it comes again
			}
			if t.stalled != nil {
				t.held = append(t.held, b)
				continue
			}
			if err := t.processBatch(ctx, b); err != nil {
				return ended(err)
			}
		case <-retryC:
			if t.stalled != nil {
				if err := t.retryStalled(ctx); err != nil {
					return ended(err)
				}
				continue
			}
			if !t.resumeAt.IsZero() && time.Now().After(t.resumeAt) {
				t.resumeAt = time.Time{}
				t.rt.client.ResumeFetchPartitions(t.rt.topicsOf([]int32{t.partition}))
			}
			if t.memberPaused && !t.rt.eos {
				if err := t.flush(ctx); err != nil {
					return ended(err)
				}
			}
		case req := <-t.cycle:
			err := t.handleCycle(ctx, req)
			req.done <- err
			if err != nil {
				return ended(err)
			}
		case <-tick:
			if t.stalled != nil {
				continue
			}
			if err := t.flush(ctx); err != nil {
				return ended(err)
			}
		case <-t.quit:
			return t.close(ctx, t.flushOnStop.Load(), nil)
		case <-ctx.Done():
			return t.close(ctx, false, nil)
		}
	}
}

// close drains what the poll loop already handed over, flushes when asked,
// and closes the store.
func (t *task) close(ctx context.Context, flush bool, cause error) error {
	t.setState(TaskStopping)
	var errs []error
	if cause != nil {
		errs = append(errs, cause)
	}
	if flush && cause == nil && !t.rt.eos && t.stalled == nil {
	drain:
		for {
			select {
			case b := <-t.inbox:
				if err := t.processBatch(ctx, b); err != nil {
					errs = append(errs, err)
					break drain
				}
			default:
				break drain
			}
		}
		if len(errs) == 0 {
			errs = append(errs, t.flush(ctx))
		}
	}
	// Wait for every record produced for this task, whatever happens to
	// them, so no callback outlives the task.
	t.pending.Wait()
	if s := t.store.Load(); s != nil {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

func (t *task) processBatch(ctx context.Context, b batch) error {
	if b.topic == t.rt.cfg.InputTopic && b.hwm >= 0 {
		t.stats.inputHWM.Store(b.hwm)
	}
	for _, r := range b.recs {
		if err := t.process(ctx, b.topic, r); err != nil {
			return err
		}
	}
	if len(t.dirty)+len(t.outbox) >= maxDirty {
		if t.rt.eos {
			// The poll loop runs the transaction cycle at its next turn.
			t.rt.commitSoon.Store(true)
			select {
			case t.rt.commitNow <- struct{}{}:
			default:
			}
			return nil
		}
		return t.flush(ctx)
	}
	return nil
}

// process folds one record. Bad events are counted, logged and skipped.
func (t *task) process(ctx context.Context, topic string, r *kgo.Record) error {
	srcPart, srcOff, srcTopic := r.Partition, r.Offset, t.rt.topo.inputID
	if topic == t.rt.cfg.InputTopic {
		if t.first[0] < 0 {
			t.first[0] = r.Offset
		}
		t.inputNext = r.Offset + 1
		t.stats.inputPos.Store(t.inputNext)
	} else {
		if t.first[1] < 0 {
			t.first[1] = r.Offset
		}
		t.repartNext = r.Offset + 1
		var ok bool
		if srcPart, srcOff, srcTopic, ok = t.sourceOf(r); !ok {
			t.badEvent(ctx, topic, r, errors.New("forwarded record without source headers"), "bad_forward")
			return nil
		}
	}
	key, value, err := sales.DecodeKey(r.Key, r.Value)
	if err != nil {
		t.badEvent(ctx, topic, r, err, sales.Reason(err))
		return nil
	}
	if topic == t.rt.cfg.InputTopic {
		if owner := sales.Partition(key, t.rt.topo.partitions); owner != t.partition {
			t.forward(ctx, owner, key, r)
			return nil
		}
	}
	// An entry in the dirty map is the task's own: it is changed in place.
	// The first event of a product in a cycle copies the committed entry
	// (its offsets are shared with the cache) into one.
	e, owned := t.dirty[string(key)]
	if !owned {
		committed, ok := t.cache.get(string(key))
		if !ok {
			if committed, _, err = t.store.Load().Lookup(key); err != nil {
				return err
			}
		}
		if committed.Offsets.Reflects(srcTopic, srcPart, srcOff) {
			t.stats.duplicates.Add(1)
			return nil
		}
		e = t.arena.alloc()
		*e = state.Entry{Total: committed.Total, Offsets: committed.Offsets.Clone()}
	} else if e.Offsets.Reflects(srcTopic, srcPart, srcOff) {
		t.stats.duplicates.Add(1)
		return nil
	}
	total, err := sales.Add(e.Total, value)
	if err != nil {
		t.badEvent(ctx, topic, r, err, sales.Reason(err))
		return nil
	}
	e.Total = total
	var zero [16]byte
	if srcTopic == t.rt.topo.inputID || srcTopic == zero || t.rt.topo.inputID == zero {
		e.Offsets.Set(srcTopic, srcPart, srcOff)
	}
	// Else the event was forwarded from an input topic since recreated: it
	// counts, but recording its offset would drop the product's offsets of
	// the current topic and let their redeliveries count twice.
	if !owned {
		t.dirty[string(key)] = e
	}
	t.stats.processed.Add(1)
	return nil
}

// forward sends an event to the task owning its product, through the
// repartition topic, with its input coordinates as headers so the owner can
// recognise a redelivery.
func (t *task) forward(ctx context.Context, owner int32, key []byte, r *kgo.Record) {
	rec := &kgo.Record{
		Topic:     t.rt.cfg.RepartitionTopic(),
		Partition: owner,
		Key:       bytes.Clone(key),
		Value:     r.Value,
		Headers: []kgo.RecordHeader{
			{Key: sales.SourcePartitionHeader, Value: binary.BigEndian.AppendUint32(nil, uint32(r.Partition))},
			{Key: sales.SourceOffsetHeader, Value: binary.BigEndian.AppendUint64(nil, uint64(r.Offset))},
			{Key: sales.SourceTopicIDHeader, Value: append([]byte(nil), t.rt.topo.inputID[:]...)},
		},
	}
	t.outbox = append(t.outbox, rec)
	t.stats.forwarded.Add(1)
}

// sourceOf reads a forwarded record's input coordinates: partition, offset
// and the input topic's id (the current one for records forwarded before the
// id was carried).
func (t *task) sourceOf(r *kgo.Record) (int32, int64, [16]byte, bool) {
	var p, o []byte
	id := t.rt.topo.inputID
	for _, h := range r.Headers {
		switch h.Key {
		case sales.SourcePartitionHeader:
			p = h.Value
		case sales.SourceOffsetHeader:
			o = h.Value
		case sales.SourceTopicIDHeader:
			if len(h.Value) == 16 {
				id = [16]byte(h.Value)
			}
		}
	}
	if len(p) != 4 || len(o) != 8 {
		return 0, 0, id, false
	}
	return int32(binary.BigEndian.Uint32(p)), int64(binary.BigEndian.Uint64(o)), id, true
}

// produce sends rec with promise, a callback made by t.promise.
func (t *task) produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	t.pending.Add(1)
	t.rt.client.Produce(ctx, rec, promise)
}

// promise returns the produce callback of the task's records: failures are
// kept for the next flush to report; a success is counted and, when max is
// not nil, raises max to the record's offset. Made once per flush (or once
// per task), not per record.
func (t *task) promise(max *atomic.Int64) func(*kgo.Record, error) {
	return func(r *kgo.Record, err error) {
		defer t.pending.Done()
		if err != nil {
			err = fmt.Errorf("producing to %s-%d: %w", r.Topic, r.Partition, err)
			t.produceErr.CompareAndSwap(nil, &err)
			return
		}
		t.rt.metrics.produced[t.rt.producedKind(r.Topic)].Add(1)
		for max != nil {
			cur := max.Load()
			if r.Offset <= cur || max.CompareAndSwap(cur, r.Offset) {
				return
			}
		}
	}
}

// produceDirty produces the changed totals to the changelog, each with the
// input offsets it reflects, and the notifications of those at or above the
// threshold. It returns the store updates and the highest changelog offset
// acknowledged so far (final once t.pending is done).
//
// The cycle's records, headers and bytes come from three allocations, not
// six per product: they live until the last record's callback, and the
// updates keep only the product strings (the map's keys).
func (t *task) produceDirty(ctx context.Context) ([]state.Update, *atomic.Int64) {
	cl := t.rt.cfg.ChangelogTopic()
	threshold := t.rt.cfg.NotificationThreshold
	n, notes, size := len(t.dirty), 0, 0
	for key, e := range t.dirty {
		size += len(key) + 8 + e.Offsets.EncodedLen()
		if sales.Notify(e.Total, threshold) {
			notes++
			size += len(key) + 40 // {"sku":key,"value":total}
		}
	}
	recs := make([]kgo.Record, n+notes)
	headers := make([]kgo.RecordHeader, n)
	buf := make([]byte, 0, size)
	updates := make([]state.Update, 0, n)
	maxOffset := new(atomic.Int64)
	maxOffset.Store(-1)
	onChangelog := t.promise(maxOffset)
	i, j := 0, 0
	for key, e := range t.dirty {
		// Each field is appended to buf and taken capacity-limited, so
		// nothing appended later can reach it.
		at := len(buf)
		buf = append(buf, key...)
		k := buf[at:len(buf):len(buf)]
		at = len(buf)
		buf = sales.AppendTotal(buf, e.Total)
		total := buf[at:len(buf):len(buf)]
		at = len(buf)
		buf = e.Offsets.AppendEncode(buf)
		headers[i] = kgo.RecordHeader{Key: sales.OffsetsHeader, Value: buf[at:len(buf):len(buf)]}
		rec := &recs[i]
		*rec = kgo.Record{Topic: cl, Partition: t.partition, Key: k, Value: total, Headers: headers[i : i+1 : i+1]}
		t.produce(ctx, rec, onChangelog)
		if sales.Notify(e.Total, threshold) {
			at = len(buf)
			buf = sales.AppendNotification(buf, key, e.Total)
			note := &recs[n+j]
			j++
			*note = kgo.Record{
				Topic:     t.rt.cfg.NotificationTopic,
				Partition: sales.Partition(k, t.rt.topo.notificationPartitions),
				Key:       k,
				Value:     buf[at:len(buf):len(buf)],
			}
			t.produce(ctx, note, t.plain)
		}
		updates = append(updates, state.Update{Product: key, Entry: *e})
		i++
	}
	for _, rec := range t.outbox {
		t.produce(ctx, rec, t.plain)
	}
	t.cycleRecords = len(recs) + len(t.outbox)
	t.dropDirty()
	return updates, maxOffset
}

// dropDirty empties the dirty map (reusing its entries' memory) and the
// outbox.
func (t *task) dropDirty() {
	clear(t.dirty)
	t.arena.reset()
	clear(t.outbox)
	t.outbox = t.outbox[:0]
}

// apply writes updates with the checkpoint that follows them: the changelog
// offset after maxOffset, and the input position. It first checks that the
// store can take the write (see state.Dir.CheckWritable): Pebble treats a
// failed log write as fatal to the process.
func (t *task) apply(updates []state.Update, maxOffset, inputNext int64) error {
	if len(updates) == 0 && (inputNext < 0 || inputNext == t.cp.InputOffset) {
		// Nothing to write (duplicates only, or an idle cycle): let go of
		// the lookups' view of the store.
		if st := t.store.Load(); st != nil {
			return st.ReleaseLookup()
		}
		return nil
	}
	if err := t.rt.checkWritable(t.partition); errors.Is(err, state.ErrNoFileDescriptors) {
		// The check needs a file descriptor; the write does not: go on, and
		// say what is short.
		if ok, suppressed := t.fdLog.allow(time.Now()); ok {
			t.log.Warn(fmt.Sprintf("task [%s] The process is out of file descriptors (RLIMIT_NOFILE): the store's space was not checked before this write; raise the limit or lower http.max.connections", t.name),
				zap.Int64("suppressed", suppressed), zap.Error(err))
		}
	} else if err != nil {
		return err
	}
	cp := t.cp
	if maxOffset >= 0 {
		cp.ChangelogOffset = max(cp.ChangelogOffset, maxOffset+1)
	}
	if inputNext >= 0 {
		cp.InputOffset = inputNext
	}
	if err := t.store.Load().Apply(updates, cp); err != nil {
		return err
	}
	for _, u := range updates {
		t.cache.put(u.Product, u.Entry)
	}
	t.cp = cp
	t.stats.checkpoint.Store(cp.ChangelogOffset)
	return nil
}

// flush runs the at-least-once commit cycle described in the package
// documentation.
func (t *task) flush(ctx context.Context) error {
	if len(t.dirty) > 0 || len(t.outbox) > 0 {
		// A member that lost the task (paused past its session timeout, a
		// zombie) must not write what its new owner writes: check with the
		// group coordinator first, at most once a second while it does not
		// confirm. Until it does, nothing of the cycle is written: the
		// changes are kept for the next try (if the task was lost,
		// franz-go's loss stops it and drops them meanwhile; if the
		// generation only moved on, as in a cooperative rebalance that
		// keeps the task here, they are flushed then, and nothing is lost),
		// and past maxDirty the task pauses its partitions so that they stay
		// bounded. The refusal shows in the task's status.
		if !t.memberUnknownAt.IsZero() && time.Since(t.memberUnknownAt) < time.Second {
			return nil
		}
		if err := t.rt.checkMembership(ctx); err != nil {
			t.memberUnknownAt = time.Now()
			t.memberRefused = true
			t.trouble.fail(err)
			msg := fmt.Sprintf("task [%s] Not flushing: the group coordinator did not confirm this member owns the task; nothing of the cycle is written, retrying", t.name)
			if errors.Is(err, errNotMember) {
				msg = fmt.Sprintf("task [%s] Not flushing: the group coordinator says this member is not in its generation; nothing of the cycle is written, retrying", t.name)
			}
			if ok, suppressed := t.memberLog.allow(time.Now()); ok {
				t.log.Warn(msg, zap.Int("products", len(t.dirty)), zap.Int("records", len(t.outbox)), zap.Int64("suppressed", suppressed), zap.Error(err))
			}
			if !t.memberPaused && len(t.dirty)+len(t.outbox) >= maxDirty {
				t.memberPaused = true
				t.rt.client.PauseFetchPartitions(t.rt.topicsOf([]int32{t.partition}))
			}
			return nil
		}
		t.memberUnknownAt = time.Time{}
		if t.memberRefused {
			t.memberRefused = false
			t.trouble.clear()
		}
	}
	if t.memberPaused {
		t.memberPaused = false
		if t.resumeAt.IsZero() {
			t.rt.client.ResumeFetchPartitions(t.rt.topicsOf([]int32{t.partition}))
		}
	}
	began := time.Now()
	t.rt.crashPoint("flush-start")
	updates, maxOffset := t.produceDirty(ctx)
	t.rt.crashPoint("changelog-produced")
	t.pending.Wait()
	if err := ctx.Err(); err != nil {
		// Past the shutdown grace period: what was produced may be partial;
		// the store and offsets stay behind, and the next start restores the
		// changelog tail and skips what it already reflects.
		return fmt.Errorf("flushing task %s: %w", t.name, err)
	}
	if errp := t.produceErr.Swap(nil); errp != nil {
		// Nothing of this cycle is written to the store or committed: fold
		// it again from the last committed offsets, after a backoff.
		t.log.Warn(fmt.Sprintf("task [%s] A record of the commit cycle failed to produce; nothing of the cycle is committed", t.name), zap.Error(*errp))
		t.rewind(*errp, "folding its input again from the last committed offsets")
		return nil
	}
	t.rt.crashPoint("changelog-flushed")
	b := stalledBatch{updates: updates, maxOffset: maxOffset.Load(), inputNext: t.inputNext, repartNext: t.repartNext, report: true}
	if err := t.apply(updates, b.maxOffset, b.inputNext); err != nil {
		// The input offsets are not reported: nothing is committed past
		// what the store holds.
		return t.stall(b, err)
	}
	t.rt.crashPoint("store-written")
	t.reportOffsets(b)
	t.produced()
	if len(updates) > 0 {
		t.rt.metrics.commitSeconds.Observe(time.Since(began).Seconds())
	}
	return nil
}

// Backoff between attempts of a cycle whose records failed to produce.
const (
	produceBackoff    = time.Second
	produceBackoffMax = 30 * time.Second
)

// cycleFailed records a cycle that committed nothing because a record
// failed to produce: the failure shows in the
// task's status (and past task.timeout.ms in /healthz), the task pauses its
// partitions for a backoff, and it logs (rate limited) what happens next.
func (t *task) cycleFailed(err error, next string) {
	attempts, since := t.trouble.fail(err)
	t.rt.metrics.produceFailures.Add(1)
	t.backoff = min(max(2*t.backoff, produceBackoff), produceBackoffMax)
	if t.resumeAt.IsZero() {
		t.rt.client.PauseFetchPartitions(t.rt.topicsOf([]int32{t.partition}))
	}
	t.resumeAt = time.Now().Add(t.backoff)
	if ok, suppressed := t.produceLog.allow(time.Now()); ok {
		msg := fmt.Sprintf("task [%s] The commit cycle committed nothing: %s, in %s", t.name, next, t.backoff)
		if failing := time.Since(since); failing > t.rt.cfg.TaskTimeout {
			t.log.Error(msg+fmt.Sprintf(" (failing for %s: the process reports itself unhealthy)", failing.Round(time.Second)),
				zap.Int("attempt", attempts), zap.Int64("suppressed", suppressed), zap.Error(err))
		} else {
			t.log.Warn(msg, zap.Int("attempt", attempts), zap.Int64("suppressed", suppressed), zap.Error(err))
		}
	}
}

// produced records a cycle whose records were all produced: once one with
// records succeeds after failures, the task is out of trouble.
func (t *task) produced() {
	if t.backoff > 0 && t.cycleRecords > 0 && t.resumeAt.IsZero() {
		t.backoff = 0
		t.trouble.clear()
	}
}

// rewind (at-least-once) makes the task fold its input again from the
// offsets it last reported for commit (or the first it read), after a cycle
// whose records failed to produce: the cycle's changes are dropped
// (the store never had them), the batches dispatched since are dropped as
// they arrive, the poll loop moves the partitions' position back
// (applyRewinds), and the task pauses for a backoff.
func (t *task) rewind(err error, next string) {
	t.dropDirty()
	t.inputNext, t.repartNext = t.cp.InputOffset, -1
	t.wantEpoch = t.rewindEpoch.Load() + 1
	t.cycleFailed(err, next)
	t.rt.requestRewind(t)
}

// rewindTo returns the offsets to fold again from, per topic (input,
// repartition; -1: none read).
func (t *task) rewindTo() [2]int64 {
	out := t.first
	for i, r := range t.reported {
		if r >= 0 {
			out[i] = r
		}
	}
	return out
}

func (t *task) reportOffsets(b stalledBatch) {
	if !b.report {
		return
	}
	if b.inputNext >= 0 {
		t.rt.committer.report(t.rt.cfg.InputTopic, t.partition, b.inputNext)
		t.reported[0] = b.inputNext
	}
	if b.repartNext >= 0 {
		t.rt.committer.report(t.rt.cfg.RepartitionTopic(), t.partition, b.repartNext)
		t.reported[1] = b.repartNext
	}
}

// stalledBatch is a batch the store could not take, kept to write later.
type stalledBatch struct {
	updates               []state.Update
	maxOffset             int64
	inputNext, repartNext int64
	report                bool // at-least-once: report the offsets once written
}

// stall handles a store that cannot take a write (disk full, read-only):
// the task pauses its partitions, reads nothing, is not ready, and checks
// every second; the batch is written once the store can take it. Other
// errors are returned.
func (t *task) stall(b stalledBatch, err error) error {
	if !errors.Is(err, state.ErrUnwritable) {
		return err
	}
	t.stalled = &b
	t.setState(TaskStalled)
	t.rt.client.PauseFetchPartitions(t.rt.topicsOf([]int32{t.partition}))
	t.log.Error(fmt.Sprintf("task [%s] Cannot write its store; stopped processing until it can", t.name), zap.Error(err))
	return nil
}

// retryStalled writes the stalled batch if the store can take it now.
func (t *task) retryStalled(ctx context.Context) error {
	b := *t.stalled
	if err := t.apply(b.updates, b.maxOffset, b.inputNext); err != nil {
		if !errors.Is(err, state.ErrUnwritable) {
			return err
		}
		if ok, suppressed := t.retryLog.allow(time.Now()); ok {
			t.log.Warn(fmt.Sprintf("task [%s] Store still cannot be written", t.name), zap.Int64("suppressed", suppressed), zap.Error(err))
		}
		return nil
	}
	t.stalled = nil
	t.setState(TaskRunning)
	t.reportOffsets(b)
	t.log.Info(fmt.Sprintf("task [%s] Store writable again; processing resumes", t.name), zap.Int("held_batches", len(t.held)))
	held := t.held
	t.held = nil
	for i, hb := range held {
		if err := t.processBatch(ctx, hb); err != nil {
			return err
		}
		if t.stalled != nil {
			// Stalled again while catching up: hold the rest, stay paused.
			t.held = append(t.held, held[i+1:]...)
			return nil
		}
	}
	t.rt.client.ResumeFetchPartitions(t.rt.topicsOf([]int32{t.partition}))
	return nil
}

// badEvent counts, logs (rate limited) and, when a dead-letter topic is
// configured, dead-letters a bad event: the record as read, with headers
// naming where it came from and why it was rejected, cut to
// dlq.max.record.bytes (see deadLetter). The copy is produced with the
// cycle: acknowledged before the input offset is committed (or in the same
// transaction), so no bad event is lost.
func (t *task) badEvent(ctx context.Context, topic string, r *kgo.Record, err error, reason string) {
	t.stats.bad.Add(1)
	t.stats.badReasons.add(reason)
	t.rt.badEvents.Add(1)
	if dlq := t.rt.cfg.DLQTopic; dlq != "" {
		rec := deadLetter(topic, r, err, reason, int(t.rt.cfg.DLQMaxRecordBytes))
		rec.Topic, rec.Partition = dlq, r.Partition%t.rt.topo.dlqPartitions
		t.outbox = append(t.outbox, rec)
	}
	if ok, suppressed := t.badLog.allow(time.Now()); ok {
		t.log.Warn("Skipping bad event",
			zap.String("topic", topic),
			zap.Int64("offset", r.Offset),
			zap.String("reason", reason),
			zap.Int64("suppressed", suppressed),
			zap.Error(err))
	}
}

// rateLimiter lets burst events through per period and counts the rest.
type rateLimiter struct {
	every      time.Duration
	burst      int
	windowFrom time.Time
	inWindow   int
	suppressed int64
}

// allow reports whether to log now, and how many were suppressed since the
// last one logged.
func (l *rateLimiter) allow(now time.Time) (bool, int64) {
	if now.Sub(l.windowFrom) >= l.every {
		l.windowFrom, l.inWindow = now, 0
	}
	if l.inWindow >= l.burst {
		l.suppressed++
		return false, 0
	}
	l.inWindow++
	s := l.suppressed
	l.suppressed = 0
	return true, s
}
