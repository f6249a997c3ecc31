package stream

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
)

// Events folded with a warning.
//
// An event whose record key and "product" field are both set and differ is
// folded under its record key: the key is the group key, as Kafka Streams'
// groupByKey has it (DESIGN.md: "The group key is the record key"). It is
// not a bad event, so it is not in salesagg_events_skipped_total: it is
// counted in salesagg_events_folded_with_warning_total{reason=
// "key_product_mismatch"} by the task that folds it (once: an event forwarded
// to its key's owner is counted there, not where it was read) and logged,
// rate limited as bad events are.

// keyMismatch counts and logs (rate limited) an event just folded under its
// record key although its product field names another product.
func (t *task) keyMismatch(topic string, r *kgo.Record) {
	t.stats.keyMismatches.Add(1)
	if ok, suppressed := t.in.mismatchLog.allow(time.Now()); ok {
		t.log.Warn("Folded event under its record key, which differs from its product field (the key wins, as in Kafka Streams' groupByKey)",
			zap.String("topic", topic),
			zap.Int64("offset", r.Offset),
			zap.String("reason", sales.WarnKeyProductMismatch),
			zap.String("key", snippet(r.Key)),
			zap.String("value", snippet(r.Value)),
			zap.Int64("suppressed", suppressed))
	}
}
