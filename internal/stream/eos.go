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
// running tasks, through franz-go's GroupTransactSession:
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
			case b := <-t.inbox:
				if err := t.processBatch(ctx, b); err != nil {
					return err
				}
			default:
				done = true
			}
		}
		updates, maxOffset := t.produceDirty(ctx)
		t.prepared = &preparedBatch{updates: updates, maxOffset: maxOffset, inputNext: t.inputNext}
		return nil
	case cycleFinish:
		p := t.prepared
		t.prepared = nil
		t.pending.Wait()
		if !req.committed {
			// The transaction aborted: its records are invisible, the input
			// is rewound, and the store still holds the committed state.
			t.produceErr.Store(nil)
			t.dropDirty()
			if req.produceErr != nil {
				t.log.Warn(fmt.Sprintf("task [%s] A record of the commit cycle failed to produce; the transaction is aborted", t.name), zap.Error(req.produceErr))
				t.cycleFailed(req.produceErr, "the input is folded again from the committed offsets")
			}
			return nil
		}
		t.produced()
		if errp := t.produceErr.Load(); errp != nil {
			return *errp
		}
		if p == nil {
			return nil
		}
		if err := t.apply(p.updates, p.maxOffset.Load(), p.inputNext); err != nil {
			// Committed in Kafka, not yet in the store: the task stalls and
			// writes it once it can (a restart would restore it from the
			// changelog).
			return t.stall(stalledBatch{updates: p.updates, maxOffset: p.maxOffset.Load(), inputNext: p.inputNext}, err)
		}
		t.rt.crashPoint("store-written")
		return nil
	}
	return fmt.Errorf("unknown cycle phase %d", req.phase)
}

// pollEOS is the poll loop under exactly-once: it dispatches records to the
// tasks and, every commit interval, runs the transaction cycle for all of
// them. It returns when ctx is done (the caller then runs the last cycle) or
// a task fails.
func (rt *Runtime) pollEOS(ctx context.Context) error {
	ctx, cancel := rt.untilFailure(ctx)
	defer cancel()
	if err := rt.session.Begin(); err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	next := time.Now().Add(rt.cfg.CommitInterval)
	for {
		pctx, pcancel := context.WithDeadline(ctx, next)
		go func() {
			// A task past maxDirty cuts the poll short.
			select {
			case <-rt.commitNow:
				rt.commitSoon.Store(true)
				pcancel()
			case <-pctx.Done():
			}
		}()
		fetches := rt.session.PollRecords(pctx, 10_000)
		pcancel()
		if rt.knobs.AfterPoll != nil {
			rt.knobs.AfterPoll(fetches.NumRecords())
		}
		if fetches.IsClientClosed() {
			return nil
		}
		// Every polled record must reach its task, even when ctx ended
		// during the poll: the transaction commits the offsets of all of
		// them (Run's last cycle does on shutdown). Hence the work context.
		// Records that found no running task make the cycle abort.
		if rt.dispatch(rt.work, fetches, nil) {
			rt.abortCycle.Store(true)
		}
		if ctx.Err() != nil {
			select {
			case <-rt.failed:
				return rt.failure
			default:
				return nil
			}
		}
		if time.Now().Before(next) && !rt.commitSoon.Load() {
			continue
		}
		// A task past maxDirty asked for the cycle early: the changed
		// products of one transaction stay bounded in memory.
		rt.commitSoon.Store(false)
		// The cycle runs under the work context: a shutdown beginning
		// now must not cut a transaction short.
		if err := rt.transact(rt.work); err != nil {
			return err
		}
		if err := rt.session.Begin(); err != nil {
			return fmt.Errorf("beginning transaction: %w", fenced(err))
		}
		next = time.Now().Add(rt.cfg.CommitInterval)
	}
}

// transact runs prepare, End and finish for every running task.
func (rt *Runtime) transact(ctx context.Context) error {
	began := time.Now()
	defer func() { rt.metrics.commitSeconds.Observe(time.Since(began).Seconds()) }()
	var ts []*task
	for _, t := range rt.tasks() {
		if t.State() == TaskRunning {
			ts = append(ts, t)
		}
	}
	var errs []error
	try := kgo.TryCommit
	if rt.abortCycle.Swap(false) {
		// Records of this cycle found no running task, or a task that
		// folded some was stopped: abort, so the session rewinds the
		// input and they are read again.
		try = kgo.TryAbort
	}
	prepared := ts[:0:0]
	for _, t := range ts {
		if err := t.send(ctx, cycleReq{phase: cyclePrepare}); err != nil {
			// A task revoked meanwhile had folded records of this
			// transaction: abort (the session would anyway).
			try = kgo.TryAbort
			if !errors.Is(err, errTaskStopped) {
				errs = append(errs, err)
			}
			continue
		}
		prepared = append(prepared, t)
	}
	rt.crashPoint("changelog-produced")
	if len(errs) > 0 {
		try = kgo.TryAbort
	}
	// Every record of the cycle is acknowledged (or failed) before the
	// transaction is ended: one that failed aborts it, so that nothing is
	// committed past it (End would commit the input offsets anyway).
	failed := map[*task]error{}
	if try == kgo.TryCommit {
		if err := rt.client.Flush(ctx); err != nil {
			try = kgo.TryAbort
		}
		for _, t := range prepared {
			t.pending.Wait()
			if errp := t.produceErr.Load(); errp != nil {
				failed[t] = *errp
				try = kgo.TryAbort
			}
		}
	}
	endBegan := time.Now()
	committed, endErr := rt.session.End(ctx, try)
	rt.metrics.txnEndSeconds.Observe(time.Since(endBegan).Seconds())
	if endErr == nil && committed {
		rt.metrics.txnCommitted.Add(1)
	} else {
		rt.metrics.txnAborted.Add(1)
	}
	if endErr == nil && committed {
		rt.crashPoint("transaction-committed")
	}
	if endErr == nil && !committed && try == kgo.TryCommit {
		rt.log.Warn("Transaction aborted (a rebalance or a fenced commit); the input is rewound to the committed offsets and folded again")
	}
	for _, t := range prepared {
		// A task revoked after End has nothing to finish: its store is a
		// cycle behind its changelog, which the next owner restores.
		if err := t.send(ctx, cycleReq{phase: cycleFinish, committed: committed && endErr == nil, produceErr: failed[t]}); err != nil && !errors.Is(err, errTaskStopped) {
			errs = append(errs, err)
		}
	}
	if endErr != nil {
		if fatalTxnError(endErr) {
			errs = append(errs, fmt.Errorf("ending transaction: %w", fenced(endErr)))
		} else if err := rt.abortUntilKafkaAnswers(ctx, endErr); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
// epoch) instead of exiting; see Run.
var errSessionFenced = errors.New("stream: the transactional producer was fenced")

// fenced wraps err with errSessionFenced when it is a fencing.
func fenced(err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return fmt.Errorf("%w: %w", errSessionFenced, err)
	}
	return err
}

// abortUntilKafkaAnswers handles an End that failed (Kafka unreachable, a
// coordinator moving): the tasks dropped the cycle's totals, and the
// transaction is aborted, retried with backoff until Kafka answers; the
// session then rewinds the input to the committed offsets.
func (rt *Runtime) abortUntilKafkaAnswers(ctx context.Context, cause error) error {
	rt.kafkaDown.Store(true)
	defer rt.kafkaDown.Store(false)
	rt.log.Warn("Ending the transaction failed; aborting it, and folding the input again once Kafka answers", zap.Error(cause))
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		_, err := rt.session.End(ctx, kgo.TryAbort)
		if err == nil {
			rt.log.Info("Transaction aborted; processing resumes from the committed offsets", zap.Int("attempts", attempt))
			return nil
		}
		if fatalTxnError(err) {
			return fmt.Errorf("aborting transaction: %w", fenced(err))
		}
		if attempt%10 == 0 {
			rt.log.Warn("Still waiting for Kafka to abort the transaction", zap.Int("attempts", attempt), zap.Error(err))
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

// send hands a cycle step to the task and waits for its answer. It returns
// errTaskStopped when the task was stopped, the task's error when it failed.
func (t *task) send(ctx context.Context, req cycleReq) error {
	req.done = make(chan error, 1)
	stopped := func() error {
		if t.State() == TaskFailed {
			return fmt.Errorf("task %s failed", t.name)
		}
		return fmt.Errorf("task %s: %w", t.name, errTaskStopped)
	}
	select {
	case t.cycle <- req:
	case <-t.done:
		return stopped()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-t.done:
		return stopped()
	}
}

func (rt *Runtime) logTransactionalID(id string) {
	rt.log.Info("Exactly-once processing: one transaction per commit interval", zap.String("transactional_id", id),
		zap.Duration("commit_interval", rt.cfg.CommitInterval))
}
