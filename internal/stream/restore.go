package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// restoreProgressEvery is how often a long restore logs its progress.
const restoreProgressEvery = 5 * time.Second

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
	return t.rt.changelogBounds(ctx, t.partition, t.log)
}

func (rt *Runtime) changelogBounds(ctx context.Context, p int32, log *zap.Logger) (logStart, end int64, err error) {
	cl := rt.cfg.ChangelogTopic()
	tp := fmt.Sprintf("%s-%d", cl, p)
	lookup := func(list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
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
		logStart, err = lookup(rt.admin.ListStartOffsets)
		if err == nil {
			// The last stable offset: restore reads committed records only.
			end, err = lookup(rt.admin.ListCommittedOffsets)
		}
		if err == nil {
			return logStart, end, nil
		}
		if attempt >= 50 {
			return 0, 0, fmt.Errorf("listing offsets of changelog %s: %w", tp, err)
		}
		if attempt%10 == 0 {
			log.Warn("Listing changelog offsets; retrying", zap.String("changelog", tp), zap.Error(err))
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
// (OffsetFetch with require_stable), retrying for a while.
func (t *task) waitStableOffsets(ctx context.Context) error {
	topics := []string{t.rt.cfg.InputTopic, t.rt.cfg.RepartitionTopic()}
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// All of the group's offsets: asking for given topics would go
		// through kadm's metadata cache, which can still hold the topics
		// created a moment ago as missing.
		offs, err := t.rt.admin.FetchOffsets(kadm.RequireStable(ctx), t.rt.cfg.ApplicationID)
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
		if attempt >= 100 {
			return fmt.Errorf("fetching stable committed offsets of task %s: %w", t.name, err)
		}
		if attempt%10 == 0 {
			t.log.Warn("Committed offsets not stable yet (a transaction is pending); retrying", zap.Error(err))
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
	)
	progressEvery := restoreProgressEvery
	if t.rt.knobs.RestoreProgressEvery > 0 {
		progressEvery = t.rt.knobs.RestoreProgressEvery
	}
	for next < to {
		fetches := client.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return n, err
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if ferr == nil {
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
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= to {
				return
			}
			next = r.Offset + 1
			if r.Attrs.IsControl() {
				return
			}
			n++
			if u, ok := changelogUpdate(r, t.log, tp); ok {
				updates = append(updates, u)
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
