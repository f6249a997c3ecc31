package stream

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// maxDirty bounds what a task keeps changed in memory between commits
// (products, windows and records to produce, see changed); past it the
// task flushes early (at-least-once) or asks the poll loop for the
// transaction cycle now (exactly-once; what is folded until that cycle
// prepares adds at most the task's inbox).
const maxDirty = 100_000

// dirtyBound is the task's maxDirty (Knobs.maxDirty lowers it in tests).
func (t *task) dirtyBound() int { return cmp.Or(t.deps.env.knobs.maxDirty, maxDirty) }

// changed is what the task keeps changed in memory between commits: the
// totals' products, each size's windows and the records waiting to be
// produced.
func (t *task) changed() int {
	n := len(t.totals.dirty) + len(t.out.outbox)
	for _, w := range t.windows {
		n += len(w.dirty)
	}
	return n
}

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

// task owns one partition: its goroutine, its inbox and its store. The
// sub-structs group its fields by concern; what they hold is owned by the
// task goroutine unless their comment says otherwise (the atomics and
// trouble are read by status queries).
type task struct {
	deps      taskDeps
	partition int32
	name      string
	log       *zap.Logger
	life      lifecycle
	mail      mailboxes
	// totals is the task's aggregation: the products' totals, their store
	// and the folding of events into them (aggregation.go).
	totals aggregation
	// windows are the task's windowed totals, one per window size
	// (window.go), in the totals' store.
	windows  []*windowAgg
	in       inputState
	out      outputs
	stall    stallState
	retry    retryState
	stats    taskStats
	trouble  trouble
	handover handover
}

// taskDeps are what a task is given by the group session that starts it:
// the process's env, the session's topology and client, and the session's
// answers to what a task asks of it.
type taskDeps struct {
	env    *env
	topo   topology
	client *kgo.Client
	// committer takes the input offsets an at-least-once cycle made safe
	// to commit (nil exactly-once).
	committer *committer
	// member asks the group coordinator whether this member is in the
	// generation it knows (at-least-once, before a cycle writes).
	member func(context.Context) error
	// rewind asks the poll loop to move the task's partitions back to the
	// offsets it folds again from (at-least-once).
	rewind func(*task)
	// gate returns the context the task's records are produced with, done
	// once the group lease that lets the task write has passed (see
	// produceGate; at-least-once, nil exactly-once: transactions fence).
	gate func(now time.Time) context.Context
	// commitNow asks the exactly-once poll loop for the cycle at once.
	commitNow func()
	// settle waits, before a restore, until no exactly-once cycle of this
	// process is deciding a transaction (nil at-least-once).
	settle func(context.Context, *task) error
	// restored tells the session the task's restore ended.
	restored func(*task)
	// cameFrom names the member the task ran on before this one ("" when
	// unknown), for the log.
	cameFrom func(p int32) string
}

// mailboxes are what the poll loop hands the task: batches of records, and
// exactly-once the commit cycle's steps (see eos.go).
type mailboxes struct {
	inbox chan batch
	cycle chan cycleReq
}

// inputState is where the task is in its input and repartition
// partitions, and what it folded of the batch in hand.
type inputState struct {
	// inputNext and repartNext are the next input and repartition offsets
	// to process (-1 before the first record).
	inputNext, repartNext int64
	// reported and first are, per topic (input 0, repartition 1), the last
	// offset reported for commit and the first offset read (-1: none): an
	// at-least-once rewind folds again from them.
	reported, first [2]int64
	// processed counts the events folded of the batch being folded.
	processed int64
	// badLog rate-limits the bad-event warnings, mismatchLog those of
	// events folded under a key their product field disagrees with,
	// windowLog those of events left out of their windows.
	badLog, mismatchLog, windowLog rateLimiter
}

// outputs are the records a cycle produces.
type outputs struct {
	// outbox are the records the cycle produces besides the changelog and
	// notifications: events forwarded to their owner's task, dead-letter
	// copies. Produced with the cycle, after the membership check, so that
	// a member that lost the task writes none of them.
	outbox []*kgo.Record
	// pending counts the records produced and not yet acknowledged.
	pending sync.WaitGroup
	// cutMu guards cut, and is held across each produce call, so that a
	// cut (cutoff.go) waits for a produce in progress.
	cutMu sync.Mutex
	// cut is set when the task was dropped without committing: what it
	// produces from then on fails with errCutOff.
	cut bool
	// plain is the produce callback of records other than the changelog's.
	plain func(*kgo.Record, error)
	// produceErr is the first failure of a produced record (set by the
	// produce callbacks, from any goroutine).
	produceErr atomic.Pointer[error]
	// prepared is the exactly-once cycle's batch, produced in the open
	// transaction and written to the store only once it commits.
	prepared *preparedBatch
	// cycleRecords are the records the last cycle produced.
	cycleRecords int
	// fdLog rate-limits the warning about a write whose check found the
	// process out of file descriptors.
	fdLog rateLimiter
}

// stallState is a store that cannot take writes (see stall).
type stallState struct {
	// batch is the batch the store could not take, nil while it can.
	batch *stalledBatch
	// held are batches read from the inbox while stalled (at-least-once),
	// processed once the store takes writes again: a stalled task keeps
	// reading its inbox so that the poll loop never blocks on it. Bounded:
	// the task's partitions are paused while it is stalled.
	held     []batch
	retryLog rateLimiter
}

// retryState is a cycle that committed nothing, retried after a backoff,
// and the at-least-once membership check.
type retryState struct {
	// wantEpoch is the rewind epoch the task waits for: batches dispatched
	// before the poll loop moved the position are dropped.
	wantEpoch int64
	// rewindEpoch is the epoch the poll loop stamps this task's batches
	// with; it adds one after each rewind it applies (poll loop, atomic).
	rewindEpoch atomic.Int64
	// backoff is the wait before the next attempt; resumeAt when the
	// task's partitions, paused after a failure, are resumed (zero: not
	// paused).
	backoff    time.Duration
	resumeAt   time.Time
	produceLog rateLimiter
	// memberUnknownAt is when the membership check last failed (zero: it
	// passed), memberPaused whether the task paused its partitions
	// meanwhile (its changed products reached maxDirty), memberRefused
	// whether its trouble is to clear.
	memberLog       rateLimiter
	memberUnknownAt time.Time
	memberPaused    bool
	memberRefused   bool
}

// handover is the standby copy this task takes over.
type handover struct {
	// after are the done channels of the tasks and copies still closing
	// the store here when the task started; the restore opens the store
	// once they are all closed.
	after []<-chan struct{}
	// from is the latest of those copies (nil: none), for its position.
	from *standby
	// at is the changelog offset the copy had reached (-1: none), applied
	// the records it applied since it started (its catch-up), for the log.
	at, applied int64
}

// trouble is what keeps a task from making progress: a wait it cannot
// shorten (for stable offsets, for the changelog's bounds), or a failure it
// retries with backoff (a restore that errors, a cycle whose records could
// not be produced). Written by the task goroutine, read by status queries.
type trouble struct {
	mu sync.Mutex // guards waiting, err, attempts, since and began
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

// waitWithin records a wait that begins inside another one (a read the
// outer wait repeats fails) and returns the outer wait's label for endWithin:
// the outer wait keeps its start.
func (tr *trouble) waitWithin(what string, expected time.Duration) (outer string) {
	tr.mu.Lock()
	outer = tr.waiting
	tr.mu.Unlock()
	if outer != "" {
		what = outer + "; meanwhile " + what
	}
	tr.wait(what, expected)
	return outer
}

// endWithin ends a wait begun by waitWithin: the outer wait is shown again
// with its start, or, when there was none, the trouble is cleared.
func (tr *trouble) endWithin(outer string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if outer != "" && tr.err == "" {
		tr.waiting = outer
		return
	}
	if tr.err == "" {
		tr.waiting, tr.attempts = "", 0
		tr.since, tr.began = time.Time{}, time.Time{}
	}
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
	// keyMismatches counts the events folded under a record key their
	// product field disagrees with (see keyMismatch).
	keyMismatches atomic.Int64
}

func newTask(deps taskDeps, partition int32) *task {
	t := &task{
		deps:      deps,
		partition: partition,
		name:      state.TaskName(partition),
		life:      newLifecycle(),
		mail:      mailboxes{inbox: make(chan batch, inboxDepth), cycle: make(chan cycleReq)},
		totals:    newAggregation(deps.env.cfg.ChangelogTopic(), deps.env.cacheBytesPerTask(deps.topo.partitions)),
		in: inputState{
			inputNext: -1, repartNext: -1,
			reported: [2]int64{-1, -1}, first: [2]int64{-1, -1},
			badLog:      rateLimiter{every: 10 * time.Second, burst: 5},
			mismatchLog: rateLimiter{every: 10 * time.Second, burst: 5},
		},
		out:   outputs{fdLog: rateLimiter{every: 30 * time.Second, burst: 1}},
		stall: stallState{retryLog: rateLimiter{every: 30 * time.Second, burst: 1}},
		retry: retryState{
			produceLog: rateLimiter{every: 10 * time.Second, burst: 3},
			memberLog:  rateLimiter{every: 10 * time.Second, burst: 1},
		},
		handover: handover{at: -1},
	}
	t.log = deps.env.log.With(zap.String("task", t.name), zap.Int32("partition", partition))
	final := deps.env.cfg.Windows.Notify == config.WindowNotifyFinal
	for _, w := range windowAggs(deps.env, deps.topo) {
		w.final = final
		t.windows = append(t.windows, w)
	}
	t.in.windowLog = rateLimiter{every: 10 * time.Second, burst: 5}
	t.out.plain = t.promise(nil)
	t.stats.inputPos.Store(-1)
	t.stats.checkpoint.Store(-1)
	return t
}

// requestStop asks the task to stop; it returns at once. A task still
// restoring abandons its restore at its next fetch or store batch.
func (t *task) requestStop(flush bool) { t.life.requestStop(flush) }

// State returns the task's state.
func (t *task) State() taskState { return t.life.get() }

// setState moves the task to s (see taskMoves), logging a move the table
// does not allow (and not making it).
func (t *task) setState(s taskState) {
	if from, ok := t.life.move(s); !ok {
		t.log.Error(fmt.Sprintf("task [%s] Refusing the state change %s -> %s: not an allowed move (a bug)", t.name, from, s))
	}
}

// run is the task goroutine. It restores the store, then processes records
// until told to stop. It returns an error only for a failure that leaves the
// task unable to go on; the runtime then stops.
func (t *task) run(ctx context.Context) (err error) {
	defer close(t.life.done)
	defer func() {
		if err != nil && state.IsCorrupt(err) {
			// The store is closed by now: move it aside so that the next
			// start restores the task from the changelog instead of failing
			// again on the same corruption.
			if to, qerr := t.deps.env.dir.Quarantine(t.partition); qerr == nil {
				err = fmt.Errorf("%w; the store was moved to %s and is restored from the changelog at the next start", err, to)
			}
		}
		if err != nil {
			t.setState(taskFailed)
			t.log.Error("Task failed", zap.Error(err))
		} else {
			t.setState(taskClosed)
		}
	}()
	if !t.restoreUntilStopped(ctx) {
		return nil
	}
	select {
	case <-t.life.quit:
		return t.close(ctx, false, nil)
	default:
	}
	t.startFilter(ctx)
	t.setState(taskRunning)
	t.deps.restored(t)
	return t.loop(ctx)
}

// restoreUntilStopped restores the store, retrying every failure, and
// reports whether it got there: only a stop ends the retries. The restore is
// canceled when the task is stopped, so a revoked task lets go at once,
// however long its restore.
func (t *task) restoreUntilStopped(ctx context.Context) bool {
	t.setState(taskRestoring)
	rctx, cancelRestore := cancelOn(ctx, t.life.quit, nil)
	defer cancelRestore()
	if err := t.restoreRetrying(rctx); err != nil {
		if s := t.totals.store.Swap(nil); s != nil {
			_ = s.Close()
		}
		t.log.Info(fmt.Sprintf("task [%s] Restore canceled: the task was stopped", t.name))
		return false
	}
	return true
}

// storeEmpty reports whether the restored store holds no product: then
// every product it will hold is one the task writes, and the filter knows
// them all.
func (t *task) storeEmpty() bool {
	st := t.totals.store.Load()
	if st == nil {
		return false
	}
	first, err := st.Scan("", 1)
	return err == nil && len(first) == 0
}

// loop is the running task's loop: batches from the poll loop, commit
// cycles (its own ticker at-least-once; the poll loop's requests
// exactly-once), retries of a stalled or paused task, and the stop.
func (t *task) loop(ctx context.Context) error {
	var tick <-chan time.Time
	if !t.deps.env.eos {
		ticker := time.NewTicker(t.deps.env.cfg.CommitInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	// At-least-once, a task that read everything its partitions held
	// flushes once nothing more arrives for commit.idle.ms (exactly-once,
	// the poll loop does the same for the whole transaction).
	idle := newIdleFlush(t.deps.env.cfg.CommitIdle, t.deps.env.cfg.CommitInterval, !t.deps.env.eos)
	defer idle.stop()
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		// A stalled task processes nothing until its store takes writes
		// again; what it still receives is held. A task paused after a
		// failed cycle, or for want of a membership answer, checks every
		// second too.
		var retryC <-chan time.Time
		if t.stall.batch != nil || !t.retry.resumeAt.IsZero() || t.retry.memberPaused {
			retryC = retry.C
		}
		var err error
		select {
		case b := <-t.mail.inbox:
			err = t.receive(ctx, b)
			idle.received(b)
		case <-idle.c():
			idle.fired()
			if t.stall.batch == nil {
				err = t.flush(ctx)
			}
		case <-retryC:
			err = t.retryPaused(ctx)
		case req := <-t.mail.cycle:
			err = t.handleCycle(ctx, req)
			req.done <- err
		case <-tick:
			idle.fired()
			if t.stall.batch == nil {
				err = t.flush(ctx)
			}
		case <-t.totals.building.doneC():
			t.adoptFilter()
		case <-t.life.quit:
			return t.close(ctx, t.life.flushOnStop.Load(), nil)
		case <-ctx.Done():
			return t.close(ctx, false, nil)
		}
		if err != nil {
			// An error of processing fails the task.
			return t.close(ctx, false, err)
		}
	}
}

// receive folds a batch from the poll loop, or holds it while the task is
// stalled. A batch read before a rewind is dropped: it comes again.
func (t *task) receive(ctx context.Context, b batch) error {
	if !t.current(b) {
		return nil
	}
	if t.stall.batch != nil {
		t.stall.held = append(t.stall.held, b)
		return nil
	}
	return t.processBatch(ctx, b)
}

// retryPaused retries what keeps the task from processing: a stalled
// batch, partitions paused after a failed cycle, or a membership check.
func (t *task) retryPaused(ctx context.Context) error {
	if t.stall.batch != nil {
		return t.retryStalled(ctx)
	}
	if !t.retry.resumeAt.IsZero() && time.Now().After(t.retry.resumeAt) {
		t.retry.resumeAt = time.Time{}
		t.deps.client.ResumeFetchPartitions(t.deps.env.topicsOf([]int32{t.partition}))
	}
	if t.retry.memberPaused && !t.deps.env.eos {
		return t.flush(ctx)
	}
	return nil
}

// close drains what the poll loop already handed over, flushes when asked,
// and closes the store.
func (t *task) close(ctx context.Context, flush bool, cause error) error {
	t.setState(taskStopping)
	var errs []error
	if cause != nil {
		errs = append(errs, cause)
	}
	if flush && cause == nil && !t.deps.env.eos && t.stall.batch == nil {
		// An early flush of the drain (maxDirty) that the store refuses
		// stalls the task: its cycle is in the changelog, not in the store,
		// so a batch folded after it would count its products without that
		// cycle's events, and a flush would write them and report offsets
		// past it. The drain ends there and nothing more is flushed: the
		// rest is read again from the offsets reported, and the changelog
		// restores the stalled cycle.
	drain:
		for t.stall.batch == nil {
			select {
			case b := <-t.mail.inbox:
				if err := t.processBatch(ctx, b); err != nil {
					errs = append(errs, err)
					break drain
				}
			default:
				break drain
			}
		}
		if len(errs) == 0 && t.stall.batch == nil {
			errs = append(errs, t.flush(ctx))
		}
	}
	// Wait for every record produced for this task, whatever happens to
	// them, so no callback outlives the task, and for the listing of the
	// store's products, which pins the store.
	t.out.pending.Wait()
	t.totals.building.stop()
	if s := t.totals.store.Load(); s != nil {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// current reports whether b was dispatched since the task's last rewind
// (see task.rewind). A batch read before it is of a position the poll loop
// moves back from: its records come again, and folding it would report
// offsets past the cycle that failed, whose events are then neither in the
// store nor read again. A rewind can happen between any two batches (a
// flush past maxDirty), so processBatch asks it of every batch it is given,
// whichever path hands it over: the loop, the drain of a stop, the catch-up
// of a stalled task, the exactly-once prepare.
func (t *task) current(b batch) bool { return b.epoch >= t.retry.wantEpoch }

// processBatch folds b, unless it is from before the task's last rewind,
// and flushes early past maxDirty.
func (t *task) processBatch(ctx context.Context, b batch) error {
	if !t.current(b) {
		return nil
	}
	if b.topic == t.deps.env.cfg.InputTopic && b.hwm >= 0 {
		t.stats.inputHWM.Store(b.hwm)
	}
	for _, r := range b.recs {
		if err := t.process(ctx, b.topic, r); err != nil {
			return err
		}
	}
	// The status's counters move once a batch, not once an event.
	t.deps.env.metrics.records.Add(int64(len(b.recs)))
	t.stats.processed.Add(t.in.processed)
	t.in.processed = 0
	if b.topic == t.deps.env.cfg.InputTopic {
		t.stats.inputPos.Store(t.in.inputNext)
	}
	if t.changed() >= t.dirtyBound() {
		if t.deps.env.eos {
			// The poll loop runs the transaction cycle at its next turn.
			t.deps.commitNow()
			return nil
		}
		return t.flush(ctx)
	}
	return nil
}

// process folds one record. Bad events are counted, logged and skipped.
func (t *task) process(ctx context.Context, topic string, r *kgo.Record) error {
	if r.Attrs.IsControl() {
		// A transaction marker: the position passes it, so that the
		// committed offset reaches the partition's end (a consumer group
		// shows lag 0, not 1, after a transaction); nothing is folded.
		if topic == t.deps.env.cfg.InputTopic {
			t.in.inputNext = r.Offset + 1
		} else {
			t.in.repartNext = r.Offset + 1
		}
		return nil
	}
	srcPart, srcOff, srcTopic := r.Partition, r.Offset, t.deps.topo.inputID
	if topic == t.deps.env.cfg.InputTopic {
		if t.in.first[0] < 0 {
			t.in.first[0] = r.Offset
		}
		t.in.inputNext = r.Offset + 1
	} else {
		if t.in.first[1] < 0 {
			t.in.first[1] = r.Offset
		}
		t.in.repartNext = r.Offset + 1
		var ok bool
		if srcPart, srcOff, srcTopic, ok = t.sourceOf(r); !ok {
			if !t.deps.env.cfg.ForwardsAmounts() {
				t.badEvent(ctx, topic, r, errors.New("forwarded record without source headers"), reasonBadForward)
				return nil
			}
			// Forwarded by a Kafka Streams instance of the group: no
			// coordinates to recognise a redelivery by, none recorded.
			srcPart, srcOff = -1, -1
		}
	}
	var (
		key      []byte
		value    int64
		mismatch bool
		err      error
	)
	if topic != t.deps.env.cfg.InputTopic && t.deps.env.cfg.ForwardsAmounts() {
		key, value, err = sales.DecodeAmount(r.Key, r.Value)
	} else {
		key, value, mismatch, err = sales.DecodeKey(r.Key, r.Value)
	}
	if err != nil {
		t.badEvent(ctx, topic, r, err, sales.Reason(err))
		return nil
	}
	if topic == t.deps.env.cfg.InputTopic {
		if owner := sales.Partition(key, t.deps.topo.partitions); owner != t.partition {
			if mismatch && t.deps.env.cfg.ForwardsAmounts() {
				// The owner reads the amount alone: the warning is here.
				t.keyMismatch(topic, r)
			}
			t.forward(ctx, owner, key, value, r)
			return nil
		}
	}
	// An event forwarded from an input topic since recreated counts, but
	// recording its offset would drop the product's offsets of the current
	// topic and let their redeliveries count twice.
	var zero [16]byte
	src := source{topic: srcTopic, partition: srcPart, offset: srcOff,
		record: srcPart >= 0 && (srcTopic == t.deps.topo.inputID || srcTopic == zero || t.deps.topo.inputID == zero)}
	dup, bad, err := t.totals.fold(key, value, src)
	switch {
	case err != nil:
		return err
	case bad != nil:
		t.badEvent(ctx, topic, r, bad, sales.Reason(bad))
		return nil
	}
	// Each window keeps its own offsets: it folds an event the totals
	// already reflect when it does not (its changelog record may be the
	// one a crash lost).
	if len(t.windows) > 0 {
		if err := t.foldWindows(ctx, topic, r, key, value, src); err != nil {
			return err
		}
	}
	switch {
	case dup:
		t.stats.duplicates.Add(1)
		return nil
	}
	if mismatch {
		t.keyMismatch(topic, r)
	}
	t.in.processed++
	return nil
}

// forward sends an event to the task owning its product, through the
// repartition topic, with its input coordinates as headers so the owner can
// recognise a redelivery. The value is the event as read, or under the
// streams protocol the amount alone (config.ForwardsAmounts), which Kafka
// Streams instances read too; they ignore the headers.
func (t *task) forward(ctx context.Context, owner int32, key []byte, amount int64, r *kgo.Record) {
	rec := &kgo.Record{
		Topic:     t.deps.env.cfg.RepartitionTopic(),
		Partition: owner,
		Key:       bytes.Clone(key),
		Value:     r.Value,
		// The event's time travels with it: windows go by it.
		Timestamp: r.Timestamp,
		Headers: []kgo.RecordHeader{
			{Key: sales.SourcePartitionHeader, Value: binary.BigEndian.AppendUint32(nil, uint32(r.Partition))},
			{Key: sales.SourceOffsetHeader, Value: binary.BigEndian.AppendUint64(nil, uint64(r.Offset))},
			{Key: sales.SourceTopicIDHeader, Value: append([]byte(nil), t.deps.topo.inputID[:]...)},
		},
	}
	if cfg := &t.deps.env.cfg; cfg.ForwardsAmounts() {
		rec.Value = sales.EncodeTotal(amount)
		// The amount alone carries no time field: the time is read here.
		if len(t.windows) > 0 && cfg.Windows.TimeField != "" {
			if ms, err := sales.EventTime(r.Value, cfg.Windows.TimeField); err != nil {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: sales.BadTimeHeader, Value: []byte(err.Error())})
			} else {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: sales.EventTimeHeader, Value: binary.BigEndian.AppendUint64(nil, uint64(ms))})
			}
		}
	}
	t.out.outbox = append(t.out.outbox, rec)
	t.stats.forwarded.Add(1)
}

// sourceOf reads a forwarded record's input coordinates: partition, offset
// and the input topic's id (the current one for records forwarded before the
// id was carried).
func (t *task) sourceOf(r *kgo.Record) (int32, int64, [16]byte, bool) {
	var p, o []byte
	id := t.deps.topo.inputID
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

// produce sends rec with promise, a callback made by t.promise, and gate
// (at-least-once: the lease's produce gate, taken once per cycle; nil
// exactly-once) as its context, so that the client never writes it once
// the lease has passed.
func (t *task) produce(ctx, gate context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	t.out.pending.Add(1)
	t.out.cutMu.Lock()
	defer t.out.cutMu.Unlock()
	if t.out.cut {
		promise(rec, errCutOff)
		return
	}
	if gate != nil {
		rec.Context = gate
	}
	t.deps.client.Produce(ctx, rec, promise)
}

// promise returns the produce callback of the task's records: failures are
// kept for the next flush to report; a success is counted and, when max is
// not nil, raises max to the record's offset. Made once per flush (or once
// per task), not per record.
func (t *task) promise(max *atomic.Int64) func(*kgo.Record, error) {
	return func(r *kgo.Record, err error) {
		defer t.out.pending.Done()
		if err != nil {
			err = fmt.Errorf("producing to %s-%d: %w", r.Topic, r.Partition, err)
			t.out.produceErr.CompareAndSwap(nil, &err)
			return
		}
		t.deps.env.metrics.produced[t.deps.env.producedKind(r.Topic)].Add(1)
		for max != nil {
			cur := max.Load()
			if r.Offset <= cur || max.CompareAndSwap(cur, r.Offset) {
				return
			}
		}
	}
}

// produceDirty produces the changed totals to the changelog, each with the
// input offsets it reflects, the notifications of those at or above the
// threshold, and the outbox. It returns the store updates and the highest
// changelog offset acknowledged so far (final once t.out.pending is done).
func (t *task) produceDirty(ctx context.Context) ([]state.Update, *atomic.Int64, error) {
	maxOffset := new(atomic.Int64)
	maxOffset.Store(-1)
	onChangelog := t.promise(maxOffset)
	// The gate checks the lease's deadline itself whenever the client
	// asks, so one per cycle serves every record of it.
	var gate context.Context
	if t.deps.gate != nil {
		gate = t.deps.gate(time.Now())
	}
	spec := recordSpec{
		partition:     t.partition,
		threshold:     t.deps.env.cfg.NotificationThreshold,
		notifications: t.deps.env.cfg.NotificationTopic, notificationPartitions: t.deps.topo.notificationPartitions,
	}
	updates, n := t.totals.records(spec, func(rec *kgo.Record, changelog bool) {
		if changelog {
			t.produce(ctx, gate, rec, onChangelog)
		} else {
			t.produce(ctx, gate, rec, t.out.plain)
		}
	})
	st := t.totals.store.Load()
	for _, w := range t.windows {
		wMax := new(atomic.Int64)
		wMax.Store(-1)
		onWindow := t.promise(wMax)
		wn, err := w.records(st, spec, wMax, func(rec *kgo.Record, changelog bool) {
			if changelog {
				t.produce(ctx, gate, rec, onWindow)
			} else {
				t.produce(ctx, gate, rec, t.out.plain)
			}
		})
		if err != nil {
			return nil, nil, err
		}
		n += wn
	}
	for _, rec := range t.out.outbox {
		t.produce(ctx, gate, rec, t.out.plain)
	}
	t.out.cycleRecords = n + len(t.out.outbox)
	t.totals.reset()
	clear(t.out.outbox)
	t.out.outbox = t.out.outbox[:0]
	return updates, maxOffset, nil
}

// dropDirty forgets a cycle that commits nothing: it empties the dirty
// maps (reusing the totals' entries' memory) and the outbox, and the
// windows go back to the store's stream time.
func (t *task) dropDirty() {
	t.totals.reset()
	for _, w := range t.windows {
		w.drop()
	}
	clear(t.out.outbox)
	t.out.outbox = t.out.outbox[:0]
}

// apply writes updates with the checkpoint that follows them: the changelog
// offset after maxOffset, and the input position. It first checks that the
// store can take the write (see state.Dir.CheckWritable): Pebble treats a
// failed log write as fatal to the process.
func (t *task) apply(updates []state.Update, maxOffset, inputNext int64) error {
	defer t.totals.cache.publish()
	st := t.totals.store.Load()
	var ws []state.WindowWrite
	for _, w := range t.windows {
		if ww := w.write(st); ww != nil && (len(ww.Updates) > 0 || ww.ExpireBefore > 0) {
			ws = append(ws, *ww)
		} else {
			w.pending = nil // nothing to write
		}
	}
	if len(updates) == 0 && len(ws) == 0 && (inputNext < 0 || inputNext == t.totals.cp.InputOffset) {
		// Nothing to write (duplicates only, or an idle cycle): let go of
		// the lookups' view of the store.
		if st := t.totals.store.Load(); st != nil {
			return st.ReleaseLookup()
		}
		return nil
	}
	if err := t.deps.env.checkWritable(t.partition); errors.Is(err, state.ErrNoFileDescriptors) {
		// The check needs a file descriptor; the write does not: go on, and
		// say what is short.
		if ok, suppressed := t.out.fdLog.allow(time.Now()); ok {
			t.log.Warn(fmt.Sprintf("task [%s] The process is out of file descriptors (RLIMIT_NOFILE): the store's space was not checked before this write; raise the limit or lower http.max.connections", t.name),
				zap.Int64("suppressed", suppressed), zap.Error(err))
		}
	} else if err != nil {
		return err
	}
	cp := t.totals.cp
	if maxOffset >= 0 {
		cp.ChangelogOffset = max(cp.ChangelogOffset, maxOffset+1)
	}
	if inputNext >= 0 {
		cp.InputOffset = inputNext
	}
	if err := t.totals.write(updates, cp, ws); err != nil {
		return err
	}
	for i := range ws {
		for _, w := range t.windows {
			if w.size == ws[i].Windows.Size() {
				w.written(&ws[i])
			}
		}
	}
	t.stats.checkpoint.Store(cp.ChangelogOffset)
	t.deps.env.metrics.taskCommits.Add(1)
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
	t.deps.env.metrics.produceFailures.Add(1)
	t.retry.backoff = min(max(2*t.retry.backoff, produceBackoff), produceBackoffMax)
	if t.retry.resumeAt.IsZero() {
		t.deps.client.PauseFetchPartitions(t.deps.env.topicsOf([]int32{t.partition}))
	}
	t.retry.resumeAt = time.Now().Add(t.retry.backoff)
	if ok, suppressed := t.retry.produceLog.allow(time.Now()); ok {
		msg := fmt.Sprintf("task [%s] The commit cycle committed nothing: %s, in %s", t.name, next, t.retry.backoff)
		if failing := time.Since(since); failing > t.deps.env.cfg.TaskTimeout {
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
	if t.retry.backoff > 0 && t.out.cycleRecords > 0 && t.retry.resumeAt.IsZero() {
		t.retry.backoff = 0
		t.trouble.clear()
	}
}

func (t *task) reportOffsets(b stalledBatch) {
	if !b.report {
		return
	}
	if b.inputNext >= 0 {
		t.deps.committer.report(t.deps.env.cfg.InputTopic, t.partition, b.inputNext)
		t.in.reported[0] = b.inputNext
	}
	if b.repartNext >= 0 {
		t.deps.committer.report(t.deps.env.cfg.RepartitionTopic(), t.partition, b.repartNext)
		t.in.reported[1] = b.repartNext
	}
}

// stalledBatch is a batch the store could not take, kept to write later.
type stalledBatch struct {
	updates               []state.Update
	maxOffset             int64
	inputNext, repartNext int64
	report                bool // at-least-once: report the offsets once written
}

// stallOn handles a store that cannot take a write (disk full, read-only):
// the task pauses its partitions, reads nothing, is not ready, and checks
// every second; the batch is written once the store can take it. Other
// errors are returned.
func (t *task) stallOn(b stalledBatch, err error) error {
	if !errors.Is(err, state.ErrUnwritable) {
		return err
	}
	if old := t.stall.batch; old != nil {
		// Stalled already: an exactly-once cycle went on meanwhile (with
		// nothing folded, as the stalled task holds its batches). Both
		// are written together; the later update of a product wins.
		b.updates = append(append([]state.Update(nil), old.updates...), b.updates...)
		b.maxOffset = max(b.maxOffset, old.maxOffset)
		if b.inputNext < 0 {
			b.inputNext = old.inputNext
		}
		if b.repartNext < 0 {
			b.repartNext = old.repartNext
		}
		b.report = b.report || old.report
	}
	t.stall.batch = &b
	t.setState(taskStalled)
	t.deps.client.PauseFetchPartitions(t.deps.env.topicsOf([]int32{t.partition}))
	t.log.Error(fmt.Sprintf("task [%s] Cannot write its store; stopped processing until it can", t.name), zap.Error(err))
	return nil
}

// retryStalled writes the stalled batch if the store can take it now.
func (t *task) retryStalled(ctx context.Context) error {
	b := *t.stall.batch
	if err := t.apply(b.updates, b.maxOffset, b.inputNext); err != nil {
		if !errors.Is(err, state.ErrUnwritable) {
			return err
		}
		if ok, suppressed := t.stall.retryLog.allow(time.Now()); ok {
			t.log.Warn(fmt.Sprintf("task [%s] Store still cannot be written", t.name), zap.Int64("suppressed", suppressed), zap.Error(err))
		}
		return nil
	}
	t.stall.batch = nil
	t.setState(taskRunning)
	t.reportOffsets(b)
	t.log.Info(fmt.Sprintf("task [%s] Store writable again; processing resumes", t.name), zap.Int("held_batches", len(t.stall.held)))
	held := t.stall.held
	t.stall.held = nil
	for i, hb := range held {
		if err := t.processBatch(ctx, hb); err != nil {
			return err
		}
		if t.stall.batch != nil {
			// Stalled again while catching up: hold the rest, stay paused.
			t.stall.held = append(t.stall.held, held[i+1:]...)
			return nil
		}
	}
	// The partitions stay paused when an early flush of the catch-up
	// failed (for its backoff: retryPaused resumes them) or was not
	// confirmed by the group coordinator (flush resumes them once it is).
	if t.retry.resumeAt.IsZero() && !t.retry.memberPaused {
		t.deps.client.ResumeFetchPartitions(t.deps.env.topicsOf([]int32{t.partition}))
	}
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
	t.deps.env.badEvents.Add(1)
	if dlq := t.deps.env.cfg.DLQTopic; dlq != "" {
		rec := deadLetter(topic, r, err, reason, int(t.deps.env.cfg.DLQMaxRecordBytes))
		rec.Topic, rec.Partition = dlq, r.Partition%t.deps.topo.dlqPartitions
		t.out.outbox = append(t.out.outbox, rec)
	}
	if ok, suppressed := t.in.badLog.allow(time.Now()); ok {
		t.log.Warn("Skipping bad event",
			zap.String("topic", topic),
			zap.Int64("offset", r.Offset),
			zap.String("reason", reason),
			zap.String("key", snippet(r.Key)),
			zap.String("value", snippet(r.Value)),
			zap.Int("value_bytes", len(r.Value)),
			zap.Int64("suppressed", suppressed),
			zap.Error(err))
	}
}

// snippetBytes is how much of a bad event's key and value its log line
// shows.
const snippetBytes = 80

// snippet is the start of b for a log line, quoted so that control bytes
// and invalid UTF-8 show as escapes, with "…" when cut.
func snippet(b []byte) string {
	if len(b) <= snippetBytes {
		return strconv.QuoteToASCII(string(b))
	}
	return strconv.QuoteToASCII(string(b[:snippetBytes])) + "…"
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
