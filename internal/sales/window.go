package sales

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Windowed totals: tumbling windows of one size by event time, each
// product's total per window, kept in a window store with a changelog of
// its own. The changelog record, as Kafka Streams' window stores write it
// (WindowKeySchema.toStoreKeyBinary, and a timestamped window store's
// changelog value without its timestamp):
//
//	key   = product (UTF-8), window start (8-byte big-endian ms), sequence
//	        number (4-byte big-endian, always 0: duplicates are not kept)
//	value = the window's total, as EncodeTotal writes it
//
// and the record's timestamp is the latest event time folded into it.
// salesagg adds OffsetsHeader as it does to a total's record.

// windowKeyTail is the window start and sequence number after the product.
const windowKeyTail = 8 + 4

// ErrBadWindowKey is returned for a window changelog key too short to hold
// a window start and sequence number.
var ErrBadWindowKey = errors.New("sales: window changelog key shorter than 12 bytes")

// WindowStart returns the start of the tumbling window of size that holds
// event time ts (both in ms): Kafka Streams' TimeWindows.windowsFor with the
// advance equal to the size. Windows start at 0 or later: an event time
// before the epoch falls in the first window, as there.
func WindowStart(ts, size int64) int64 {
	if size <= 0 {
		return 0
	}
	return max(ts, 0) / size * size
}

// AppendWindowKey appends the changelog key of product's window starting
// at start to b.
func AppendWindowKey(b, product []byte, start int64) []byte {
	b = append(b, product...)
	b = binary.BigEndian.AppendUint64(b, uint64(start))
	return binary.BigEndian.AppendUint32(b, 0)
}

// DecodeWindowKey returns the product and window start of a window
// changelog key; the product is a slice of k.
func DecodeWindowKey(k []byte) (product []byte, start int64, err error) {
	if len(k) < windowKeyTail {
		return nil, 0, fmt.Errorf("%w (%d bytes)", ErrBadWindowKey, len(k))
	}
	p := len(k) - windowKeyTail
	return k[:p], int64(binary.BigEndian.Uint64(k[p:])), nil
}

// FormatWindowSize writes a window size the short way it is named in store
// and topic names and in queries: the largest whole unit of h, m, s or ms
// ("1h", "15m", "90s", "1500ms").
func FormatWindowSize(size time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if size >= u.d && size%u.d == 0 {
			return strconv.FormatInt(int64(size/u.d), 10) + u.name
		}
	}
	return strconv.FormatInt(size.Milliseconds(), 10) + "ms"
}

// WindowStoreName returns the name of the window store of size beside
// the totals' store storeName: <storeName>-<size>, the size as
// FormatWindowSize writes it ("PRODUCT_AGGREGATED_SALES-1h"). Its changelog
// is ChangelogTopic(appID, WindowStoreName(...)), as Kafka Streams names a
// store materialized under that name.
func WindowStoreName(storeName string, size time.Duration) string {
	return storeName + "-" + FormatWindowSize(size)
}

// ReasonBadTime names an event whose time field (windows.time.field) is
// missing or not a time. The event still counts in its product's total;
// only its windows skip it.
const ReasonBadTime = "bad_time"

// EventTime reads the time of an event from its JSON field named field:
// epoch milliseconds (an integer) or an RFC 3339 string. A missing field or
// any other value is a *BadEventError with ReasonBadTime.
func EventTime(value []byte, field string) (int64, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(value, &fields); err != nil {
		return 0, bad(ReasonBadTime, "value is not a JSON object: %v", err)
	}
	raw, ok := fields[field]
	if !ok {
		return 0, bad(ReasonBadTime, "no %q field", field)
	}
	var ms int64
	if err := json.Unmarshal(raw, &ms); err == nil {
		return ms, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t.UnixMilli(), nil
		}
	}
	return 0, bad(ReasonBadTime, "field %q is %s: want epoch milliseconds or an RFC 3339 time", field, snippetOf(raw))
}

// snippetOf is the start of b for an error message.
func snippetOf(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// WindowHeader marks a windowed notification, with the window's size as
// FormatWindowSize writes it: a consumer of the notification topic tells
// them from the totals' notifications without reading the value.
const WindowHeader = "salesagg.window"

// WindowNotification is the value of a windowed notification: a window's
// total at or above the threshold, with the window (start and end in ms
// since the epoch, end excluded).
type WindowNotification struct {
	SKU    string `json:"sku"`
	Value  int64  `json:"value"`
	Window string `json:"window"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	// Final marks the window's final total, written once it closed
	// (windows.notify final).
	Final bool `json:"final"`
}

// AppendWindowNotification appends the JSON of a windowed notification
// of product's window of size (as FormatWindowSize writes it) from start
// to end to b.
func AppendWindowNotification(b []byte, product string, total int64, size string, start, end int64, final bool) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(WindowNotification{SKU: product, Value: total, Window: size, Start: start, End: end, Final: final}) // cannot fail for these types
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}
