package changelog

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
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
