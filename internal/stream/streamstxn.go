package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/zap"
)

// Exactly-once in a streams group (group.protocol=streams with
// processing.guarantee=exactly_once_v2). franz-go's GroupTransactSession
// puts the input offsets of a classic group in the transaction; a streams
// member's go in here, the way Kafka Streams' do: TxnOffsetCommit in the
// member's name (its member id and epoch), so that the coordinator refuses
// the commit of a member it fenced or moved past, and the transaction
// carrying it aborts. The cycle is eos.go's; only the client differs:
//
//   - the positions to commit are kept here, from the records the poll loop
//     handed to tasks (there is no franz-go group to track them);
//   - an abort moves every partition back to its last committed offset;
//   - franz-go ends a transaction (EndTxn) only once one of its produces
//     succeeded: a cycle that produced nothing has no transaction at the
//     broker, and its offsets are committed outside one (they reflect
//     records that changed no total);
//   - a revoke commits the open transaction before the task goes (eos.go,
//     revoked), so the next owner starts where this one stopped;
//   - the transactions run the protocol before KIP-890 part 2 (requests
//     capped at its versions, transactionV1), for franz-go's requests and
//     this file's alike.
//
// Everything but Client, PollRecords and Close runs under session.between:
// in the poll loop's dispatch and cycle, or in the heartbeat loop's
// reconcile.

// txnSession is an exactly-once session's transactional client: franz-go's
// GroupTransactSession (classic) or streamsTxn (streams).
type txnSession interface {
	Client() *kgo.Client
	Begin() error
	PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches
	// End flushes, commits the input offsets in the transaction and ends
	// it; on an abort every position moves back to what is committed.
	End(ctx context.Context, try kgo.TransactionEndTry) (committed bool, err error)
	Close()
}

var (
	_ txnSession = (*kgo.GroupTransactSession)(nil)
	_ txnSession = (*streamsTxn)(nil)
)

// streamsTxn is the transactional client of an exactly-once streams member.
type streamsTxn struct {
	g     *streamsGroup
	cl    *kgo.Client
	txnID string
	log   *zap.Logger
	// acked counts the records acknowledged since Begin (a produce hook).
	acked atomic.Int64
	// gen counts the (re)starts of partitions: a rewind or a new
	// consumption moves the client's position and drops what it had
	// fetched. Records polled before a partition's start (txnPosition.gen)
	// are not handed out (gone).
	gen atomic.Uint64
	// mu guards pos; it is written under session.between only.
	mu  sync.Mutex
	pos map[topicPartition]*txnPosition
}

type topicPartition struct {
	topic string
	p     int32
}

// txnPosition is what streamsTxn knows of one consumed partition.
type txnPosition struct {
	// from is where an abort reads the partition again from: the offset
	// committed last, or, before any commit, the first record handed out
	// (exact) or the reset offset.
	from  kgo.Offset
	exact bool
	// next is past the last record handed to a task; moved says it moved
	// since the last commit.
	next  kgo.EpochOffset
	moved bool
	// gen is streamsTxn.gen when the partition was last (re)started.
	gen uint64
}

func newStreamsTxn(g *streamsGroup, opts []kgo.Opt, txnID string, timeout time.Duration) (*streamsTxn, error) {
	x := &streamsTxn{g: g, txnID: txnID, log: g.s.env.log, pos: map[topicPartition]*txnPosition{}}
	hook := producedHook{acked: &x.acked}
	cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(txnID), kgo.TransactionTimeout(timeout), kgo.WithHooks(hook),
		kgo.MaxVersions(transactionV1()))...)
	if err != nil {
		return nil, err
	}
	x.cl = cl
	g.txn = x
	return x, nil
}

// producedHook counts the records the brokers acknowledged.
type producedHook struct{ acked *atomic.Int64 }

func (h producedHook) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err == nil {
		h.acked.Add(1)
	}
}

func (x *streamsTxn) Client() *kgo.Client { return x.cl }

func (x *streamsTxn) Close() { x.cl.Close() }

func (x *streamsTxn) PollRecords(ctx context.Context, n int) kgo.Fetches {
	return x.cl.PollRecords(ctx, n)
}

// transactionV1 are the request versions of the transactions before
// KIP-890 part 2 (transaction.version 1), which every broker since 0.11
// takes: franz-go then adds each partition with AddPartitionsToTxn and ends
// with an EndTxn that keeps the producer epoch, and the offsets are added
// with AddOffsetsToTxn before TxnOffsetCommit. One mode, chosen here for
// franz-go's requests and this file's alike: with part 2, franz-go decides
// at each Begin from the versions it cached, which this file cannot see.
func transactionV1() *kversion.Versions {
	v := kversion.Stable()
	v.SetMaxKeyVersion(int16(kmsg.Produce), 11)
	v.SetMaxKeyVersion(int16(kmsg.EndTxn), 4)
	v.SetMaxKeyVersion(int16(kmsg.TxnOffsetCommit), 4)
	return v
}

// Begin begins a transaction.
func (x *streamsTxn) Begin() error {
	x.acked.Store(0)
	return x.cl.BeginTransaction()
}

// consumed records partitions the member now reads, from where.
func (x *streamsTxn) consumed(from map[string]map[int32]kgo.Offset) {
	x.mu.Lock()
	defer x.mu.Unlock()
	gen := x.gen.Add(1)
	for topic, ps := range from {
		for p, o := range ps {
			x.pos[topicPartition{topic, p}] = &txnPosition{from: o, exact: o.EpochOffset().Offset >= 0, gen: gen}
		}
	}
}

// polling returns the generation a poll starts at (see gone).
func (x *streamsTxn) polling() uint64 { return x.gen.Load() }

// released forgets the partitions of tasks ps: they are no longer read.
func (x *streamsTxn) released(topics map[string][]int32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for topic, ps := range topics {
		for _, p := range ps {
			delete(x.pos, topicPartition{topic, p})
		}
	}
}

// gone returns the partitions of fetches whose records are not handed out:
// those this member no longer reads (a revoke between the poll and the
// hand-out), and those started again since the poll began at generation
// polled (a rewind or a new consumption, by the heartbeat loop while the
// poll ran): what the poll holds of them may come from before. Those are
// read again from where the hand-out stands (past the last record handed
// out, or where the partition started), which is always right.
func (x *streamsTxn) gone(fetches kgo.Fetches, polled uint64) map[int32]bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	var skip map[int32]bool
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		if pos, ok := x.pos[topicPartition{fp.Topic, fp.Partition}]; ok && pos.gen <= polled {
			return
		}
		if skip == nil {
			skip = map[int32]bool{}
		}
		skip[fp.Partition] = true
	})
	// A task's records are skipped for both its topics: both are read
	// again.
	again := map[string]map[int32]kgo.Offset{}
	for tp, pos := range x.pos {
		if skip[tp.p] {
			if again[tp.topic] == nil {
				again[tp.topic] = map[int32]kgo.Offset{}
			}
			again[tp.topic][tp.p] = pos.handOutAt()
		}
	}
	if len(again) > 0 {
		gen := x.gen.Add(1)
		remove := map[string][]int32{}
		for topic, ps := range again {
			for p := range ps {
				remove[topic] = append(remove[topic], p)
				x.pos[topicPartition{topic, p}].gen = gen
			}
		}
		x.cl.RemoveConsumePartitions(remove)
		x.cl.AddConsumePartitions(again)
	}
	return skip
}

// handOutAt is where the hand-out of the partition stands: past the last
// record handed out, or where it started.
func (pos *txnPosition) handOutAt() kgo.Offset {
	if pos.moved {
		return kgo.NewOffset().At(pos.next.Offset).WithEpoch(pos.next.Epoch)
	}
	return pos.from
}

// handedOut moves the positions past the records of fetches handed to
// tasks (all but those of skip).
func (x *streamsTxn) handedOut(fetches kgo.Fetches, skip map[int32]bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 || skip[fp.Partition] {
			return
		}
		pos, ok := x.pos[topicPartition{fp.Topic, fp.Partition}]
		if !ok {
			return
		}
		if !pos.exact {
			pos.from, pos.exact = kgo.NewOffset().At(fp.Records[0].Offset), true
		}
		last := fp.Records[len(fp.Records)-1]
		pos.next, pos.moved = kgo.EpochOffset{Epoch: last.LeaderEpoch, Offset: last.Offset + 1}, true
	})
}

// toCommit returns the positions that moved since the last commit.
func (x *streamsTxn) toCommit() map[string]map[int32]kgo.EpochOffset {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string]map[int32]kgo.EpochOffset{}
	for tp, pos := range x.pos {
		if !pos.moved {
			continue
		}
		if out[tp.topic] == nil {
			out[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		out[tp.topic][tp.p] = pos.next
	}
	return out
}

// committedAt records offsets as committed: an abort goes back to them.
func (x *streamsTxn) committedAt(offsets map[string]map[int32]kgo.EpochOffset) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for topic, ps := range offsets {
		for p, eo := range ps {
			if pos, ok := x.pos[topicPartition{topic, p}]; ok {
				pos.from, pos.exact = kgo.NewOffset().At(eo.Offset).WithEpoch(eo.Epoch), true
				if pos.next == eo {
					pos.moved = false
				}
			}
		}
	}
}

// rewind moves every partition back to its last committed offset, after
// an abort: what the tasks folded since is dropped, and read again.
func (x *streamsTxn) rewind() {
	x.mu.Lock()
	defer x.mu.Unlock()
	from := map[string]map[int32]kgo.Offset{}
	remove := map[string][]int32{}
	gen := x.gen.Add(1)
	for tp, pos := range x.pos {
		pos.gen = gen
		if from[tp.topic] == nil {
			from[tp.topic] = map[int32]kgo.Offset{}
		}
		from[tp.topic][tp.p] = pos.from
		remove[tp.topic] = append(remove[tp.topic], tp.p)
		pos.moved = false
	}
	if len(from) == 0 {
		return
	}
	x.cl.RemoveConsumePartitions(remove)
	x.cl.AddConsumePartitions(from)
}

// End ends the transaction: flushed, the moved positions committed in it
// (TxnOffsetCommit with the member id and epoch), then EndTxn. A commit the
// coordinator refuses (a member fenced, an older epoch) aborts the
// transaction. After an abort every partition is read again from its
// committed offset.
func (x *streamsTxn) End(ctx context.Context, try kgo.TransactionEndTry) (bool, error) {
	if try == kgo.TryCommit {
		if err := x.cl.Flush(ctx); err != nil {
			return false, err
		}
	} else if err := x.cl.AbortBufferedRecords(ctx); err != nil {
		return false, err
	}
	commit := bool(try)
	offsets := x.toCommit()
	outside := false
	var commitErr error
	if commit && len(offsets) > 0 {
		if x.acked.Load() == 0 {
			// Nothing produced: franz-go ends no transaction, so the
			// offsets cannot be in one. The records they pass changed
			// no total; they are committed after the (empty) End.
			outside = true
		} else if commitErr = x.commitOffsets(ctx, offsets); commitErr != nil {
			commit = false
		}
	}
	commit, endErr := x.end(ctx, commit)
	if endErr == nil && commit && outside {
		if commitErr = x.g.commit(ctx, offsets); commitErr != nil {
			commit = false
		}
	}
	if endErr != nil || !commit {
		x.rewind()
	} else {
		x.committedAt(offsets)
	}
	switch {
	case endErr != nil:
		return false, endErr
	case commitErr != nil && !abortableCommitError(commitErr):
		return false, commitErr
	case commitErr != nil:
		x.log.Warn("The group coordinator refused this member's offsets; the transaction is aborted and the input folded again from the committed offsets",
			zap.String("member", x.g.memberID), zap.Error(commitErr))
	}
	return commit, nil
}

// end is EndTxn, retried as an abort when the commit was not attempted or
// its outcome is unknown (as GroupTransactSession does); committed is
// whether the transaction ended committed.
func (x *streamsTxn) end(ctx context.Context, commit bool) (committed bool, err error) {
	for range 10 {
		err = x.cl.EndTransaction(ctx, kgo.TransactionEndTry(commit))
		if err == nil {
			return commit, nil
		}
		if !(errors.Is(err, kerr.OperationNotAttempted) || errors.Is(err, kerr.TransactionAbortable) || errors.Is(err, kerr.UnknownServerError)) {
			return false, err
		}
		commit = false
	}
	return false, err
}

// abortableCommitError reports whether a refused offset commit only aborts
// the transaction: the member moved on or the coordinator is moving.
func abortableCommitError(err error) bool {
	for _, e := range []error{kerr.IllegalGeneration, kerr.UnknownMemberID, kerr.StaleMemberEpoch, kerr.FencedMemberEpoch,
		kerr.GroupIDNotFound, kerr.RebalanceInProgress, kerr.CoordinatorNotAvailable, kerr.CoordinatorLoadInProgress,
		kerr.NotCoordinator, kerr.ConcurrentTransactions, kerr.UnknownServerError, kerr.TransactionAbortable, kerr.UnstableOffsetCommit, errNotMemberYet} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// commitOffsets puts offsets in the open transaction in the member's name.
func (x *streamsTxn) commitOffsets(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error {
	st, epoch := x.g.state()
	if st != memberStable {
		return errNotMemberYet
	}
	id, pepoch, err := x.cl.ProducerID(ctx)
	if err != nil {
		return err
	}
	err = retryConcurrent(ctx, func() error {
		req := kmsg.NewPtrAddOffsetsToTxnRequest()
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group = x.txnID, id, pepoch, x.g.group
		resp, err := req.RequestWith(ctx, x.cl)
		if err != nil {
			return err
		}
		return kerr.ErrorForCode(resp.ErrorCode)
	})
	if err != nil {
		return fmt.Errorf("adding the offsets to the transaction: %w", err)
	}
	ids, err := x.g.topicIDs(ctx)
	if err != nil {
		return err
	}
	return retryConcurrent(ctx, func() error {
		req := kmsg.NewPtrTxnOffsetCommitRequest()
		req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = x.txnID, x.g.group, id, pepoch
		req.Generation, req.MemberID = epoch, x.g.memberID
		for topic, ps := range offsets {
			rt := kmsg.NewTxnOffsetCommitRequestTopic()
			rt.Topic, rt.TopicID = topic, ids[topic] // by name up to v5, by id from v6
			for p, eo := range ps {
				rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch = p, eo.Offset, eo.Epoch
				rt.Partitions = append(rt.Partitions, rp)
			}
			req.Topics = append(req.Topics, rt)
		}
		resp, err := req.RequestWith(ctx, x.cl)
		if err != nil {
			return err
		}
		var errs []error
		for _, t := range resp.Topics {
			name := t.Topic
			for n, id := range ids {
				if id == t.TopicID && name == "" {
					name = n
				}
			}
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("%s-%d: %w", name, p.Partition, err))
				}
			}
		}
		if err := errors.Join(errs...); err != nil {
			if errors.Is(err, kerr.UnknownTopicID) {
				x.g.forgetTopicIDs()
			}
			return err
		}
		return nil
	})
}

// retryConcurrent runs fn until it succeeds or fails with anything but
// CONCURRENT_TRANSACTIONS (the previous transaction's markers are still
// being written), for at most 5 s.
func retryConcurrent(ctx context.Context, fn func() error) error {
	wait := 20 * time.Millisecond
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := fn()
		if !errors.Is(err, kerr.ConcurrentTransactions) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
