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

// Bounds returns the log start and the last stable offset of partition p of
// topic, retrying for as long as ctx lets it (right after the topic is
// created, or while a broker restarts, the partition can be unknown for a
// while); each attempt is bounded to 5 s. onRetry, when not nil, is called
// after each failed attempt with its number and error.
func Bounds(ctx context.Context, adm *kadm.Client, topic string, p int32, onRetry func(attempt int, err error)) (logStart, end int64, err error) {
	lookup := func(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
		offs, err := list(ctx, topic)
		if err == nil {
			err = offs.Error()
		}
		if err != nil {
			return 0, err
		}
		o, ok := offs.Lookup(topic, p)
		if !ok {
			return 0, kerr.UnknownTopicOrPartition
		}
		return o.Offset, nil
	}
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		logStart, err = lookup(actx, adm.ListStartOffsets)
		if err == nil {
			// The last stable offset: readers take committed records only.
			end, err = lookup(actx, adm.ListCommittedOffsets)
		}
		cancel()
		if err == nil {
			return logStart, end, nil
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		if onRetry != nil {
			onRetry(attempt, err)
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// HighWatermark returns the end of partition p of topic as read
// uncommitted (the high watermark: past every record, of open transactions
// too), retrying as Bounds does.
func HighWatermark(ctx context.Context, adm *kadm.Client, topic string, p int32, onRetry func(attempt int, err error)) (int64, error) {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		offs, err := adm.ListEndOffsets(actx, topic)
		cancel()
		if err == nil {
			err = offs.Error()
		}
		if err == nil {
			o, ok := offs.Lookup(topic, p)
			if ok {
				return o.Offset, nil
			}
			err = kerr.UnknownTopicOrPartition
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if onRetry != nil {
			onRetry(attempt, err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
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
// its leader's log. It lists the partition's end (ListOffsets: the high
// watermark and the leader epoch), then asks that leader, as a consumer, for
// the end of its epoch (OffsetForLeaderEpoch); one attempt, bounded to 5 s.
// A leader that changed in between answers FENCED_LEADER_EPOCH: ask again.
func LogEnd(ctx context.Context, cl *kgo.Client, topic string, p int32) (LeaderEnds, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// This partition only: a request for the whole topic waits on the
	// leaders of its other partitions too, one of which may be down.
	lreq := kmsg.NewPtrListOffsetsRequest()
	lreq.ReplicaID = -1
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	lp := kmsg.NewListOffsetsRequestTopicPartition()
	lp.Partition = p
	lp.CurrentLeaderEpoch = -1
	lp.Timestamp = -1 // the latest: the high watermark, read uncommitted
	lt.Partitions = append(lt.Partitions, lp)
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, cl)
	if err != nil {
		return LeaderEnds{}, err
	}
	var lo struct {
		Offset      int64
		LeaderEpoch int32
	}
	found := false
	for _, t := range lresp.Topics {
		for _, rp := range t.Partitions {
			if t.Topic != topic || rp.Partition != p {
				continue
			}
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return LeaderEnds{}, err
			}
			lo.Offset, lo.LeaderEpoch, found = rp.Offset, rp.LeaderEpoch, true
		}
	}
	if !found {
		return LeaderEnds{}, kerr.UnknownTopicOrPartition
	}
	req := kmsg.NewPtrOffsetForLeaderEpochRequest()
	req.ReplicaID = -1 // a consumer: only the leader answers
	rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
	rp.Partition = p
	rp.CurrentLeaderEpoch = lo.LeaderEpoch
	rp.LeaderEpoch = lo.LeaderEpoch
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
			if rp.LeaderEpoch != lo.LeaderEpoch || rp.EndOffset < lo.Offset {
				return LeaderEnds{}, fmt.Errorf("%s-%d: the leader of epoch %d ends its log at %d (epoch %d), below the high watermark %d it gave",
					topic, p, lo.LeaderEpoch, rp.EndOffset, rp.LeaderEpoch, lo.Offset)
			}
			return LeaderEnds{HighWatermark: lo.Offset, LogEnd: rp.EndOffset}, nil
		}
	}
	return LeaderEnds{}, fmt.Errorf("offset for leader epoch of %s-%d: not in the answer", topic, p)
}
