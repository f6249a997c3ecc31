package changelog

// A changelog record holds one product's total, in the format the Kafka
// Streams reference writes (sales owns the encodings):
//
//	key     the product, UTF-8
//	value   the total, 8-byte big-endian int64 (sales.EncodeTotal, Kafka's
//	        LongSerializer); nil (a tombstone) deletes the product
//	header  sales.OffsetsHeader: the input offsets the total reflects
//	        (sales.Offsets); absent from records the reference wrote
//
// Update reads it, for every reader of the changelog: the restore, a
// standby's tail, the offline verification and the consume command.

import (
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// Update is the store update a changelog record makes: the total with the
// input offsets it reflects (sales.OffsetsHeader), or a deletion for a
// tombstone. It fails for a value that is not a total.
func Update(r *kgo.Record) (state.Update, error) {
	u := state.Update{Product: string(r.Key)}
	if r.Value == nil {
		u.Delete = true
		return u, nil
	}
	total, err := sales.DecodeTotal(r.Value)
	if err != nil {
		return u, err
	}
	u.Entry.Total = total
	for _, h := range r.Headers {
		if h.Key == sales.OffsetsHeader {
			if offs, err := sales.DecodeOffsets(h.Value); err == nil {
				u.Entry.Offsets = offs
			}
		}
	}
	return u, nil
}

// Encoded reads the record as Update does, without decoding its offsets:
// the total, and the offsets' encoding as sales.Offsets.AppendEncode writes
// it (sales.CanonicalOffsets; nil: none), which a bulk restore stores as
// it is. del is set for a tombstone. The offsets share the record's memory.
func Encoded(r *kgo.Record) (total int64, offsets []byte, del bool, err error) {
	if r.Value == nil {
		return 0, nil, true, nil
	}
	if total, err = sales.DecodeTotal(r.Value); err != nil {
		return 0, nil, false, err
	}
	for _, h := range r.Headers {
		if h.Key == sales.OffsetsHeader {
			if c := sales.CanonicalOffsets(h.Value); c != nil || len(h.Value) == 0 {
				offsets = c
			}
		}
	}
	return total, offsets, false, nil
}

// LogUnreadable logs a changelog record Update could not read (it is
// skipped: its total is not a total).
func LogUnreadable(log *zap.Logger, tp string, offset int64, err error) {
	log.Warn("Skipping unreadable changelog record", zap.String("changelog", tp), zap.Int64("offset", offset), zap.Error(err))
}
