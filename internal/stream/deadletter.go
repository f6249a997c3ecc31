package stream

import (
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

// recordOverhead is what a record costs in a batch besides its key, value
// and headers (length and delta varints, attributes), rounded up; headerOverhead
// the same for one header.
const (
	recordOverhead = 64
	headerOverhead = 16
	// dlqErrorMax bounds the error text in a dead-letter record's header.
	dlqErrorMax = 1024
)

// recordBytes estimates what r takes in a produced batch.
func recordBytes(key, value []byte, headers []kgo.RecordHeader) int {
	n := recordOverhead + len(key) + len(value)
	for _, h := range headers {
		n += headerOverhead + len(h.Key) + len(h.Value)
	}
	return n
}

// deadLetter returns the dead-letter copy of bad event r read from topic:
// its key, value and own headers as read (any salesagg.dlq.* header it came
// with replaced), with headers naming where it was read and why it was
// rejected. A copy bigger than limit bytes is cut to fit, value first, then
// key (the event's own headers are left out when they alone leave no room),
// and marked: salesagg.dlq.truncated "true" and the original sizes. The
// record's topic and partition are the caller's.
func deadLetter(topic string, r *kgo.Record, cause error, reason string, limit int) *kgo.Record {
	errText := cause.Error()
	if len(errText) > dlqErrorMax {
		errText = errText[:dlqErrorMax]
	}
	meta := []kgo.RecordHeader{
		{Key: sales.DLQTopicHeader, Value: []byte(topic)},
		{Key: sales.DLQPartitionHeader, Value: []byte(strconv.Itoa(int(r.Partition)))},
		{Key: sales.DLQOffsetHeader, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		{Key: sales.DLQReasonHeader, Value: []byte(reason)},
		{Key: sales.DLQErrorHeader, Value: []byte(errText)},
	}
	own := make([]kgo.RecordHeader, 0, len(r.Headers))
	for _, h := range r.Headers {
		if !strings.HasPrefix(h.Key, sales.DLQHeaderPrefix) {
			own = append(own, h)
		}
	}
	key, value := r.Key, r.Value
	if recordBytes(key, value, append(own, meta...)) > limit {
		marks := []kgo.RecordHeader{
			{Key: sales.DLQTruncatedHeader, Value: []byte("true")},
			{Key: sales.DLQKeyBytesHeader, Value: []byte(strconv.Itoa(len(r.Key)))},
			{Key: sales.DLQValueBytesHeader, Value: []byte(strconv.Itoa(len(r.Value)))},
		}
		fixed := recordBytes(nil, nil, append(meta, marks...))
		if fixed+recordBytes(nil, nil, own)-recordOverhead > limit/2 {
			// The event's own headers would take most of the room.
			marks = append(marks, kgo.RecordHeader{Key: sales.DLQDroppedHeadersHeader, Value: []byte(strconv.Itoa(len(own)))})
			fixed += headerOverhead + len(sales.DLQDroppedHeadersHeader) + 4
			own = own[:0]
		}
		room := max(0, limit-fixed-recordBytes(nil, nil, own)+recordOverhead)
		if len(key) > room/2 && len(key)+len(value) > room {
			key = key[:min(len(key), max(room/2, room-len(value)))]
		}
		value = value[:min(len(value), max(0, room-len(key)))]
		meta = append(meta, marks...)
	}
	return &kgo.Record{Key: key, Value: value, Headers: append(own, meta...)}
}
