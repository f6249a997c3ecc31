package stream

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

func TestDeadLetterFitsItsBound(t *testing.T) {
	// Scenario: the dead-letter copy of a bad event is the event as read when it fits
	// dlq.max.record.bytes; a bigger one (a megabyte value, a megabyte key, megabytes of
	// headers) is cut to fit and marked with its original sizes; a salesagg.dlq.* header the
	// event came with never survives.
	const limit = 64 << 10
	huge := strings.Repeat("h", 1_000_000)
	cases := []struct {
		name      string
		key, val  string
		headers   []kgo.RecordHeader
		truncated bool
	}{
		{name: "small", key: "p1", val: "not json", headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("1")}}},
		{name: "megabyte value", key: "p1", val: huge, truncated: true},
		{name: "megabyte key", key: huge, val: `{"value":1}`, truncated: true},
		{name: "megabyte key and value", key: huge, val: huge, truncated: true},
		{name: "megabytes of headers", key: "p1", val: "x", headers: []kgo.RecordHeader{{Key: "big", Value: []byte(huge)}}, truncated: true},
		{name: "forged header", key: "p1", val: "x", headers: []kgo.RecordHeader{{Key: sales.DLQReasonHeader, Value: []byte("forged")}, {Key: sales.DLQTruncatedHeader, Value: []byte("true")}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &kgo.Record{Key: []byte(tc.key), Value: []byte(tc.val), Headers: tc.headers, Partition: 2, Offset: 41}
			dl := deadLetter("sales-events-v1", r, errors.New("sales: bad event: too_large"), sales.ReasonTooLarge, limit)
			if n := recordBytes(dl.Key, dl.Value, dl.Headers); n > limit {
				t.Fatalf("dead letter takes %d bytes, over %d", n, limit)
			}
			hd := map[string][]string{}
			for _, h := range dl.Headers {
				hd[h.Key] = append(hd[h.Key], string(h.Value))
			}
			if got := hd[sales.DLQReasonHeader]; len(got) != 1 || got[0] != sales.ReasonTooLarge {
				t.Fatalf("reason headers %v", got)
			}
			if hd[sales.DLQOffsetHeader][0] != "41" || hd[sales.DLQPartitionHeader][0] != "2" || hd[sales.DLQTopicHeader][0] != "sales-events-v1" {
				t.Fatalf("source headers %v", hd)
			}
			if !strings.HasPrefix(tc.key, string(dl.Key)) || !strings.HasPrefix(tc.val, string(dl.Value)) {
				t.Fatal("the copy's key or value is not a prefix of the event's")
			}
			if !tc.truncated {
				if string(dl.Key) != tc.key || string(dl.Value) != tc.val || len(hd[sales.DLQTruncatedHeader]) != 0 {
					t.Fatalf("a copy that fits was changed: %d/%d bytes, headers %v", len(dl.Key), len(dl.Value), hd)
				}
				return
			}
			if hd[sales.DLQTruncatedHeader][0] != "true" || hd[sales.DLQKeyBytesHeader][0] != strconv.Itoa(len(tc.key)) ||
				hd[sales.DLQValueBytesHeader][0] != strconv.Itoa(len(tc.val)) {
				t.Fatalf("truncation headers %v", hd)
			}
			if len(dl.Key) == 0 {
				t.Fatal("the key was cut to nothing")
			}
		})
	}
}
