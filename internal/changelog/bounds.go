package changelog

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// attemptTimeout bounds one attempt of a listing.
const attemptTimeout = 5 * time.Second

// retrying calls attempt until it succeeds or ctx is done, each call
// bounded to attemptTimeout, waiting 100 ms after the first failure and
// twice as long after each next one, up to 2 s. onRetry, when not nil, is
// called after each failed attempt with its number and error. Right after
// a topic is created, while a broker restarts or a leader moves, a
// partition's offsets cannot be listed for a while: a restore waits, it
// never guesses.
func retrying(ctx context.Context, onRetry func(attempt int, err error), attempt func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := attempt(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if onRetry != nil {
			onRetry(n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// Timestamps of a ListOffsets request.
const (
	listEarliest int64 = -2
	listLatest   int64 = -1
)

// Isolation levels of a ListOffsets request: read uncommitted lists the
// high watermark, read committed the last stable offset.
const (
	readUncommitted int8 = 0
	readCommitted   int8 = 1
)

// listOffset lists one offset of partition p of topic, as a consumer, and
// the leader epoch it comes with. It asks for this partition only: a
// listing of the whole topic waits on the leaders of its other partitions
// too, and fails with any of them.
func listOffset(ctx context.Context, cl *kgo.Client, topic string, p int32, timestamp int64, isolation int8) (offset int64, epoch int32, err error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	req.IsolationLevel = isolation
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition = p
	rp.CurrentLeaderEpoch = -1
	rp.Timestamp = timestamp
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, 0, err
	}
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			if t.Topic != topic || rp.Partition != p {
				continue
			}
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return 0, 0, err
			}
			return rp.Offset, rp.LeaderEpoch, nil
		}
	}
	return 0, 0, kerr.UnknownTopicOrPartition
}

// Bounds returns the log start and the last stable offset of partition p
// of topic, retrying for as long as ctx lets it (see retrying).
func Bounds(ctx context.Context, cl *kgo.Client, topic string, p int32, onRetry func(attempt int, err error)) (logStart, end int64, err error) {
	err = retrying(ctx, onRetry, func(ctx context.Context) error {
		var err error
		if logStart, _, err = listOffset(ctx, cl, topic, p, listEarliest, readUncommitted); err != nil {
			return err
		}
		// The last stable offset: readers take committed records only.
		end, _, err = listOffset(ctx, cl, topic, p, listLatest, readCommitted)
		return err
	})
	return logStart, end, err
}

// HighWatermark returns the end of partition p of topic as read
// uncommitted (the high watermark: past every record, of open transactions
// too), retrying as Bounds does.
func HighWatermark(ctx context.Context, cl *kgo.Client, topic string, p int32, onRetry func(attempt int, err error)) (hw int64, err error) {
	err = retrying(ctx, onRetry, func(ctx context.Context) error {
		var err error
		hw, _, err = listOffset(ctx, cl, topic, p, listLatest, readUncommitted)
		return err
	})
	return hw, err
}

// Ends returns the last stable offset of every partition of topic.
func Ends(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	offs, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of changelog %s: %w", topic, err)
	}
	out := map[int32]int64{}
	for p, o := range offs[topic] {
		out[p] = o.Offset
	}
	return out, nil
}

// Ends of a partition: the high watermark, and the log end offset of its
// leader, past the records the leader appended that its followers have not
// copied yet. The high watermark stops before those; they become readable
// once the in-sync replicas have them, or vanish if the leader fails first.
type LeaderEnds struct {
	HighWatermark, LogEnd int64
}

// LogEnd returns the high watermark of partition p of topic and the end of
// its leader's log, retrying as Bounds does: it lists the partition's end
// (the high watermark and the leader epoch), then asks that leader, as a
// consumer, for the end of its epoch (OffsetForLeaderEpoch). A leader that
// changed in between answers FENCED_LEADER_EPOCH, or with another epoch:
// ask again.
func LogEnd(ctx context.Context, cl *kgo.Client, topic string, p int32, onRetry func(attempt int, err error)) (ends LeaderEnds, err error) {
	err = retrying(ctx, onRetry, func(ctx context.Context) error {
		var err error
		ends, err = logEnd(ctx, cl, topic, p)
		return err
	})
	return ends, err
}

// logEnd is one attempt of LogEnd.
func logEnd(ctx context.Context, cl *kgo.Client, topic string, p int32) (LeaderEnds, error) {
	hw, epoch, err := listOffset(ctx, cl, topic, p, listLatest, readUncommitted)
	if err != nil {
		return LeaderEnds{}, err
	}
	req := kmsg.NewPtrOffsetForLeaderEpochRequest()
	req.ReplicaID = -1 // a consumer: only the leader answers
	rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
	rp.Partition = p
	rp.CurrentLeaderEpoch = epoch
	rp.LeaderEpoch = epoch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return LeaderEnds{}, err
	}
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			if t.Topic != topic || rp.Partition != p {
				continue
			}
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return LeaderEnds{}, err
			}
			if rp.LeaderEpoch != epoch || rp.EndOffset < hw {
				return LeaderEnds{}, fmt.Errorf("%s-%d: the leader of epoch %d ends its log at %d (epoch %d), below the high watermark %d it gave",
					topic, p, epoch, rp.EndOffset, rp.LeaderEpoch, hw)
			}
			return LeaderEnds{HighWatermark: hw, LogEnd: rp.EndOffset}, nil
		}
	}
	return LeaderEnds{}, fmt.Errorf("offset for leader epoch of %s-%d: not in the answer", topic, p)
}
