// Package changelog reads a task's changelog partition: its bounds (log
// start and last stable offset) and its committed records, for the restore
// of a store, a standby copy's tail, the offline verification of a store
// and the benchmarks' check of the totals. One reader for all of them, so
// that they agree on what the changelog holds.
//
// A changelog record is the product as key and its total as an 8-byte
// big-endian int64 (Kafka's LongSerializer), with the input offsets the
// total reflects in the header sales.OffsetsHeader (see Update).
package changelog

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
)

// ErrOutOfRange is returned by Next when the reader's position is below the
// partition's log start (compaction or retention moved it) or past its end.
var ErrOutOfRange = errors.New("changelog: position out of range")

// DefaultQuiet is how long Next gets nothing before it asks the broker what
// lies at its position.
const DefaultQuiet = 2 * time.Second

// Options say what a Reader reads.
type Options struct {
	// Client are the options of the reader's client (brokers, security,
	// log); the reader adds what it needs.
	Client []kgo.Opt
	// Topic, TopicID and Partition name the partition.
	Topic     string
	TopicID   [16]byte
	Partition int32
	// From is the first offset to read.
	From int64
	// FetchBytes bounds one fetch (default 2 MiB).
	FetchBytes int32
	// Quiet is how long Next gets nothing before it asks the broker what
	// lies at its position (default DefaultQuiet).
	Quiet time.Duration
	// Log gets the fetch errors Next retries.
	Log *zap.Logger
}

// Reader reads one changelog partition's committed records in offset order
// (read_committed; transaction markers are read to pass them and left out).
// Memory is bounded by one fetch of FetchBytes. Not safe for concurrent use.
type Reader struct {
	cl        *kgo.Client
	topic     string
	topicID   [16]byte
	partition int32
	next      int64
	quiet     time.Duration
	log       *zap.Logger
}

// Batch is what one Next returns.
type Batch struct {
	// Records are the data records read, in offset order, all at or past
	// the position Next started from; control records are left out.
	Records []*kgo.Record
	// Next is the position after the batch: every offset below it is read
	// (or known to hold nothing a reader is given).
	Next int64
	// StableEnd is the partition's last stable offset as the fetch saw it
	// (-1 when unknown).
	StableEnd int64
	// SkippedFrom, when below Next and Records is empty, is where a run of
	// offsets the broker holds nothing readable at began (aborted or
	// compacted records): the position moved past it.
	SkippedFrom int64
}

// Open starts a reader at o.From.
func Open(o Options) (*Reader, error) {
	if o.FetchBytes <= 0 {
		o.FetchBytes = 2 << 20
	}
	if o.Quiet <= 0 {
		o.Quiet = DefaultQuiet
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), o.Client...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.Topic: {o.Partition: kgo.NewOffset().At(o.From)}}),
		kgo.FetchMaxBytes(o.FetchBytes),
		kgo.FetchMaxPartitionBytes(o.FetchBytes),
		kgo.MaxConcurrentFetches(1),
		// Only committed records; the markers are kept so that the
		// position passes them (the last offset before the end can be one).
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		// A position below the log start is an error to see, not a silent
		// jump to the new start: what the caller holds may have keys whose
		// deletion was compacted away.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	)...)
	if err != nil {
		return nil, fmt.Errorf("creating the changelog reader of %s-%d: %w", o.Topic, o.Partition, err)
	}
	return &Reader{cl: cl, topic: o.Topic, topicID: o.TopicID, partition: o.Partition, next: o.From, quiet: o.Quiet, log: o.Log}, nil
}

// Close closes the reader's client.
func (r *Reader) Close() { r.cl.Close() }

// Position is the next offset the reader reads.
func (r *Reader) Position() int64 { return r.next }

// Next waits for records past the position and returns them. It also
// returns, with no records, when the position moved past offsets the broker
// holds nothing readable at (asked after Quiet without records). A fetch
// error is logged and retried after a second, except out of range
// (ErrOutOfRange); it returns ctx's error when ctx ends.
func (r *Reader) Next(ctx context.Context) (Batch, error) {
	for {
		qctx, cancel := context.WithTimeout(ctx, r.quiet)
		fetches := r.cl.PollFetches(qctx)
		quiet := qctx.Err() != nil && fetches.NumRecords() == 0 && !hasErrors(fetches)
		cancel()
		if err := ctx.Err(); err != nil {
			return Batch{}, err
		}
		if quiet {
			from := r.next
			vis, err := r.visibleFrom(ctx, from)
			if errors.Is(err, kerr.OffsetOutOfRange) {
				return Batch{}, fmt.Errorf("%w: %w", ErrOutOfRange, err)
			}
			if err != nil {
				r.log.Debug("Asking the broker what the changelog holds at the reader's position", zap.String("changelog", r.tp()), zap.Error(err))
				continue
			}
			if vis > from {
				r.next = vis
				return Batch{Next: vis, StableEnd: -1, SkippedFrom: from}, nil
			}
			continue
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if errors.Is(ferr, kerr.OffsetOutOfRange) {
			return Batch{}, fmt.Errorf("%w: %w", ErrOutOfRange, ferr)
		}
		if ferr != nil {
			r.log.Warn("Fetching changelog", zap.String("changelog", r.tp()), zap.Error(ferr))
			select {
			case <-ctx.Done():
				return Batch{}, ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		b := Batch{StableEnd: -1, SkippedFrom: -1}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if p.LastStableOffset >= 0 {
				b.StableEnd = p.LastStableOffset
			}
			for _, rec := range p.Records {
				if rec.Offset < r.next {
					continue
				}
				r.next = rec.Offset + 1
				if !rec.Attrs.IsControl() {
					b.Records = append(b.Records, rec)
				}
			}
		})
		b.Next = r.next
		return b, nil
	}
}

// Scan reads partition p of topic from `from` up to end (exclusive; the
// last stable offset), committed records only, and calls fn with each data
// record in offset order. Offsets the broker holds nothing readable at
// (compacted, aborted, a marker) are passed; it returns once the position
// reaches end, or ctx's error.
func Scan(ctx context.Context, client []kgo.Opt, topic string, p int32, from, end int64, fn func(*kgo.Record)) error {
	if end <= from {
		return nil
	}
	r, err := Open(Options{Client: client, Topic: topic, Partition: p, From: from})
	if err != nil {
		return err
	}
	defer r.Close()
	for r.Position() < end {
		b, err := r.Next(ctx)
		if err != nil {
			return fmt.Errorf("reading %s-%d up to offset %d: %w", topic, p, end, err)
		}
		for _, rec := range b.Records {
			if rec.Offset < end {
				fn(rec)
			}
		}
	}
	return nil
}

func (r *Reader) tp() string { return fmt.Sprintf("%s-%d", r.topic, r.partition) }

// hasErrors reports whether fetches hold an error other than the end of the
// poll's context.
func hasErrors(fetches kgo.Fetches) bool {
	found := false
	fetches.EachError(func(_ string, _ int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			found = true
		}
	})
	return found
}

// visibleFrom asks the broker (a read_committed fetch of raw batches) what
// the partition holds at offset from: it returns the offset of the first
// record a read_committed reader with control records kept is given (a
// committed record or a transaction marker), or, when there is none up to
// the stable end, that end. A position below the log start or past the end
// is the broker's OFFSET_OUT_OF_RANGE (Next returns ErrOutOfRange), as for
// the reader's consumer.
// A consumer never reports records invisible to it (an aborted
// transaction's, an empty batch left by compaction, nothing at all where
// compaction removed the tail), so without this a reader that must reach an
// offset could wait for records that never come.
func (r *Reader) visibleFrom(ctx context.Context, from int64) (int64, error) {
	if r.topicID == ([16]byte{}) {
		// Fetch v13 and later name a topic by its id alone: a reader
		// opened with the name only (Scan) learns it.
		details, err := kadm.NewClient(r.cl).ListTopics(ctx, r.topic)
		if err != nil {
			return from, fmt.Errorf("describing %s: %w", r.topic, err)
		}
		d, ok := details[r.topic]
		if !ok {
			return from, fmt.Errorf("describing %s: %w", r.topic, kerr.UnknownTopicOrPartition)
		}
		if d.Err != nil {
			return from, fmt.Errorf("describing %s: %w", r.topic, d.Err)
		}
		r.topicID = d.ID
	}
	pos := from
	for range 64 {
		leader, _, err := r.cl.PartitionLeader(r.topic, r.partition)
		if err != nil {
			return from, err
		}
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis = 0
		req.MinBytes = 1
		req.MaxBytes = 2 << 20
		req.IsolationLevel = 1
		req.SessionEpoch = -1
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic, ft.TopicID = r.topic, r.topicID
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = r.partition, pos, 2<<20
		fp.CurrentLeaderEpoch, fp.LogStartOffset = -1, -1
		ft.Partitions = append(ft.Partitions, fp)
		req.Topics = append(req.Topics, ft)
		kresp, err := r.cl.Broker(int(leader)).Request(ctx, req)
		if err != nil {
			return from, err
		}
		resp := kresp.(*kmsg.FetchResponse)
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return from, fmt.Errorf("fetch of %s answered %d topics", r.tp(), len(resp.Topics))
		}
		rp := resp.Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
			// Out of range (below the log start, past the end) included:
			// the records between the position and a new log start were
			// never read, and may have deleted keys the caller holds.
			return from, err
		}
		next, visible, complete := scanBatches(rp.RecordBatches, rp.AbortedTransactions, pos)
		switch {
		case visible:
			return next, nil
		case next <= pos && complete:
			// Nothing stored at pos up to the stable end: the records
			// there are gone.
			return max(pos, rp.LastStableOffset), nil
		case next <= pos:
			return pos, nil // a batch larger than the fetch: let the consumer read it
		}
		pos = next
	}
	return pos, nil
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
			// A marker is given to the reader (control records are kept).
			return max(from, b.FirstOffset), true, true
		case b.NumRecords > 0 && !(txn && abortedBy[b.ProducerID]):
			return max(from, b.FirstOffset), true, true
		}
		next = last + 1
	}
	return next, false, len(raw) == 0
}
