package stream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode/utf16"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/changelog"
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

// restoreFetchBytes bounds one restore fetch (of one partition).
const restoreFetchBytes = 2 << 20

// bulkRestoreMin is the least number of changelog offsets for which an
// empty store is restored as a bulk load (see state.Store.BulkLoad).
const bulkRestoreMin = 20_000

// restoreMemoryBytes is the memory the bulk loads of a process share (each
// load under way an equal part of it) to sort the changelog's records.
const restoreMemoryBytes = 64 << 20

// maxRestoreExtensions bounds how often a restore that finds the changelog
// grown past its end reads on to the new end, so that it ends even beside a
// writer that keeps writing.
const maxRestoreExtensions = 3

// restoreRetrying restores the task, retrying with backoff for as long as
// the task is not stopped (ctx): an error is logged with its attempt, shown
// in the task's status, and past task.timeout.ms makes the process report
// itself unhealthy (Kubernetes restarts it), while the task keeps trying. A
// corrupted store is moved aside first, so the next attempt rebuilds it
// from the changelog. It returns only ctx's error.
func (t *task) restoreRetrying(ctx context.Context) error {
	e := t.deps.env
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
		if s := t.totals.store.Swap(nil); s != nil {
			_ = s.Close()
		}
		if state.IsCorrupt(err) {
			if to, qerr := e.dir.Quarantine(t.partition); qerr == nil {
				t.log.Warn(fmt.Sprintf("task [%s] Store is corrupted; moved it to %s and restoring it from the changelog", t.name, to),
					zap.String("quarantined_to", to), zap.Error(err))
			}
		}
		attempts, since := t.trouble.fail(err)
		e.metrics.restoreFailures.Add(1)
		msg := fmt.Sprintf("task [%s] Restore failed; retrying in %s", t.name, wait)
		if failing := time.Since(since); failing > e.cfg.TaskTimeout {
			msg = fmt.Sprintf("task [%s] Restore has failed for %s (task.timeout.ms %d): the process reports itself unhealthy; retrying in %s",
				t.name, failing.Round(time.Second), e.cfg.TaskTimeout.Milliseconds(), wait)
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
	e := t.deps.env
	if e.knobs.BeforeRestore != nil {
		e.knobs.BeforeRestore(ctx, t.partition)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if t.deps.settle != nil {
		if err := t.deps.settle(ctx, t); err != nil {
			return err
		}
	}
	if err := t.takeOver(ctx); err != nil {
		return err
	}
	start := time.Now()
	store, err := e.openStore(t.partition, t.log)
	if err != nil {
		return err
	}
	t.totals.store.Store(store)

	tp := fmt.Sprintf("%s-%d", t.totals.changelog, t.partition)
	var n int64
	var to int64
	for attempt := 0; ; attempt++ {
		var retry bool
		n, to, retry, err = t.restoreOnce(ctx, tp, attempt)
		if retry {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	for _, w := range t.windows {
		if err := t.restoreWindows(ctx, w); err != nil {
			return err
		}
	}
	t.restoredLog(tp, n, to, time.Since(start))
	return nil
}

// takeOver waits for the tasks and copies still closing the store here
// (the standby copy this task takes over, or one a task it replaced took
// over) to be done with it, and records how far the copy had come. The
// wait shows in the task's status.
func (t *task) takeOver(ctx context.Context) error {
	if len(t.handover.after) > 0 {
		defer t.clearWait()
		what := fmt.Sprintf("the task %s stopping here to close the store", t.name)
		if t.handover.from != nil {
			what = fmt.Sprintf("the standby copy of task %s to close the store", t.name)
		}
		t.trouble.wait(what, 0)
		for _, done := range t.handover.after {
			select {
			case <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		t.handover.after = nil
	}
	if sb := t.handover.from; sb != nil {
		t.handover.at, t.handover.applied = sb.pos.position.Load(), sb.pos.applied.Load()
		t.handover.from = nil
	}
	return nil
}

// restoreOnce is one attempt of the restore: it validates the checkpoint,
// replays the changelog to its end and, for a bulk load, compacts. retry
// means start over (a damaged checkpoint quarantined, the log start moved
// past the position: wiped), at most three times.
func (t *task) restoreOnce(ctx context.Context, tp string, attempt int) (n, to int64, retry bool, err error) {
	from, to, empty, err := t.restoreRange(ctx, tp)
	if state.IsCorrupt(err) && attempt < 3 {
		// Reading the checkpoint found a damaged file.
		if s := t.totals.store.Swap(nil); s != nil {
			_ = s.Close()
		}
		s, qerr := t.deps.env.quarantine(t.partition, t.log, err)
		if qerr != nil {
			return 0, 0, false, qerr
		}
		t.totals.store.Store(s)
		return 0, 0, true, nil
	}
	if err != nil {
		return 0, 0, false, err
	}
	t.stats.restoreFrom.Store(from)
	t.stats.restoreTo.Store(to)
	var load *state.BulkLoad
	if empty && to-from >= bulkRestoreMin {
		if load, err = t.beginBulk(); err != nil {
			return 0, 0, false, err
		}
	}
	n, to, err = t.replay(ctx, from, to, load)
	if err == nil && load != nil {
		err = t.finishBulk(ctx, load)
	}
	if load != nil {
		load.Close()
	}
	if errors.Is(err, changelog.ErrOutOfRange) && attempt < 3 {
		// The log start moved past our position while restoring
		// (compaction or retention): start over.
		t.log.Warn("Changelog start moved during restore; wiping the task and restoring from the start", zap.String("changelog", tp))
		if err := t.wipe(); err != nil {
			return 0, 0, false, err
		}
		return 0, 0, true, nil
	}
	return n, to, false, err
}

// restoredLog writes the lines of a finished restore.
func (t *task) restoredLog(tp string, n, to int64, d time.Duration) {
	e := t.deps.env
	t.stats.restoreMillis.Store(d.Milliseconds())
	t.log.Info(fmt.Sprintf("Finished restoring changelog %s to store %s with a total number of %d records", tp, e.cfg.StoreName, n),
		zap.Int64("records", n), zap.Duration("duration", d))
	if t.handover.at >= 0 {
		behind := max(0, to-t.handover.at)
		t.log.Info(fmt.Sprintf("task [%s] standby was %d records behind; restored %d records (the copy had applied %d since it started)", t.name, behind, n, t.handover.applied),
			zap.Int64("behind", behind), zap.Int64("records", n), zap.Int64("copy_applied", t.handover.applied), zap.Duration("duration", d))
	}
	if from := t.deps.cameFrom(t.partition); from != "" && from != e.instanceID {
		t.log.Info(fmt.Sprintf("task [%s] Took over from %s: restored %d records in %s", t.name, from, n, d.Round(time.Millisecond)),
			zap.String("from", from), zap.Int64("records", n), zap.Duration("duration", d))
	}
	t.log.Info(fmt.Sprintf("task [%s] Restored and ready to run", t.name))
}

// changelogBounds returns the log start and end (last stable) offsets of
// the task's changelog partition, for as long as ctx lets it; the wait shows
// in the task's status after the first failed attempt, inside the caller's
// own wait if one is shown (waitSettledChangelog reads the bounds while it
// waits), which is shown again when the listing answers.
func (t *task) changelogBounds(ctx context.Context, tp string) (logStart, end int64, err error) {
	onRetry, done := t.listRetry(tp)
	defer done()
	return changelog.Bounds(ctx, t.deps.env.client, t.totals.changelog, t.partition, onRetry)
}

// changelogHighWatermark returns the high watermark of the task's changelog
// partition, as changelogBounds does the bounds.
func (t *task) changelogHighWatermark(ctx context.Context, tp string) (int64, error) {
	onRetry, done := t.listRetry(tp)
	defer done()
	return changelog.HighWatermark(ctx, t.deps.env.client, t.totals.changelog, t.partition, onRetry)
}

// listRetry returns what a listing of the changelog's offsets calls after
// each failed attempt: the first failure shows in the task's status, inside
// the caller's own wait if one is shown, and every tenth is logged; done,
// called once the listing returned, shows the caller's wait again.
func (t *task) listRetry(tp string) (onRetry func(int, error), done func()) {
	retry := boundsRetryLog(t.log, tp)
	failed, outer := false, ""
	onRetry = func(attempt int, err error) {
		if attempt == 1 {
			failed = true
			outer = t.trouble.waitWithin(fmt.Sprintf("the offsets of changelog %s (listing them failed: %v)", tp, err), 0)
		}
		retry(attempt, err)
	}
	done = func() {
		if failed {
			t.trouble.endWithin(outer)
		}
	}
	return onRetry, done
}

// boundsRetryLog logs every tenth failed attempt to list a changelog's
// offsets.
func boundsRetryLog(log *zap.Logger, tp string) func(int, error) {
	return func(attempt int, err error) {
		if attempt%10 == 0 {
			log.Warn("Listing changelog offsets; retrying", zap.String("changelog", tp), zap.Int("attempt", attempt), zap.Error(err))
		}
	}
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

// waitStableOffsets waits until the group has no pending transactional
// offset commit for the task's input and repartition partitions
// (OffsetFetch with require_stable), for as long as ctx lets it: a pending
// commit of a killed owner's transaction ends when the broker aborts it,
// after transaction.timeout.ms. The wait shows in the task's status.
func (t *task) waitStableOffsets(ctx context.Context) error {
	defer t.clearWait()
	e := t.deps.env
	began := time.Now()
	overdue := e.cfg.TransactionTimeout() + 2*txnAbortCheck
	described := false
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := t.stableOffsets(actx)
		cancel()
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
				e.cfg.TransactionTimeout()+txnAbortCheck)
		}
		if !described && time.Since(began) > overdue {
			// Past the time the broker takes to abort a transaction
			// nobody ends: name the transactions that hold the offsets,
			// with their coordinator's state, for the operator (one
			// stuck preparing is the broker's to finish; Kafka's
			// kafka-transactions.sh find-hanging and abort are the
			// remedies when it does not).
			described = true
			holders := t.pendingOffsetTransactions(ctx)
			t.trouble.wait(fmt.Sprintf("stable committed offsets of task %s, past the transaction timeout: the transactions open on %s", t.name, holders), 0)
			t.log.Warn("Committed offsets still not stable past the transaction timeout; the transactions holding them", zap.String("transactions", holders),
				zap.Duration("waited", time.Since(began).Round(time.Second)), zap.Error(err))
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

// stableOffsets asks the group coordinator for the committed offsets of
// the task's input and repartition partitions, named explicitly, with
// require_stable: nil when neither has a pending transactional commit.
// Named, because Kafka answers a fetch of all the group's offsets with the
// partitions that have a committed offset only: a partition whose first
// commit is pending in an open transaction is missing from that answer,
// where asked for by name it is UNSTABLE_OFFSET_COMMIT. The request goes
// through the group client, which consumes both topics: it knows their ids
// (OffsetFetch v10 names topics by id) without a metadata lookup of its
// own.
func (t *task) stableOffsets(ctx context.Context) error {
	e := t.deps.env
	topics := []string{e.cfg.InputTopic, e.cfg.RepartitionTopic()}
	req := kmsg.NewPtrOffsetFetchRequest()
	req.RequireStable = true
	g := kmsg.NewOffsetFetchRequestGroup()
	g.Group = e.cfg.ApplicationID
	for _, topic := range topics {
		rt := kmsg.NewOffsetFetchRequestGroupTopic()
		rt.Topic = topic
		rt.Partitions = []int32{t.partition}
		g.Topics = append(g.Topics, rt)
	}
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(ctx, t.deps.client)
	if err != nil {
		return fmt.Errorf("fetching the committed offsets of task %s: %w", t.name, err)
	}
	if len(resp.Groups) != 1 {
		return fmt.Errorf("fetching the committed offsets of task %s: %d groups answered, want 1", t.name, len(resp.Groups))
	}
	if err := kerr.ErrorForCode(resp.Groups[0].ErrorCode); err != nil {
		return fmt.Errorf("fetching the committed offsets of task %s: %w", t.name, err)
	}
	seen := map[string]bool{}
	for _, rt := range resp.Groups[0].Topics {
		for _, rp := range rt.Partitions {
			if rp.Partition != t.partition {
				continue
			}
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return fmt.Errorf("offset of %s-%d: %w", rt.Topic, rp.Partition, err)
			}
			seen[rt.Topic] = true
		}
	}
	for _, topic := range topics {
		if !seen[topic] {
			return fmt.Errorf("offset of %s-%d: not in the answer", topic, t.partition)
		}
	}
	return nil
}

// waitSettledChangelog returns the last stable offset of the task's
// changelog partition to restore to, once every transaction that holds
// records below the end it had then (its high watermark) has ended there;
// stable is the last stable offset just read. The last stable offset stops
// at the first record of the oldest transaction still open, and records
// committed past it are not readable until that transaction ends: a
// restore that stopped there misses them for good when the input resumes
// past the events they hold. That happens when
//
//   - the previous owner's last transaction is decided but its marker has
//     not reached the changelog yet (its leader failing over): the offsets
//     topic can already hold the commit;
//   - an older owner's transaction is still open below a newer owner's
//     committed records (the older one cut off, its transaction aborted
//     only by the coordinator's timeout, while the newer one ran the task
//     for a while and lost it);
//   - a marker lands between reading the last stable offset and the high
//     watermark.
//
// So every open transaction below the end is waited for, whatever its state:
// one nobody ends is aborted by the coordinator within the transaction
// timeout, and a restarted producer ends its own at once. The wait names the
// transactions and their states when they can be read, shows in the task's
// status and is logged once.
func (t *task) waitSettledChangelog(ctx context.Context, tp string, stable int64) (int64, error) {
	e := t.deps.env
	hw, err := t.changelogHighWatermark(ctx, tp)
	if err != nil || stable >= hw {
		return stable, err
	}
	defer t.clearWait()
	began := time.Now()
	open := t.openTransactions(ctx, hw)
	wait := 50 * time.Millisecond
	logged := false
	for {
		// Read after the transactions were described: one that ended
		// meanwhile is past the offset read before.
		_, end, err := t.changelogBounds(ctx, tp)
		if err != nil {
			return 0, err
		}
		if end >= hw {
			if logged || end != stable {
				t.log.Info(fmt.Sprintf("task [%s] Changelog %s transactions ended; restoring to offset %d", t.name, tp, end),
					zap.Int64("stable_before", stable), zap.Duration("waited", time.Since(began).Round(time.Millisecond)))
			}
			return end, nil
		}
		if !logged {
			logged = true
			what := fmt.Sprintf("the transactions open on changelog %s below offset %d to end (last stable offset %d): %s", tp, hw, end, open)
			t.trouble.wait(what, e.cfg.TransactionTimeout()+txnAbortCheck)
			t.log.Info(fmt.Sprintf("task [%s] Waiting for %s", t.name, what))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// replicationWait is how long a wait for a changelog's records to be copied
// to the in-sync replicas is expected to take at most: a follower that does
// not copy them is dropped from the in-sync replicas after the broker's
// replica.lag.time.max.ms (30 s by default), or fenced by the controller
// sooner when its broker stopped.
const replicationWait = 45 * time.Second

// waitReplicatedChangelog waits until the changelog partition's high
// watermark covers every record its leader had appended when the wait began.
// A previous owner's last records can be on
// the leader only, its followers not having copied them yet (one paused,
// restarting or slow): a restore that stopped at the high watermark would
// miss them, the task would fold their events again from the committed input
// offsets, and the records would become readable after the task's own, a
// total going down and up again for a reader of the changelog (seen under
// at-least-once; exactly-once has the same gap for a transaction whose
// commit marker lands before its records are copied). Records the leader
// drops instead (it fails before they are copied) end the wait too. While
// the leader's end cannot be read, the restore waits for it (retrying with
// backoff, shown in the task's status): the high watermark alone does not
// tell whether such records exist.
func (t *task) waitReplicatedChangelog(ctx context.Context, tp string) error {
	ends, err := t.changelogLogEnd(ctx, tp)
	if err != nil {
		return err
	}
	target := ends.LogEnd
	began := time.Now()
	wait := 50 * time.Millisecond
	logged := false
	defer func() {
		if logged {
			t.clearWait()
		}
	}()
	for {
		if ends.HighWatermark >= target {
			if logged {
				t.log.Info(fmt.Sprintf("task [%s] Changelog %s records copied to the in-sync replicas up to offset %d", t.name, tp, ends.HighWatermark),
					zap.Duration("waited", time.Since(began).Round(time.Millisecond)))
			}
			return nil
		}
		if ends.LogEnd < target {
			// A new leader without the records: they are gone.
			t.log.Info(fmt.Sprintf("task [%s] Changelog %s records from offset %d on were dropped by a leader change", t.name, tp, ends.LogEnd),
				zap.Int64("appended_end", target))
			target = ends.LogEnd
			continue
		}
		if !logged {
			logged = true
			what := fmt.Sprintf("the records of changelog %s its leader appended up to offset %d to be copied to the in-sync replicas (high watermark %d)", tp, target, ends.HighWatermark)
			t.trouble.wait(what, replicationWait)
			t.log.Info(fmt.Sprintf("task [%s] Waiting for %s", t.name, what))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
		if ends, err = t.changelogLogEnd(ctx, tp); err != nil {
			return err
		}
	}
}

// changelogLogEnd returns the high watermark of the task's changelog
// partition and the end of its leader's log, as changelogBounds does the
// bounds: for as long as ctx lets it, never the high watermark alone (the
// records above it are what the wait is for).
func (t *task) changelogLogEnd(ctx context.Context, tp string) (changelog.LeaderEnds, error) {
	onRetry, done := t.listRetry(tp)
	defer done()
	return changelog.LogEnd(ctx, t.deps.env.client, t.totals.changelog, t.partition, onRetry)
}

// openTransactions describes the transactions open on the task's changelog
// partition below hw, for the operator: "<transactional id> (<state>)",
// the coordinator's state (Ongoing; PrepareCommit or PrepareAbort while its
// markers are on their way), or what could not be read.
func (t *task) openTransactions(ctx context.Context, hw int64) string {
	return describeOpenTransactions(ctx, t.deps.env.admin, t.totals.changelog, t.partition, hw)
}

// describeOpenTransactions describes the transactions that hold records
// below offset below (any offset when below < 0) on one partition: each as
// "<transactional id> (<state>, open <age>, timeout <timeout>)" as its
// coordinator lists and describes it, "<transactional id> (<state>)" when only the
// listing answered, "producer <id>" when neither did; or what could not be
// read.
func describeOpenTransactions(ctx context.Context, admin *kadm.Client, topic string, partition int32, below int64) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	described, err := admin.DescribeProducers(ctx, kadm.TopicsSet{topic: {partition: {}}})
	if err != nil {
		return fmt.Sprintf("their producers could not be described: %v", err)
	}
	dp, ok := described[topic].Partitions[partition]
	switch {
	case !ok:
		return fmt.Sprintf("partition %d not described", partition)
	case dp.Err != nil:
		return fmt.Sprintf("their producers could not be described: %v", dp.Err)
	}
	var ids []int64
	for _, pr := range dp.ActiveProducers {
		if pr.CurrentTxnStartOffset >= 0 && (below < 0 || pr.CurrentTxnStartOffset < below) {
			ids = append(ids, pr.ProducerID)
		}
	}
	if len(ids) == 0 {
		return "none open any more"
	}
	byID := map[int64]kadm.ListedTransaction{}
	listed, err := admin.ListTransactions(ctx, ids, nil)
	var txnIDs []string
	for _, l := range listed {
		byID[l.ProducerID] = l
		txnIDs = append(txnIDs, l.TxnID)
	}
	full := map[string]kadm.DescribedTransaction{}
	if len(txnIDs) > 0 {
		if ds, derr := admin.DescribeTransactions(ctx, txnIDs...); derr == nil {
			for id, d := range ds {
				if d.Err == nil && d.ProducerID >= 0 {
					full[id] = d
				}
			}
		}
	}
	var out []string
	for _, id := range ids {
		l, ok := byID[id]
		if !ok {
			out = append(out, fmt.Sprintf("producer %d", id))
			continue
		}
		d, ok := full[l.TxnID]
		if !ok || d.StartTimestamp <= 0 {
			out = append(out, fmt.Sprintf("%s (%s)", l.TxnID, l.State))
			continue
		}
		age := time.Since(time.UnixMilli(d.StartTimestamp)).Round(time.Second)
		out = append(out, fmt.Sprintf("%s (%s, open %s, timeout %s)", l.TxnID, l.State, age, time.Duration(d.TimeoutMillis)*time.Millisecond))
	}
	sort.Strings(out)
	desc := strings.Join(out, ", ")
	if err != nil {
		desc += fmt.Sprintf(" (their states could not be read: %v)", err)
	}
	return desc
}

// offsetsTopic is Kafka's topic of committed offsets.
const offsetsTopic = "__consumer_offsets"

// offsetsPartition is the partition of the offsets topic, of n partitions,
// that holds group's commits: Kafka's abs(String.hashCode) modulo n
// (GroupCoordinator's partitionFor), the hash over the UTF-16 code units.
func offsetsPartition(group string, n int32) int32 {
	var h int32
	for _, u := range utf16.Encode([]rune(group)) {
		h = 31*h + int32(u)
	}
	if h == math.MinInt32 {
		h = 0
	} else if h < 0 {
		h = -h
	}
	return h % n
}

// pendingOffsetTransactions describes the transactions open on the
// partition of the offsets topic that holds the group's commits: those whose
// transactional offset commits keep the committed offsets unstable.
func (t *task) pendingOffsetTransactions(ctx context.Context) string {
	e := t.deps.env
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	topics, err := e.admin.ListTopicsWithInternal(ctx, offsetsTopic)
	if err != nil {
		return fmt.Sprintf("the offsets topic could not be described: %v", err)
	}
	td, ok := topics[offsetsTopic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		return fmt.Sprintf("the offsets topic could not be described: %v", td.Err)
	}
	p := offsetsPartition(e.cfg.ApplicationID, int32(len(td.Partitions)))
	return fmt.Sprintf("%s-%d: %s", offsetsTopic, p, describeOpenTransactions(ctx, e.admin, offsetsTopic, p, -1))
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
	if err := t.waitReplicatedChangelog(ctx, tp); err != nil {
		return 0, 0, false, err
	}
	logStart, end, err := t.changelogBounds(ctx, tp)
	if err != nil {
		return 0, 0, false, err
	}
	if t.deps.env.eos {
		if end, err = t.waitSettledChangelog(ctx, tp, end); err != nil {
			return 0, 0, false, err
		}
	}
	cp, found, err := t.totals.store.Load().Checkpoint()
	if err != nil {
		return 0, 0, false, err
	}
	changelogID := t.deps.topo.changelogID
	if from, ok := checkCheckpoint(t.log, t.deps.env.cfg.StoreName, t.name, tp, cp, found, logStart, end, t.deps.env.changelogIdentity(ctx, changelogID)); ok {
		t.totals.cp = cp
		t.stats.checkpoint.Store(cp.ChangelogOffset)
		return from, end, false, nil
	}
	if found {
		if err := t.wipe(); err != nil {
			return 0, 0, false, err
		}
	}
	t.totals.cp = state.Checkpoint{ChangelogOffset: logStart, InputOffset: -1, ChangelogTopicID: changelogID}
	// No checkpoint (every write carries one: the store holds nothing), or
	// wiped: the store is empty.
	return logStart, end, true, nil
}

// checkCheckpoint tells whether a store's checkpoint can be resumed from
// against the changelog's [logStart, end): ok with the offset to resume
// at, or not, logged (a store without checkpoint starts at the log start; a
// checkpoint of another changelog (see changelogIdentity) or of a recreated
// one, beyond its end or below its start makes the store void: wipe it).
func checkCheckpoint(log *zap.Logger, storeName, name, tp string, cp state.Checkpoint, found bool, logStart, end int64, changelog changelogIdentity) (int64, bool) {
	var zeroID [16]byte
	switch {
	case !found:
		log.Info(fmt.Sprintf("task [%s] State store %s did not find checkpoint offset, hence would default to the starting offset at changelog %s",
			name, storeName, tp))
	case cp.ChangelogTopicID != zeroID && cp.ChangelogTopicID != changelog.id:
		if other := changelog.nameOf(cp.ChangelogTopicID); other != "" && other != changelog.topic {
			log.Warn(fmt.Sprintf("task [%s] The checkpoint is of changelog %s, not %s: the store was written under another application.id or store.name; wiping the store and restoring from the start",
				name, other, changelog.topic),
				zap.Int64("checkpoint", cp.ChangelogOffset), zap.String("checkpoint_changelog", other))
			break
		}
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

// openStore opens the task's store with the runtime's options.
func (t *task) openStore() error {
	s, err := state.Open(t.deps.env.dir.TaskPath(t.partition), t.log, t.deps.env.storeOptions())
	if err != nil {
		return err
	}
	t.totals.store.Store(s)
	return nil
}

// beginBulk begins the bulk load of the task's empty store: the changelog's
// records sorted in the memory the process's loads share, and written once,
// straight into the last level (state.Store.BulkLoad).
func (t *task) beginBulk() (*state.BulkLoad, error) {
	e := t.deps.env
	return t.totals.store.Load().BulkLoad(state.BulkOptions{
		Budget:       e.bulkBudget,
		AfterSpill:   func(int) { e.crashPoint("bulk-spilled") },
		BeforeIngest: func() { e.crashPoint("bulk-ingest") },
	})
}

// finishBulk ends a bulk restore: the sorted runs merged into tables and
// ingested with the checkpoint, in one step.
func (t *task) finishBulk(ctx context.Context, load *state.BulkLoad) error {
	began := time.Now()
	st, err := load.Finish(ctx, t.totals.cp)
	if err != nil {
		return err
	}
	t.stats.checkpoint.Store(t.totals.cp.ChangelogOffset)
	d := time.Since(began)
	t.log.Info(fmt.Sprintf("task [%s] Bulk-loaded the restored store: %d products from %d records in %d sorted runs, %d tables ingested in %d ms",
		t.name, st.Products, st.Updates, st.Runs, st.Tables, d.Milliseconds()),
		zap.Int64("products", st.Products), zap.Int("runs", st.Runs), zap.Int("tables", st.Tables), zap.Duration("duration", d))
	return nil
}

// wipe deletes the task's store and opens an empty one.
func (t *task) wipe() error {
	if s := t.totals.store.Swap(nil); s != nil {
		if err := s.Close(); err != nil {
			t.log.Warn("Closing store before wiping it", zap.Error(err))
		}
	}
	if err := t.deps.env.dir.Wipe(t.partition); err != nil {
		return err
	}
	if err := t.openStore(); err != nil {
		return err
	}
	t.totals.cp = state.Checkpoint{InputOffset: -1, ChangelogTopicID: t.deps.topo.changelogID}
	return nil
}

// replay reads the changelog partition over [from, to) and writes each
// fetch as one Pebble batch with the checkpoint after it, or adds it to
// load, when there is one, with the checkpoint in t.totals.cp for its Finish.
// It returns the number of records restored and the end it read to (to, or
// later when the changelog grew while it read).
func (t *task) replay(ctx context.Context, from, to int64, load *state.BulkLoad) (int64, int64, error) {
	e := t.deps.env
	if from >= to {
		if t.totals.cp.ChangelogOffset != from || t.totals.cp.ChangelogTopicID != t.deps.topo.changelogID {
			t.totals.cp.ChangelogOffset, t.totals.cp.ChangelogTopicID = from, t.deps.topo.changelogID
			if err := t.totals.store.Load().Apply(nil, t.totals.cp); err != nil {
				return 0, to, err
			}
		}
		t.stats.checkpoint.Store(t.totals.cp.ChangelogOffset)
		return 0, to, nil
	}
	topic := t.totals.changelog
	r, err := changelog.Open(changelog.Options{Client: e.kafkaOpts(), Topic: topic, TopicID: t.deps.topo.changelogID,
		Partition: t.partition, From: from, FetchBytes: restoreFetchBytes, Log: t.log})
	if err != nil {
		return 0, to, err
	}
	defer r.Close()
	rp := replayProgress{t: t, tp: fmt.Sprintf("%s-%d", topic, t.partition), from: from, to: to, began: time.Now()}
	rp.lastLog = rp.began
	rp.every = restoreProgressEvery
	if e.knobs.RestoreProgressEvery > 0 {
		rp.every = e.knobs.RestoreProgressEvery
	}
	next := from
	var updates []state.Update
	for next < rp.to {
		b, err := r.Next(ctx)
		if err != nil {
			return rp.n, rp.to, err
		}
		if b.SkippedFrom >= 0 && len(b.Records) == 0 {
			t.log.Info(fmt.Sprintf("task [%s] Changelog %s holds nothing to read from offset %d to %d (aborted or compacted records); skipping past them", t.name, rp.tp, b.SkippedFrom, b.Next),
				zap.Int64("from", b.SkippedFrom), zap.Int64("to", b.Next))
		}
		if load != nil {
			// Straight into the load: the offsets header's bytes are the
			// stored entry's, with no decoding and no Update per record.
			if next, err = rp.each(b, next, func(rec *kgo.Record) error {
				total, offs, del, err := changelog.Encoded(rec)
				if err != nil {
					changelog.LogUnreadable(t.log, rp.tp, rec.Offset, err)
					return nil
				}
				return load.AddEncoded(rec.Key, total, offs, del)
			}); err != nil {
				return rp.n, rp.to, err
			}
			t.totals.cp.ChangelogOffset = max(t.totals.cp.ChangelogOffset, min(next, rp.to))
		} else if updates, next = rp.apply(b, updates[:0], next); len(updates) > 0 || next > t.totals.cp.ChangelogOffset {
			cp := t.totals.cp
			cp.ChangelogOffset = min(next, rp.to)
			// Unsynced until the last fetch: a crash loses whole batches
			// with their checkpoints (the changelog has them again), and
			// the final synced write makes everything before it durable.
			apply := t.totals.store.Load().ApplyUnsynced
			if next >= rp.to {
				apply = t.totals.store.Load().Apply
			}
			if err := apply(updates, cp); err != nil {
				return rp.n, rp.to, err
			}
			t.totals.cp = cp
			t.stats.checkpoint.Store(cp.ChangelogOffset)
		}
		t.stats.restored.Store(rp.n)
		rp.logProgress(next)
	}
	return rp.n, rp.to, nil
}

// replayProgress is a replay's range, count and progress log.
type replayProgress struct {
	t              *task
	tp             string
	from, to       int64
	n              int64
	extended       int
	began, lastLog time.Time
	every          time.Duration
}

// each calls fn with the batch's records below the end: a record at or
// past it ends the replay (the records just before the end may be gone,
// compacted or an aborted tail the reader skips), unless the changelog grew
// (the batch's stable end is past it), when the replay reads on to the new
// end, at most maxRestoreExtensions times. It returns the position after
// them, or fn's first error.
func (rp *replayProgress) each(b changelog.Batch, next int64, fn func(*kgo.Record) error) (int64, error) {
	t := rp.t
	for _, rec := range b.Records {
		if rec.Offset >= rp.to && rp.extended < maxRestoreExtensions && b.StableEnd > rp.to {
			// Written meanwhile; the records just before the end may have
			// been compacted away for these: read on to the stable end.
			rp.extended++
			t.log.Info(fmt.Sprintf("task [%s] Changelog %s grew while restoring; reading on to offset %d", t.name, rp.tp, b.StableEnd),
				zap.Int64("was", rp.to), zap.Int64("end_offset", b.StableEnd))
			rp.to = b.StableEnd
			t.stats.restoreTo.Store(rp.to)
		}
		if rec.Offset >= rp.to {
			return rp.to, nil
		}
		next = rec.Offset + 1
		rp.n++
		if err := fn(rec); err != nil {
			return next, err
		}
	}
	// The batch's position passes markers and invisible records too.
	return max(next, min(b.Next, rp.to)), nil
}

// apply adds to updates the store updates of the batch's records below the
// end (see each), and returns them with the position after them.
func (rp *replayProgress) apply(b changelog.Batch, updates []state.Update, next int64) ([]state.Update, int64) {
	next, _ = rp.each(b, next, func(rec *kgo.Record) error {
		u, err := changelog.Update(rec)
		if err != nil {
			changelog.LogUnreadable(rp.t.log, rp.tp, rec.Offset, err)
			return nil
		}
		updates = append(updates, u)
		return nil
	})
	return updates, next
}

// logProgress logs the replay's progress every rp.every.
func (rp *replayProgress) logProgress(next int64) {
	now := time.Now()
	if now.Sub(rp.lastLog) < rp.every {
		return
	}
	rp.lastLog = now
	done := next - rp.from
	rate := float64(done) / now.Sub(rp.began).Seconds()
	eta := time.Duration(0)
	if rate > 0 {
		eta = time.Duration(float64(rp.to-next) / rate * float64(time.Second))
	}
	total := rp.to - rp.from
	rp.t.log.Info(fmt.Sprintf("task [%s] Restoring changelog %s: %d of %d offsets done (%.0f records/s, ETA %s)", rp.t.name, rp.tp, done, total, rate, eta.Round(time.Second)),
		zap.Int64("records", rp.n), zap.Int64("done", done), zap.Int64("total", total), zap.Float64("rate", rate), zap.Duration("eta", eta))
}
