package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// txnAbortCheck is how often Kafka looks for timed-out transactions to
// abort (transaction.abort.timed.out.transaction.cleanup.interval.ms).
const txnAbortCheck = 10 * time.Second

// restoreProgressEvery is how often a long restore logs its progress.
const restoreProgressEvery = 5 * time.Second

// Restore retries: the first failure waits restoreBackoff, each next one
// twice as long, up to restoreBackoffMax.
const (
	restoreBackoff    = time.Second
	restoreBackoffMax = 30 * time.Second
)

// restoreRetrying restores the task, retrying with backoff for as long as
// the task is not stopped (ctx): an error is logged with its attempt, shown
// in the task's status, and past task.timeout.ms makes the process report
// itself unhealthy (Kubernetes restarts it), while the task keeps trying. A
// corrupted store is moved aside first, so the next attempt rebuilds it
// from the changelog. It returns only ctx's error.
func (t *task) restoreRetrying(ctx context.Context) error {
	wait := restoreBackoff
	for {
		err := t.restore(ctx)
		if err == nil {
			t.trouble.clear()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The next attempt opens the store again.
		if s := t.store.Swap(nil); s != nil {
			_ = s.Close()
		}
		if state.IsCorrupt(err) {
			if to, qerr := t.rt.dir.Quarantine(t.partition); qerr == nil {
				t.log.Warn(fmt.Sprintf("task [%s] Store is corrupted; moved it to %s and restoring it from the changelog", t.name, to),
					zap.String("quarantined_to", to), zap.Error(err))
			}
		}
		attempts, since := t.trouble.fail(err)
		t.rt.metrics.restoreFailures.Add(1)
		msg := fmt.Sprintf("task [%s] Restore failed; retrying in %s", t.name, wait)
		if failing := time.Since(since); failing > t.rt.cfg.TaskTimeout {
			msg = fmt.Sprintf("task [%s] Restore has failed for %s (task.timeout.ms %d): the process reports itself unhealthy; retrying in %s",
				t.name, failing.Round(time.Second), t.rt.cfg.TaskTimeout.Milliseconds(), wait)
			t.log.Error(msg, zap.Int("attempt", attempts), zap.Error(err))
		} else {
			t.log.Warn(msg, zap.Int("attempt", attempts), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, restoreBackoffMax)
	}
}

// restore opens the task's store and brings it up to the changelog end
// offset read now: from the stored checkpoint, or from the start when there
// is none or the changelog cannot honour it (invariant 5: wipe, never serve
// stale state).
func (t *task) restore(ctx context.Context) error {
	if t.rt.knobs.BeforeRestore != nil {
		t.rt.knobs.BeforeRestore(ctx, t.partition)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	start := time.Now()
	store, err := t.rt.openStore(t.partition, t.log)
	if err != nil {
		return err
	}
	t.store.Store(store)

	cl := t.rt.cfg.ChangelogTopic()
	tp := fmt.Sprintf("%s-%d", cl, t.partition)
	for attempt := 0; ; attempt++ {
		from, to, empty, err := t.restoreRange(ctx, tp)
		if state.IsCorrupt(err) && attempt < 3 {
			// Reading the checkpoint found a damaged file.
			if s := t.store.Swap(nil); s != nil {
				_ = s.Close()
			}
			s, qerr := t.quarantine(err)
			if qerr != nil {
				return qerr
			}
			t.store.Store(s)
			continue
		}
		if err != nil {
			return err
		}
		t.stats.restoreFrom.Store(from)
		t.stats.restoreTo.Store(to)
		bulk := empty && to-from >= bulkRestoreMin
		if bulk {
			if err := t.reopenStore(true); err != nil {
				return err
			}
		}
		n, err := t.replay(ctx, from, to)
		if err == nil && bulk {
			err = t.finishBulk(ctx)
		}
		if errors.Is(err, kerr.OffsetOutOfRange) && attempt < 3 {
			// The log start moved past our position while restoring
			// (compaction or retention): start over.
			t.log.Warn("Changelog start moved during restore; wiping the task and restoring from the start", zap.String("changelog", tp))
			if err := t.wipe(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		d := time.Since(start)
		t.stats.restoreMillis.Store(d.Milliseconds())
		t.log.Info(fmt.Sprintf("Finished restoring changelog %s to store %s with a total number of %d records", tp, t.rt.cfg.StoreName, n),
			zap.Int64("records", n), zap.Duration("duration", d))
		if t.standbyAt >= 0 {
			behind := max(0, to-t.standbyAt)
			t.log.Info(fmt.Sprintf("task [%s] standby was %d records behind; restored %d records (the copy had applied %d since it started)", t.name, behind, n, t.standbyApplied),
				zap.Int64("behind", behind), zap.Int64("records", n), zap.Int64("copy_applied", t.standbyApplied), zap.Duration("duration", d))
		}
		if from := t.rt.balancer.cameFrom(t.partition); from != "" && from != t.rt.instanceID {
			t.log.Info(fmt.Sprintf("task [%s] Took over from %s: restored %d records in %s", t.name, from, n, d.Round(time.Millisecond)),
				zap.String("from", from), zap.Int64("records", n), zap.Duration("duration", d))
		}
		t.log.Info(fmt.Sprintf("task [%s] Restored and ready to run", t.name))
		return nil
	}
}

// changelogBounds returns the log start and end (last stable) offsets of
// changelog partition p, retrying for a while: right after the topic is
// created, or while a broker restarts, the partition can be briefly unknown.
func (t *task) changelogBounds(ctx context.Context, tp string) (logStart, end int64, err error) {
	defer t.clearWait()
	return t.rt.changelogBoundsWaiting(ctx, t.partition, t.log, &t.trouble)
}

// clearWait ends a wait recorded in the task's trouble (not a failure).
func (t *task) clearWait() {
	t.trouble.mu.Lock()
	waiting := t.trouble.waiting != "" && t.trouble.err == ""
	t.trouble.mu.Unlock()
	if waiting {
		t.trouble.clear()
	}
}

func (rt *Runtime) changelogBounds(ctx context.Context, p int32, log *zap.Logger) (logStart, end int64, err error) {
	return rt.changelogBoundsWaiting(ctx, p, log, nil)
}

// changelogBoundsWaiting is changelogBounds, retrying for as long as ctx
// lets it; tr, when not nil, shows the wait after its first retries.
func (rt *Runtime) changelogBoundsWaiting(ctx context.Context, p int32, log *zap.Logger, tr *trouble) (logStart, end int64, err error) {
	cl := rt.cfg.ChangelogTopic()
	tp := fmt.Sprintf("%s-%d", cl, p)
	lookup := func(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
		offs, err := list(ctx, cl)
		if err == nil {
			err = offs.Error()
		}
		if err != nil {
			return 0, err
		}
		o, ok := offs.Lookup(cl, p)
		if !ok {
			return 0, kerr.UnknownTopicOrPartition
		}
		return o.Offset, nil
	}
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// Each attempt is bounded, so a wait shows before the client's
		// own retries of a retriable error end.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		logStart, err = lookup(actx, rt.admin.ListStartOffsets)
		if err == nil {
			// The last stable offset: restore reads committed records only.
			end, err = lookup(actx, rt.admin.ListCommittedOffsets)
		}
		cancel()
		if err == nil {
			return logStart, end, nil
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		if tr != nil && attempt == 1 {
			tr.wait(fmt.Sprintf("the offsets of changelog %s (listing them failed: %v)", tp, err), 0)
		}
		if attempt%10 == 0 {
			log.Warn("Listing changelog offsets; retrying", zap.String("changelog", tp), zap.Int("attempt", attempt), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// changelogEnds returns the end (last stable) offset of every changelog
// partition, for the balancer's caught-up-first placement.
func (rt *Runtime) changelogEnds(ctx context.Context) (map[int32]int64, error) {
	cl := rt.cfg.ChangelogTopic()
	offs, err := rt.admin.ListCommittedOffsets(ctx, cl)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of changelog %s: %w", cl, err)
	}
	out := map[int32]int64{}
	for p, o := range offs[cl] {
		out[p] = o.Offset
	}
	return out, nil
}

// waitStableOffsets waits until the group has no pending transactional
// offset commit for the task's input and repartition partitions
// (OffsetFetch with require_stable), for as long as ctx lets it: a pending
// commit of a killed owner's transaction ends when the broker aborts it,
// after transaction.timeout.ms. The wait shows in the task's status.
func (t *task) waitStableOffsets(ctx context.Context) error {
	defer t.clearWait()
	topics := []string{t.rt.cfg.InputTopic, t.rt.cfg.RepartitionTopic()}
	began := time.Now()
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// All of the group's offsets: asking for given topics would go
		// through kadm's metadata cache, which can still hold the topics
		// created a moment ago as missing.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		offs, err := t.rt.admin.FetchOffsets(kadm.RequireStable(actx), t.rt.cfg.ApplicationID)
		cancel()
		if err == nil {
			for _, topic := range topics {
				if o, ok := offs.Lookup(topic, t.partition); ok && o.Err != nil {
					err = fmt.Errorf("offset of %s-%d: %w", topic, t.partition, o.Err)
					break
				}
			}
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt == 1 {
			// A killed owner's pending commit lasts until the broker aborts
			// its transaction: up to the transaction timeout and the
			// broker's check for timed-out transactions (every 10 s by
			// default). Only a longer wait counts as trouble.
			t.trouble.wait(fmt.Sprintf("stable committed offsets of task %s (a transaction of its previous owner is pending: %v)", t.name, err),
				t.rt.cfg.TransactionTimeout()+txnAbortCheck)
		}
		if attempt%10 == 0 {
			t.log.Warn("Committed offsets not stable yet (a transaction is pending); retrying", zap.Int("attempt", attempt),
				zap.Duration("waited", time.Since(began).Round(time.Second)), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// quarantine moves the task's corrupted store aside, with a warning naming
// where, and opens an empty one in its place. The store must be closed.
func (t *task) quarantine(cause error) (*state.Store, error) {
	return t.rt.quarantine(t.partition, t.log, cause)
}

func (rt *Runtime) quarantine(p int32, log *zap.Logger, cause error) (*state.Store, error) {
	to, err := rt.dir.Quarantine(p)
	if err != nil {
		return nil, errors.Join(cause, err)
	}
	log.Warn(fmt.Sprintf("task [%s] Store is corrupted; moved it to %s and restoring it from the changelog", state.TaskName(p), to),
		zap.String("quarantined_to", to), zap.Error(cause))
	return state.Open(rt.dir.TaskPath(p), log, rt.storeOptions())
}

// openStore opens task p's store, quarantining it and opening an empty one
// when it is corrupted.
func (rt *Runtime) openStore(p int32, log *zap.Logger) (*state.Store, error) {
	store, err := state.Open(rt.dir.TaskPath(p), log, rt.storeOptions())
	if state.IsCorrupt(err) {
		store, err = rt.quarantine(p, log, err)
	}
	return store, err
}

// restoreRange validates the checkpoint against the changelog and returns
// the offsets to replay, [from, to), and whether the store is empty.
func (t *task) restoreRange(ctx context.Context, tp string) (from, to int64, empty bool, err error) {
	// The changelog end is read only once the group's committed offsets of
	// the task's partitions are stable: a transaction of the previous owner
	// that commits input offsets also commits the changelog records
	// reflecting them, so once no such transaction is pending, the end read
	// next covers every record the resumed input position relies on.
	if err := t.waitStableOffsets(ctx); err != nil {
		return 0, 0, false, err
	}
	logStart, end, err := t.changelogBounds(ctx, tp)
	if err != nil {
		return 0, 0, false, err
	}

	cp, found, err := t.store.Load().Checkpoint()
	if err != nil {
		return 0, 0, false, err
	}
	if from, ok := t.rt.checkCheckpoint(t.log, t.name, tp, cp, found, logStart, end); ok {
		t.cp = cp
		t.stats.checkpoint.Store(cp.ChangelogOffset)
		return from, end, false, nil
	}
	if found {
		if err := t.wipe(); err != nil {
			return 0, 0, false, err
		}
	}
	t.cp = state.Checkpoint{ChangelogOffset: logStart, InputOffset: -1, ChangelogTopicID: t.rt.topo.changelogID}
	// No checkpoint (every write carries one: the store holds nothing), or
	// wiped: the store is empty.
	return logStart, end, true, nil
}

// checkCheckpoint tells whether a store's checkpoint can be resumed from
// against the changelog's [logStart, end): ok with the offset to resume
// at, or not, logged (a store without checkpoint starts at the log start; a
// checkpoint of a recreated changelog, beyond its end or below its start
// makes the store void: wipe it).
func (rt *Runtime) checkCheckpoint(log *zap.Logger, name, tp string, cp state.Checkpoint, found bool, logStart, end int64) (int64, bool) {
	var zeroID [16]byte
	switch {
	case !found:
		log.Info(fmt.Sprintf("task [%s] State store %s did not find checkpoint offset, hence would default to the starting offset at changelog %s",
			name, rt.cfg.StoreName, tp))
	case cp.ChangelogTopicID != zeroID && cp.ChangelogTopicID != rt.topo.changelogID:
		log.Warn(fmt.Sprintf("task [%s] Changelog %s was recreated since the checkpoint was written; wiping the store and restoring from the start", name, tp),
			zap.Int64("checkpoint", cp.ChangelogOffset))
	case cp.ChangelogOffset > end:
		log.Warn(fmt.Sprintf("task [%s] Checkpoint offset %d is beyond the end offset %d of changelog %s; wiping the store and restoring from the start", name, cp.ChangelogOffset, end, tp),
			zap.Int64("checkpoint", cp.ChangelogOffset), zap.Int64("end_offset", end))
	case cp.ChangelogOffset < logStart:
		log.Warn(fmt.Sprintf("task [%s] Checkpoint offset %d is below the start offset %d of changelog %s; wiping the store and restoring from the start", name, cp.ChangelogOffset, logStart, tp),
			zap.Int64("checkpoint", cp.ChangelogOffset), zap.Int64("start_offset", logStart))
	default:
		return cp.ChangelogOffset, true
	}
	return logStart, false
}

// restoreFetchBytes bounds one restore fetch (of one partition).
const restoreFetchBytes = 2 << 20

// bulkRestoreMin is the least number of changelog offsets for which an
// empty store is restored as a bulk load (see state.OpenOptions.BulkLoad).
const bulkRestoreMin = 20_000

// reopenStore closes the task's store and opens it again, for a bulk load
// or for running.
func (t *task) reopenStore(bulk bool) error {
	if s := t.store.Swap(nil); s != nil {
		if err := s.Close(); err != nil {
			return err
		}
	}
	return t.openStore(bulk)
}

// openStore opens the task's store with the runtime's options.
func (t *task) openStore(bulk bool) error {
	o := t.rt.storeOptions()
	o.BulkLoad = bulk
	s, err := state.Open(t.rt.dir.TaskPath(t.partition), t.log, o)
	if err != nil {
		return err
	}
	t.store.Store(s)
	return nil
}

// finishBulk ends a bulk restore: the store's tables merged into the last
// level in one pass, then the store reopened for running.
func (t *task) finishBulk(ctx context.Context) error {
	began := time.Now()
	if err := t.store.Load().CompactAll(ctx); err != nil {
		return err
	}
	d := time.Since(began)
	t.log.Info(fmt.Sprintf("task [%s] Compacted the restored store in %d ms", t.name, d.Milliseconds()), zap.Duration("duration", d))
	return t.reopenStore(false)
}

// wipe deletes the task's store and opens an empty one.
func (t *task) wipe() error {
	if s := t.store.Swap(nil); s != nil {
		if err := s.Close(); err != nil {
			t.log.Warn("Closing store before wiping it", zap.Error(err))
		}
	}
	if err := t.rt.dir.Wipe(t.partition); err != nil {
		return err
	}
	if err := t.openStore(false); err != nil {
		return err
	}
	t.cp = state.Checkpoint{InputOffset: -1, ChangelogTopicID: t.rt.topo.changelogID}
	return nil
}

// replay reads the changelog partition over [from, to) and writes each
// fetch as one Pebble batch with the checkpoint after it. It returns the
// number of records restored.
func (t *task) replay(ctx context.Context, from, to int64) (int64, error) {
	if from >= to {
		if t.cp.ChangelogOffset != from || t.cp.ChangelogTopicID != t.rt.topo.changelogID {
			t.cp.ChangelogOffset, t.cp.ChangelogTopicID = from, t.rt.topo.changelogID
			if err := t.store.Load().Apply(nil, t.cp); err != nil {
				return 0, err
			}
		}
		t.stats.checkpoint.Store(t.cp.ChangelogOffset)
		return 0, nil
	}
	cl := t.rt.cfg.ChangelogTopic()
	client, err := kgo.NewClient(append(t.rt.kafkaOpts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{cl: {t.partition: kgo.NewOffset().At(from)}}),
		// Large fetches: a restore reads one partition as fast as it can,
		// and the client's default takes at most 1 MiB of a partition per
		// round trip.
		kgo.FetchMaxBytes(restoreFetchBytes),
		kgo.FetchMaxPartitionBytes(restoreFetchBytes),
		// Only committed changelog records; transaction markers are kept
		// so the position passes them (the last offset before the end can
		// be a marker).
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		// A position below the log start (compaction or retention moved
		// it) is an error to see, not a silent jump to the new start: the
		// store may hold keys whose deletion was compacted away (wipe).
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	)...)
	if err != nil {
		return 0, fmt.Errorf("creating restore consumer: %w", err)
	}
	defer client.Close()

	var (
		n       int64
		next    = from
		began   = time.Now()
		lastLog = began
		total   = to - from
		updates []state.Update
		tp      = fmt.Sprintf("%s-%d", cl, t.partition)
		// extended counts the times the end moved (see below).
		extended int
	)
	progressEvery := restoreProgressEvery
	if t.rt.knobs.RestoreProgressEvery > 0 {
		progressEvery = t.rt.knobs.RestoreProgressEvery
	}
	for next < to {
		qctx, cancel := context.WithTimeout(ctx, restoreQuiet)
		fetches := client.PollFetches(qctx)
		quiet := qctx.Err() != nil && fetches.NumRecords() == 0 && !hasFetchErrors(fetches)
		cancel()
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if quiet {
			// Nothing for a while: the records before to may be ones the
			// consumer never reports (aborted, compacted away).
			vis, err := t.rt.visibleFrom(ctx, client, t.partition, next, to)
			if errors.Is(err, kerr.OffsetOutOfRange) {
				return n, err
			}
			if err != nil {
				t.log.Debug("Asking the broker what the changelog holds at the restore's position", zap.String("changelog", tp), zap.Error(err))
				continue
			}
			if vis > next {
				t.log.Info(fmt.Sprintf("task [%s] Changelog %s holds nothing to read from offset %d to %d (aborted or compacted records); skipping past them", t.name, tp, next, vis),
					zap.Int64("from", next), zap.Int64("to", vis))
				next = vis
				cp := t.cp
				cp.ChangelogOffset = min(next, to)
				apply := t.store.Load().ApplyUnsynced
				if next >= to {
					apply = t.store.Load().Apply
				}
				if err := apply(nil, cp); err != nil {
					return n, err
				}
				t.cp = cp
				t.stats.checkpoint.Store(cp.ChangelogOffset)
			}
			continue
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if ferr != nil {
			if errors.Is(ferr, kerr.OffsetOutOfRange) {
				return n, ferr
			}
			// Retriable errors are retried inside the client; anything
			// reaching us is logged and polled again, bounded by ctx.
			t.log.Warn("Fetching changelog during restore", zap.String("changelog", tp), zap.Error(ferr))
			select {
			case <-ctx.Done():
				return n, ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		updates = updates[:0]
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			for _, r := range fp.Records {
				if r.Offset >= to && extended < maxRestoreExtensions && fp.LastStableOffset > to {
					// The changelog grew past the end read at the start
					// (written meanwhile; the records just before the end
					// may have been compacted away for these): read on to
					// its stable end now, a bounded number of times.
					extended++
					t.log.Info(fmt.Sprintf("task [%s] Changelog %s grew while restoring; reading on to offset %d", t.name, tp, fp.LastStableOffset),
						zap.Int64("was", to), zap.Int64("end_offset", fp.LastStableOffset))
					to = fp.LastStableOffset
					total = to - from
					t.stats.restoreTo.Store(to)
				}
				if r.Offset >= to {
					// Past the end: it is reached, even if the records just
					// before it are gone (compacted, or an aborted tail the
					// consumer skips).
					next = max(next, to)
					return
				}
				if r.Offset < next {
					continue
				}
				next = r.Offset + 1
				if r.Attrs.IsControl() {
					continue
				}
				n++
				if u, ok := changelogUpdate(r, t.log, tp); ok {
					updates = append(updates, u)
				}
			}
		})
		if len(updates) > 0 || next > t.cp.ChangelogOffset {
			cp := t.cp
			cp.ChangelogOffset = min(next, to)
			// Unsynced until the last fetch: a crash loses whole batches
			// with their checkpoints (the changelog has them again), and
			// the final synced write makes everything before it durable.
			apply := t.store.Load().ApplyUnsynced
			if next >= to {
				apply = t.store.Load().Apply
			}
			if err := apply(updates, cp); err != nil {
				return n, err
			}
			t.cp = cp
			t.stats.checkpoint.Store(cp.ChangelogOffset)
		}
		t.stats.restored.Store(n)
		if now := time.Now(); now.Sub(lastLog) >= progressEvery {
			lastLog = now
			done := next - from
			rate := float64(done) / now.Sub(began).Seconds()
			eta := time.Duration(0)
			if rate > 0 {
				eta = time.Duration(float64(to-next) / rate * float64(time.Second))
			}
			t.log.Info(fmt.Sprintf("task [%s] Restoring changelog %s: %d of %d offsets done (%.0f records/s, ETA %s)", t.name, tp, done, total, rate, eta.Round(time.Second)),
				zap.Int64("records", n), zap.Int64("done", done), zap.Int64("total", total), zap.Float64("rate", rate), zap.Duration("eta", eta))
		}
	}
	return n, nil
}

// changelogUpdate is the store update a changelog record makes: the total
// with the input offsets it reflects, or a deletion for a tombstone. An
// unreadable record is logged and skipped (false).
func changelogUpdate(r *kgo.Record, log *zap.Logger, tp string) (state.Update, bool) {
	u := state.Update{Product: string(r.Key)}
	if r.Value == nil {
		u.Delete = true
		return u, true
	}
	total, err := sales.DecodeTotal(r.Value)
	if err != nil {
		log.Warn("Skipping unreadable changelog record", zap.String("changelog", tp), zap.Int64("offset", r.Offset), zap.Error(err))
		return u, false
	}
	u.Entry.Total = total
	for _, h := range r.Headers {
		if h.Key == sales.OffsetsHeader {
			if offs, err := sales.DecodeOffsets(h.Value); err == nil {
				u.Entry.Offsets = offs
			}
		}
	}
	return u, true
}

// maxRestoreExtensions bounds how often a restore that finds the changelog
// grown past its end reads on to the new end, so that it ends even beside a
// writer that keeps writing.
const maxRestoreExtensions = 3

// hasFetchErrors reports whether fetches hold an error other than the end
// of the poll's context.
func hasFetchErrors(fetches kgo.Fetches) bool {
	found := false
	fetches.EachError(func(_ string, _ int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			found = true
		}
	})
	return found
}

// restoreQuiet is how long a changelog read gets nothing before it asks
// the broker what lies at its position (see visibleFrom).
const restoreQuiet = 2 * time.Second

// visibleFrom asks the broker (a read_committed fetch of raw batches)
// what changelog partition p holds at offset from, below to: it returns
// the offset of the first record a read_committed reader with control
// records kept is given (a committed record or a transaction marker), or,
// when there is none before to, to itself; the broker's log start when
// from is below it. A consumer never reports records that are invisible to
// it (an aborted transaction's, an empty batch left by compaction, nothing
// at all where compaction removed the tail), so without this a read that
// must reach to could wait for records that never come.
func (rt *Runtime) visibleFrom(ctx context.Context, cl *kgo.Client, p int32, from, to int64) (int64, error) {
	topic := rt.cfg.ChangelogTopic()
	pos := from
	for pos < to {
		leader, _, err := cl.PartitionLeader(topic, p)
		if err != nil {
			return from, err
		}
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis = 0
		req.MinBytes = 1
		req.MaxBytes = restoreFetchBytes
		req.IsolationLevel = 1
		req.SessionEpoch = -1
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic, ft.TopicID = topic, rt.topo.changelogID
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = p, pos, restoreFetchBytes
		fp.CurrentLeaderEpoch, fp.LogStartOffset = -1, -1
		ft.Partitions = append(ft.Partitions, fp)
		req.Topics = append(req.Topics, ft)
		kresp, err := cl.Broker(int(leader)).Request(ctx, req)
		if err != nil {
			return from, err
		}
		resp := kresp.(*kmsg.FetchResponse)
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return from, fmt.Errorf("fetch of %s-%d answered %d topics", topic, p, len(resp.Topics))
		}
		rp := resp.Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
			if errors.Is(err, kerr.OffsetOutOfRange) && rp.LogStartOffset > pos {
				return min(rp.LogStartOffset, to), nil
			}
			return from, err
		}
		next, visible, complete := scanBatches(rp.RecordBatches, rp.AbortedTransactions, pos)
		switch {
		case visible:
			return next, nil
		case next <= pos && complete:
			// Nothing stored at pos up to the stable end: the records
			// there are gone.
			return min(to, max(pos, rp.LastStableOffset)), nil
		case next <= pos:
			return pos, nil // a batch larger than the fetch: let the consumer read it
		}
		pos = next
	}
	return to, nil
}

// scanBatches reads raw record batches from offset from on: it returns the
// first offset of the first batch with a record a read_committed reader is
// given (visible), or else the offset past the last whole batch; complete
// is false when the bytes end in a partial batch.
func scanBatches(raw []byte, aborted []kmsg.FetchResponseTopicPartitionAbortedTransaction, from int64) (next int64, visible, complete bool) {
	sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
	abortedBy := map[int64]bool{}
	next = from
	for len(raw) >= 12 {
		length := int(binary.BigEndian.Uint32(raw[8:12]))
		if length < 49 || len(raw) < 12+length {
			return next, false, false
		}
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw[:12+length]); err != nil {
			return next, false, false
		}
		raw = raw[12+length:]
		last := b.FirstOffset + int64(b.LastOffsetDelta)
		if last < from {
			continue
		}
		for len(aborted) > 0 && aborted[0].FirstOffset <= last {
			abortedBy[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		control, txn := b.Attributes&0x20 != 0, b.Attributes&0x10 != 0
		switch {
		case control:
			// A marker is given to the reader (control records are kept);
			// an abort ends its producer's aborted run.
			delete(abortedBy, b.ProducerID)
			return max(from, b.FirstOffset), true, true
		case b.NumRecords > 0 && !(txn && abortedBy[b.ProducerID]):
			return max(from, b.FirstOffset), true, true
		}
		next = last + 1
	}
	return next, false, len(raw) == 0
}
