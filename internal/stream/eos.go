package stream

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
)

// Exactly-once (processing.guarantee=exactly_once_v2)
//
// The poll loop drives one Kafka transaction per commit interval for all
// running tasks, through franz-go's GroupTransactSession (classic) or
// streamsTxn (a streams group, streamstxn.go):
//
//  1. the transaction is begun before any record of the interval is
//     dispatched, so events forwarded to the repartition topic are in it;
//  2. tasks fold what the loop dispatches;
//  3. at the end of the interval every running task drains its inbox and
//     produces its changed totals and notifications (prepare);
//  4. the session flushes and commits the transaction together with the
//     input offsets of everything polled (End);
//  5. each task writes its prepared totals and checkpoint to Pebble if the
//     transaction committed, or drops them if it aborted (finish); on abort
//     the session rewinds the input to the committed offsets, so the events
//     are folded again from the store's state.
//
// The store therefore never holds a total the changelog does not have
// committed; after a crash the restart restores the committed changelog
// tail past the checkpoint (read_committed) and nothing more. A rebalance
// can happen at any time (franz-go's session favours that over blocking it):
// the revoked tasks stop and drop what they folded, and the session aborts
// the open transaction. An instance that lost its partitions while paused
// (a zombie) fails its offset commit and aborts likewise.

type cyclePhase int

const (
	cyclePrepare cyclePhase = iota
	cycleFinish
)

// cycleReq is one step of the exactly-once cycle, answered on done.
type cycleReq struct {
	phase     cyclePhase
	committed bool // for cycleFinish
	// produceErr (cycleFinish) is why the cycle aborted: a record of this
	// task failed to produce.
	produceErr error
	done       chan error
}

// preparedBatch is what a task produced in the open transaction.
type preparedBatch struct {
	updates   []state.Update
	maxOffset *atomic.Int64
	inputNext int64
}

// handleCycle runs a cycle step in the task goroutine.
func (t *task) handleCycle(ctx context.Context, req cycleReq) error {
	switch req.phase {
	case cyclePrepare:
		// The poll loop dispatched everything it polled before asking:
		// fold what is queued, so the offsets End commits are reflected.
		for done := false; !done; {
			select {
			case b := <-t.mail.inbox:
				if err := t.processBatch(ctx, b); err != nil {
					return err
				}
			default:
				done = true
			}
		}
		updates, maxOffset, err := t.produceDirty(ctx)
		if err != nil {
			return fmt.Errorf("preparing the cycle of task %s: %w", t.name, err)
		}
		t.out.prepared = &preparedBatch{updates: updates, maxOffset: maxOffset, inputNext: t.in.inputNext}
		return nil
	case cycleFinish:
		p := t.out.prepared
		t.out.prepared = nil
		t.out.pending.Wait()
		if !req.committed {
			// The transaction aborted: its records are invisible, the input
			// is rewound, and the store still holds the committed state.
			t.out.produceErr.Store(nil)
			t.dropDirty()
			if req.produceErr != nil {
				t.log.Warn(fmt.Sprintf("task [%s] A record of the commit cycle failed to produce; the transaction is aborted", t.name), zap.Error(req.produceErr))
				t.cycleFailed(req.produceErr, "the input is folded again from the committed offsets")
			}
			return nil
		}
		t.produced()
		if errp := t.out.produceErr.Load(); errp != nil {
			return *errp
		}
		if p == nil {
			return nil
		}
		if err := t.apply(p.updates, p.maxOffset.Load(), p.inputNext); err != nil {
			// Committed in Kafka, not yet in the store: the task stalls and
			// writes it once it can (a restart would restore it from the
			// changelog).
			return t.stallOn(stalledBatch{updates: p.updates, maxOffset: p.maxOffset.Load(), inputNext: p.inputNext}, err)
		}
		t.deps.env.crashPoint("store-written")
		return nil
	}
	return fmt.Errorf("unknown cycle phase %d", req.phase)
}

// exactlyOnce is the exactly-once guarantee of a session.
type exactlyOnce struct {
	s   *session
	txn txnSession
	// streams is txn under group.protocol=streams, nil under classic.
	streams *streamsTxn
	// lateErr is the error of a cycle a streams revoke ran (under
	// session.between, outside the poll loop): the poll loop returns it.
	lateErr atomic.Pointer[error]
	// abortCycle makes the cycle in progress abort: records of it found no
	// running task, or a task that had folded into it was stopped outside
	// a revoke callback.
	abortCycle atomic.Bool
	// commitSoon: a task has maxDirty changed products; the poll loop runs
	// the cycle without waiting for the interval. commitNow (buffered 1)
	// wakes the poll loop for it.
	commitSoon atomic.Bool
	commitNow  chan struct{}
	// polled counts the records dispatched in the open transaction;
	// guarded by session.between (the poll loop's, a streams revoke's).
	// A cycle with none has nothing to write and commits nothing (Kafka
	// Streams does the same): no End, no empty transaction.
	polled int
	// cycle holds a token (capacity 1) while transact runs, from before
	// its records are produced until its End is decided; settle waits for
	// it to be free.
	cycle chan struct{}
	// openSince is when the oldest transaction the broker may still hold
	// open began (its first cycle's prepare), zero when none is: set by
	// transact, cleared by an End that succeeded. A fencing after the
	// transaction was open that long is the broker's timeout; one sooner
	// is not (fencing). Written under the cycle token, read by the poll
	// loop between cycles.
	openSince atomic.Pointer[time.Time]
	// endedOpen is how long the last transaction that ended had been open:
	// the client can take an End as done (an abort) while the broker had
	// already aborted the transaction and fenced the producer, and tell
	// it only at the next Begin, which then reports that transaction's
	// fencing.
	endedOpen atomic.Int64
}

func newExactlyOnce(s *session) *exactlyOnce {
	return &exactlyOnce{s: s, commitNow: make(chan struct{}, 1), cycle: make(chan struct{}, 1)}
}

// openFor returns how long the oldest transaction the broker may hold open
// has been open, zero when none is.
func (e *exactlyOnce) openFor() time.Duration {
	if t := e.openSince.Load(); t != nil {
		return time.Since(*t)
	}
	return 0
}

// ended records that the broker's transaction ended: an End or an abort
// succeeded.
func (e *exactlyOnce) ended() {
	e.endedOpen.Store(int64(e.openFor()))
	e.openSince.Store(nil)
}

// fenced wraps err, when it is a fencing, as a fencing of this session's
// producer with the open transaction's age.
func (e *exactlyOnce) fenced(err error) error { return e.fencedAfter(err, e.openFor()) }

// fencedAfter wraps err, when it is a fencing, as a fencing of a
// transaction open for open.
func (e *exactlyOnce) fencedAfter(err error, open time.Duration) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return &fencing{open: open, err: err}
	}
	return err
}

func (e *exactlyOnce) client(opts []kgo.Opt) (*kgo.Client, error) {
	cfg := e.s.env.cfg
	txnID := cfg.ApplicationID + "-" + e.s.env.dir.ProcessID()
	if sg, ok := e.s.proto.(*streamsGroup); ok {
		x, err := newStreamsTxn(sg, opts, txnID, cfg.TransactionTimeout())
		if err != nil {
			return nil, err
		}
		e.txn, e.streams = x, x
	} else {
		txn, err := kgo.NewGroupTransactSession(append(opts, kgo.TransactionalID(txnID), kgo.TransactionTimeout(cfg.TransactionTimeout()))...)
		if err != nil {
			return nil, err
		}
		e.txn = txn
	}
	e.s.env.log.Info("Exactly-once processing: one transaction per commit interval", zap.String("transactional_id", txnID),
		zap.Duration("commit_interval", cfg.CommitInterval))
	return e.txn.Client(), nil
}

func (e *exactlyOnce) taskDeps(d *taskDeps) {
	d.settle = e.settle
	d.commitNow = func() {
		e.commitSoon.Store(true)
		select {
		case e.commitNow <- struct{}{}:
		default:
		}
	}
}

// revoked stops the revoked tasks. Classic: a rebalance can come at any
// time, and the session aborts the open transaction, so their uncommitted
// totals are dropped and their stores hold the committed state. Streams:
// the revoke runs between two polls (under session.between), and the open
// transaction is committed first, as Kafka Streams commits before it lets
// a task go; the next owner starts from its offsets.
func (e *exactlyOnce) revoked(ctx context.Context, _ *kgo.Client, ps []int32) {
	outcome := "revoked; the open transaction is aborted, the store holds the committed state"
	if e.streams != nil {
		outcome = "revoked; committed with the transaction before it"
		if err := e.cycleNow(ctx); err != nil {
			outcome = "revoked; its last transaction failed, the store holds the committed state"
		}
	}
	if err := e.s.stopTasks(ps, false, outcome); err != nil {
		e.s.env.log.Error("Stopping revoked tasks", zap.Error(err))
	}
}

// cycleNow runs the transaction cycle now and begins the next transaction,
// unless the open one has nothing to write; the caller holds
// session.between. An error is the poll loop's to return (lateErr).
func (e *exactlyOnce) cycleNow(ctx context.Context) error {
	if errp := e.lateErr.Load(); errp != nil {
		return *errp
	}
	if e.idle() {
		return nil
	}
	if err := e.runCycle(ctx); err != nil {
		e.lateErr.Store(&err)
		return err
	}
	return nil
}

// runCycle runs the transaction cycle under ctx and begins the next
// transaction; the caller holds session.between and found the open one
// with something to write (idle). A request for an early cycle (commitSoon:
// a task past maxDirty, so that the changed products of one transaction
// stay bounded in memory) is answered by it.
func (e *exactlyOnce) runCycle(ctx context.Context) error {
	e.commitSoon.Store(false)
	if err := e.transact(ctx); err != nil {
		return err
	}
	if err := e.txn.Begin(); err != nil {
		return fmt.Errorf("beginning transaction: %w", e.beginFailed(err))
	}
	e.polled = 0
	return nil
}

// dropped: tasks that folded into the open transaction were stopped.
func (e *exactlyOnce) dropped([]int32) { e.abortCycle.Store(true) }

// replaced needs nothing exactly-once: the dropped tasks abort the open
// transaction, and the abort moves every position back to the committed
// offsets.
func (e *exactlyOnce) replaced([]int32) {}

// stop ends the session's work: the last transaction commits what was
// folded (unless polling ended in an error), then the tasks close.
func (e *exactlyOnce) stop(work context.Context, pollErr error) error {
	var lastErr error
	outcome := "committed with the last transaction"
	// Under between: a streams revoke may run a cycle (cycleNow) until the
	// session is stopping.
	e.s.between.Lock()
	if errp := e.lateErr.Load(); errp != nil && pollErr == nil {
		pollErr, lastErr = *errp, *errp
	}
	switch {
	case errors.Is(pollErr, errSessionFenced):
		outcome = "dropped: the producer was fenced, the store holds the committed state"
	case errors.Is(pollErr, errProducerIDLost):
		outcome = "dropped: the producer has no producer id, the store holds the committed state"
	case pollErr == nil && !e.idle():
		lastErr = e.transact(work)
	}
	e.s.between.Unlock()
	return errors.Join(lastErr, e.s.stopTasks(e.s.reg.partitions(), false, outcome))
}

func (e *exactlyOnce) close() { e.txn.Close() }

// idle reports whether the open transaction has nothing to write: no record
// was dispatched since it began and no task asked for the cycle.
func (e *exactlyOnce) idle() bool {
	return e.polled == 0 && !e.abortCycle.Load() && !e.commitSoon.Load()
}

// pollEOS is the poll loop under exactly-once: it dispatches records to the
// tasks and, every commit interval, runs the transaction cycle for all of
// them. It returns when ctx is done (the caller then runs the last cycle) or
// a task fails.
func (e *exactlyOnce) poll(ctx, work context.Context) error {
	s := e.s
	// The producer id is asked for now, not at the first transaction:
	// asking ends a transaction this process left open or committing when
	// it was killed, which every task's restore waits for
	// (waitSettledChangelog).
	s.goroutine(func() { _, _, _ = e.txn.Client().ProducerID(ctx) })
	s.between.Lock()
	err := e.txn.Begin()
	s.between.Unlock()
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", e.beginFailed(err))
	}
	next := time.Now().Add(s.env.cfg.CommitInterval)
	idle := s.env.cfg.CommitIdle
	if idle >= s.env.cfg.CommitInterval {
		idle = 0 // the interval's cycle comes first
	}
	var lastRecords time.Time // when the last poll with records returned
	ends := newInputEnds(s.env.cfg.CommitInterval)
	for {
		var polled uint64
		if e.streams != nil {
			polled = e.streams.polling()
		}
		// The poll waits until the interval ends or, with records in the
		// open transaction and the input at its end, until it paused for
		// commit.idle.ms: then the cycle runs at once. A task past maxDirty
		// cuts it short too.
		until := next
		paused := idle > 0 && e.polled > 0 && ends.atEnd(time.Now())
		if paused {
			until = minTime(until, lastRecords.Add(idle))
		}
		dctx, dcancel := context.WithDeadline(ctx, until)
		pctx, pcancel := cancelOn(dctx, e.commitNow, func() { e.commitSoon.Store(true) })
		fetches := e.txn.PollRecords(pctx, 10_000)
		pcancel()
		dcancel()
		if fetches.NumRecords() > 0 {
			lastRecords = time.Now()
			ends.polled(fetches, lastRecords)
		} else if paused && !time.Now().Before(lastRecords.Add(idle)) {
			e.commitSoon.Store(true)
		}
		if s.env.knobs.AfterPoll != nil {
			s.env.knobs.AfterPoll(fetches.NumRecords())
		}
		if fetches.IsClientClosed() {
			return nil
		}
		// The hand-out and the cycle run between two polls: a streams
		// group applies its assignments in between (session.between).
		s.between.Lock()
		stop, err := e.handOut(ctx, work, fetches, polled, &next)
		s.between.Unlock()
		if stop || err != nil {
			return err
		}
	}
}

// handOut hands the polled records to the tasks and, when the interval is
// over or a task asked, runs the cycle and begins the next transaction; the
// caller holds session.between. polled is the streams transaction's
// generation when the poll began (see streamsTxn.gone). stop: ctx ended.
func (e *exactlyOnce) handOut(ctx, work context.Context, fetches kgo.Fetches, polled uint64, next *time.Time) (stop bool, err error) {
	s := e.s
	if errp := e.lateErr.Load(); errp != nil {
		return true, *errp
	}
	var skip map[int32]bool
	if e.streams != nil {
		skip = e.streams.gone(fetches, polled)
	}
	// Every polled record must reach its task, even when ctx ended
	// during the poll: the transaction commits the offsets of all of
	// them (Run's last cycle does on shutdown). Hence the work context.
	// Records that found no running task make the cycle abort.
	if dropped, _ := s.dispatch(work, fetches, skip); dropped {
		e.abortCycle.Store(true)
	}
	if e.streams != nil {
		e.streams.handedOut(fetches, skip)
	}
	e.polled += fetches.NumRecords()
	if ctx.Err() != nil {
		return true, nil
	}
	if time.Now().Before(*next) && !e.commitSoon.Load() {
		return false, nil
	}
	if e.idle() {
		*next = time.Now().Add(s.env.cfg.CommitInterval)
		return false, nil
	}
	// The cycle runs under the work context: a shutdown beginning
	// now must not cut a transaction short.
	if err := e.runCycle(work); err != nil {
		return true, err
	}
	*next = time.Now().Add(s.env.cfg.CommitInterval)
	return false, nil
}

// transact runs prepare, End and finish for every running task.
func (e *exactlyOnce) transact(ctx context.Context) error {
	e.cycle <- struct{}{}
	defer func() { <-e.cycle }()
	s := e.s
	began := time.Now()
	defer func() { s.env.metrics.commitSeconds.Observe(time.Since(began).Seconds()) }()
	var ts []*task
	for _, t := range s.reg.tasks() {
		if t.State() == taskRunning {
			ts = append(ts, t)
		}
	}
	try := kgo.TryCommit
	if e.abortCycle.Swap(false) {
		// Records of this cycle found no running task, or a task that
		// folded some was stopped: abort, so the session rewinds the
		// input and they are read again.
		try = kgo.TryAbort
	}
	if e.openSince.Load() == nil {
		now := time.Now()
		e.openSince.Store(&now)
	}
	prepared, errs := prepare(ctx, ts)
	s.env.crashPoint("changelog-produced")
	if len(prepared) < len(ts) {
		// A task revoked meanwhile had folded records of this
		// transaction: abort (the session would anyway).
		try = kgo.TryAbort
	}
	var failed map[*task]error
	if try == kgo.TryCommit {
		if failed = e.produced(ctx, prepared); failed != nil {
			try = kgo.TryAbort
		}
	}
	endBegan := time.Now()
	committed, endErr := e.txn.End(ctx, try)
	s.env.metrics.txnEndSeconds.Observe(time.Since(endBegan).Seconds())
	if endErr == nil {
		e.ended()
	}
	if endErr == nil && committed {
		s.env.metrics.txnCommitted.Add(1)
	} else {
		s.env.metrics.txnAborted.Add(1)
	}
	if endErr == nil && committed {
		s.env.crashPoint("transaction-committed")
	}
	if endErr == nil && !committed && try == kgo.TryCommit {
		s.env.log.Warn("Transaction aborted (a rebalance or a fenced commit); the input is rewound to the committed offsets and folded again")
	}
	// The tasks write their stores at once, each in its own goroutine. A
	// task revoked after End has nothing to finish: its store is a cycle
	// behind its changelog, which the next owner restores.
	for _, err := range sendAll(ctx, prepared, func(t *task) cycleReq {
		return cycleReq{phase: cycleFinish, committed: committed && endErr == nil, produceErr: failed[t]}
	}) {
		if err != nil && !errors.Is(err, errTaskStopped) {
			errs = append(errs, err)
		}
	}
	if endErr != nil {
		if fatalTxnError(endErr) {
			errs = append(errs, fmt.Errorf("ending transaction: %w", e.fenced(endErr)))
		} else if err := e.abortUntilKafkaAnswers(ctx, endErr); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// settle waits until no transaction cycle of this process is in progress.
// A task restores only after it: a task of the same partition dropped here
// (its lease lapsed, its partitions lost) may have produced into a
// transaction whose End was already under way, and that End may still
// commit. Its changelog records then land after a restore that read the
// changelog's end before it, while the input position moves past the
// events they hold: the store would miss them for good. Once the cycle
// has ended, its transaction is decided, and a decided transaction's
// records are restored (waitSettledChangelog). Only changelog records are
// written in a cycle, so none of this process's can land after settle.
func (e *exactlyOnce) settle(ctx context.Context, t *task) error {
	select {
	case e.cycle <- struct{}{}:
		<-e.cycle
		return nil
	default:
	}
	began := time.Now()
	t.log.Info(fmt.Sprintf("task [%s] Waiting for this process's transaction in progress to be decided before restoring", t.name))
	select {
	case e.cycle <- struct{}{}:
		<-e.cycle
		t.log.Info(fmt.Sprintf("task [%s] The transaction in progress was decided; restoring", t.name), zap.Duration("waited", time.Since(began).Round(time.Millisecond)))
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// prepare asks every task to produce its cycle's records, all at once. It
// returns the tasks that did, and the errors of those that failed other
// than by being stopped.
func prepare(ctx context.Context, ts []*task) (prepared []*task, errs []error) {
	for i, err := range sendAll(ctx, ts, func(*task) cycleReq { return cycleReq{phase: cyclePrepare} }) {
		if err != nil {
			if !errors.Is(err, errTaskStopped) {
				errs = append(errs, err)
			}
			continue
		}
		prepared = append(prepared, ts[i])
	}
	return prepared, errs
}

// sendAll hands each task its cycle step, then waits for every answer: the
// tasks carry out the step in parallel, each in its own goroutine. The
// errors are in the order of ts.
func sendAll(ctx context.Context, ts []*task, req func(*task) cycleReq) []error {
	waits := make([]func() error, len(ts))
	for i, t := range ts {
		waits[i] = t.post(ctx, req(t))
	}
	errs := make([]error, len(ts))
	for i, wait := range waits {
		errs[i] = wait()
	}
	return errs
}

// produced waits until every record of the cycle is acknowledged or failed,
// and returns the tasks whose records failed, or nil when none did and the
// flush succeeded. A failure aborts the transaction, so that nothing is
// committed past it (End would commit the input offsets anyway).
func (e *exactlyOnce) produced(ctx context.Context, prepared []*task) map[*task]error {
	failed := map[*task]error{}
	flushErr := e.s.kc().Flush(ctx)
	for _, t := range prepared {
		t.out.pending.Wait()
		if errp := t.out.produceErr.Load(); errp != nil {
			failed[t] = *errp
		}
	}
	if flushErr == nil && len(failed) == 0 {
		return nil
	}
	return failed
}

// fatalTxnError reports whether a transaction error ends this producer
// session: it was fenced (the broker aborted its transaction after
// transaction.timeout.ms, or another process took over its transactional
// id), or it is not allowed a transactional id.
func fatalTxnError(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kgo.ErrClientClosed)
}

// errSessionFenced ends a group session whose transactional producer was
// fenced. Its open transaction is aborted, the tasks' stores hold the
// committed state, so the runtime starts a new session (a new producer
// epoch) instead of exiting; see Run. Its errors are fencings.
var errSessionFenced = errors.New("stream: the transactional producer was fenced")

// fencing is a session's producer fenced (errSessionFenced), with how long
// its transaction had been open: the broker fences a producer whose
// transaction outlived transaction.timeout.ms, and any producer when
// another one initialises the same transactional id. Only the second can
// fence a transaction younger than the timeout.
type fencing struct {
	open time.Duration
	err  error
}

func (f *fencing) Error() string { return fmt.Sprintf("%v: %v", errSessionFenced, f.err) }

func (f *fencing) Unwrap() []error { return []error{errSessionFenced, f.err} }

// timedOut reports whether the fenced transaction had been open long
// enough for the broker to abort it on its timeout. Half the timeout
// leaves room for the coordinator's clock and its periodic check; the
// fencing by another process comes within a commit interval, a tenth of
// the default timeout.
func (f *fencing) timedOut(timeout time.Duration) bool { return f.open >= timeout/2 }

// errProducerIDLost ends a group session whose transactional producer
// could not get its producer id (a broker failed during InitProducerID,
// and the client keeps that failure): as after a fencing, the tasks'
// stores hold the committed state and the runtime starts a new session
// with a new producer.
var errProducerIDLost = errors.New("stream: the transactional producer could not get its producer id")

// beginFailed classifies a failed Begin: a fencing (errSessionFenced) of
// the transaction that ended last (Begin itself asks no broker), a
// producer id the client could not load (errProducerIDLost), or, for a
// closed client or a transactional id not allowed, the error itself.
func (e *exactlyOnce) beginFailed(err error) error {
	switch {
	case errors.Is(err, kerr.ProducerFenced), errors.Is(err, kerr.InvalidProducerEpoch):
		return e.fencedAfter(err, max(e.openFor(), time.Duration(e.endedOpen.Load())))
	case errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return err
	}
	return fmt.Errorf("%w: %w", errProducerIDLost, err)
}

// abortUntilKafkaAnswers handles an End that failed (Kafka unreachable, a
// coordinator moving): the tasks dropped the cycle's totals, and the
// transaction is aborted, retried with backoff until Kafka answers; the
// session then rewinds the input to the committed offsets.
func (e *exactlyOnce) abortUntilKafkaAnswers(ctx context.Context, cause error) error {
	env := e.s.env
	env.kafkaDown.Store(true)
	defer env.kafkaDown.Store(false)
	env.log.Warn("Ending the transaction failed; aborting it, and folding the input again once Kafka answers", zap.Error(cause))
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		_, err := e.txn.End(ctx, kgo.TryAbort)
		if err == nil {
			e.ended()
			env.log.Info("Transaction aborted; processing resumes from the committed offsets", zap.Int("attempts", attempt))
			return nil
		}
		if fatalTxnError(err) {
			return fmt.Errorf("aborting transaction: %w", e.fenced(err))
		}
		if attempt%10 == 0 {
			env.log.Warn("Still waiting for Kafka to abort the transaction", zap.Int("attempts", attempt), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("aborting transaction: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// errTaskStopped: the task was stopped (revoked) before it answered.
var errTaskStopped = errors.New("stream: task stopped")

// post hands a cycle step to the task and returns the wait for its answer:
// errTaskStopped when the task was stopped, the task's error when it
// failed.
func (t *task) post(ctx context.Context, req cycleReq) (wait func() error) {
	req.done = make(chan error, 1)
	stopped := func() error {
		if t.State() == taskFailed {
			return fmt.Errorf("task %s failed", t.name)
		}
		return fmt.Errorf("task %s: %w", t.name, errTaskStopped)
	}
	select {
	case t.mail.cycle <- req:
	case <-t.life.done:
		return stopped
	case <-ctx.Done():
		err := ctx.Err()
		return func() error { return err }
	}
	return func() error {
		select {
		case err := <-req.done:
			return err
		case <-t.life.done:
			return stopped()
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
