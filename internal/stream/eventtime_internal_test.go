package stream

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
)

func TestEventTimeOfAForwardedAmount(t *testing.T) {
	// Scenario: under group.protocol streams an amount forwarded through the repartition
	// topic carries its event time in a header; the owner folds it into windows at that
	// time, a bad-time header or a time header that is not 8 bytes is a bad time (counted,
	// never the record timestamp in its place), and without either (Kafka Streams
	// forwarded it) the record timestamp is its time.
	cfg := config.Default()
	cfg.GroupProtocol = config.GroupProtocolStreams
	cfg.Windows.TimeField = "ts"
	tk := &task{deps: taskDeps{env: &env{cfg: cfg}}}
	stamp := time.UnixMilli(1_700_000_000_000)
	at := binary.BigEndian.AppendUint64(nil, uint64(1_600_000_000_000))
	for _, tc := range []struct {
		name    string
		headers []kgo.RecordHeader
		want    int64
		bad     bool
	}{
		{"time header", []kgo.RecordHeader{{Key: sales.EventTimeHeader, Value: at}}, 1_600_000_000_000, false},
		{"bad-time header", []kgo.RecordHeader{{Key: sales.BadTimeHeader, Value: []byte("ts is not a time")}}, 0, true},
		{"time header of 7 bytes", []kgo.RecordHeader{{Key: sales.EventTimeHeader, Value: at[:7]}}, 0, true},
		{"empty time header", []kgo.RecordHeader{{Key: sales.EventTimeHeader}}, 0, true},
		{"no header (Kafka Streams forwarded it)", nil, stamp.UnixMilli(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(5), Timestamp: stamp, Headers: tc.headers}
			got, err := tk.eventTime("app-EMPTY_KEY_BY_PRODUCT-repartition", r)
			var be *sales.BadEventError
			switch {
			case tc.bad && (!errors.As(err, &be) || be.Reason != sales.ReasonBadTime):
				t.Fatalf("eventTime = %d, %v; want a bad time", got, err)
			case !tc.bad && (err != nil || got != tc.want):
				t.Fatalf("eventTime = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
