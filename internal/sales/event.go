package sales

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Reasons an event is rejected. They are the values of BadEventError.Reason
// and appear in logs and counters, so they are stable identifiers.
const (
	ReasonEmpty       = "empty_value"
	ReasonNotJSON     = "not_json"
	ReasonNotObject   = "not_object"
	ReasonNoValue     = "missing_value"
	ReasonBadValue    = "value_not_integer"
	ReasonRange       = "value_out_of_range"
	ReasonNoKey       = "missing_product"
	ReasonBadProduct  = "product_not_string"
	ReasonInvalidUTF8 = "invalid_utf8"
	ReasonOverflow    = "total_overflow"
	ReasonTooLarge    = "too_large"
)

// WarnKeyProductMismatch names an event whose record key and product field
// are both set and differ. It is not a bad event: the event is folded under
// its record key, as Kafka Streams' groupByKey does; it is counted and
// logged so that a producer writing the wrong key can be found.
const WarnKeyProductMismatch = "key_product_mismatch"

// Reasons returns every reason Decode, DecodeKey and Add report, so that a
// counter by reason can show each at 0 before the first bad event.
func Reasons() []string {
	return []string{ReasonEmpty, ReasonNotJSON, ReasonNotObject, ReasonNoValue, ReasonBadValue, ReasonRange,
		ReasonNoKey, ReasonBadProduct, ReasonInvalidUTF8, ReasonOverflow, ReasonTooLarge}
}

// MaxEventSize is the largest event value accepted, in bytes. A sales event is
// a few dozen bytes; anything this large is a producer bug and is rejected
// before parsing.
const MaxEventSize = 64 << 10

// MaxKeySize is the largest group key accepted, in bytes.
const MaxKeySize = 4 << 10

// BadEventError reports why an event cannot be folded. Bad events are counted
// and skipped; they never stop a partition.
type BadEventError struct {
	Reason string
	Detail string
}

func (e *BadEventError) Error() string {
	if e.Detail == "" {
		return "sales: bad event: " + e.Reason
	}
	return "sales: bad event: " + e.Reason + ": " + e.Detail
}

func bad(reason, format string, args ...any) error {
	return &BadEventError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Reason returns the reason of a BadEventError anywhere in err's chain, or
// "unknown".
func Reason(err error) string {
	var be *BadEventError
	if errors.As(err, &be) {
		return be.Reason
	}
	return "unknown"
}

// Event is one decoded sales event.
type Event struct {
	// Key is the group key: the record key, or the product when the record
	// key is empty.
	Key string
	// Product is the product named in the value.
	Product string
	// Value is the amount to add; negative values are allowed.
	Value int64
}

// KeyMismatch reports whether the record key and the product field are both
// set and differ (see WarnKeyProductMismatch): the key wins.
func (e Event) KeyMismatch() bool { return e.Product != "" && e.Key != e.Product }

// Decode validates a record's key and value and returns the event. The value
// must be a JSON object with an integer "value" and a string "product"
// (the product may be omitted when the key is set). Any other shape is a
// *BadEventError.
func Decode(key, value []byte) (Event, error) {
	value, err := precheck(key, value)
	if err != nil {
		return Event{}, err
	}
	if product, n, ok := decodeCanonical(value); ok {
		return withKey(Event{Product: string(product), Value: n}, key)
	}
	return decodeJSON(key, value)
}

// DecodeKey is Decode for the hot path: it returns only the group key, the
// amount and whether the key and the product disagree (Event.KeyMismatch),
// and for the canonical shape it copies nothing (the key is a slice of the
// record's key or value, valid as long as they are). Every input gives what
// Decode gives: the same key bytes, amount, mismatch and error.
func DecodeKey(key, value []byte) (groupKey []byte, amount int64, mismatch bool, err error) {
	value, err = precheck(key, value)
	if err != nil {
		return nil, 0, false, err
	}
	if product, n, ok := decodeCanonical(value); ok {
		k := key
		if len(k) == 0 {
			k = product
		}
		if err := checkKey(len(k)); err != nil {
			return nil, 0, false, err
		}
		return k, n, len(product) > 0 && !bytes.Equal(k, product), nil
	}
	ev, err := decodeJSON(key, value)
	if err != nil {
		return nil, 0, false, err
	}
	return []byte(ev.Key), ev.Value, ev.KeyMismatch(), nil
}

// precheck returns the trimmed value, or the error of a value or key that
// no decoding can accept.
func precheck(key, value []byte) ([]byte, error) {
	value = bytes.TrimSpace(value)
	if len(value) == 0 {
		return nil, bad(ReasonEmpty, "")
	}
	if len(value) > MaxEventSize {
		return nil, bad(ReasonTooLarge, "value is %d bytes, at most %d allowed", len(value), MaxEventSize)
	}
	if len(key) > MaxKeySize {
		return nil, bad(ReasonTooLarge, "key is %d bytes, at most %d allowed", len(key), MaxKeySize)
	}
	if !utf8.Valid(key) {
		return nil, bad(ReasonInvalidUTF8, "record key is not valid UTF-8")
	}
	return value, nil
}

// decodeJSON is Decode's general path: any JSON, through encoding/json.
func decodeJSON(key, value []byte) (Event, error) {
	if value[0] != '{' {
		if json.Valid(value) {
			return Event{}, bad(ReasonNotObject, "value is JSON but not an object")
		}
		return Event{}, bad(ReasonNotJSON, "")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(value, &raw); err != nil {
		return Event{}, bad(ReasonNotJSON, "%v", err)
	}
	var ev Event
	if p, ok := raw["product"]; ok && !isNull(p) {
		if err := json.Unmarshal(p, &ev.Product); err != nil {
			return Event{}, bad(ReasonBadProduct, "product is %s", abbreviate(p))
		}
	}
	v, ok := raw["value"]
	if !ok || isNull(v) {
		return Event{}, bad(ReasonNoValue, "")
	}
	n, err := parseInteger(v)
	if err != nil {
		return Event{}, err
	}
	ev.Value = n
	return withKey(ev, key)
}

// withKey sets the event's group key, the record key or else the product,
// and checks it.
func withKey(ev Event, key []byte) (Event, error) {
	switch {
	case len(key) == 0:
		ev.Key = ev.Product
	case string(key) == ev.Product:
		ev.Key = ev.Product // no copy
	default:
		ev.Key = string(key)
	}
	if err := checkKey(len(ev.Key)); err != nil {
		return Event{}, err
	}
	return ev, nil
}

// checkKey checks the length of a group key.
func checkKey(n int) error {
	if n == 0 {
		return bad(ReasonNoKey, "record key and product are both empty")
	}
	if n > MaxKeySize {
		return bad(ReasonTooLarge, "product is %d bytes, at most %d allowed", n, MaxKeySize)
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// parseInteger accepts a JSON number written as an integer ("12", "-3"). A
// fraction, an exponent, a string or any other JSON type is rejected, as is a
// number outside int64.
func parseInteger(raw json.RawMessage) (int64, error) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, bad(ReasonBadValue, "value is %s", abbreviate(raw))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err == nil {
		return n, nil
	}
	if errors.Is(err, strconv.ErrRange) {
		return 0, bad(ReasonRange, "value %s does not fit in a 64-bit integer", abbreviate(raw))
	}
	return 0, bad(ReasonBadValue, "value is %s", abbreviate(raw))
}

func abbreviate(raw []byte) string {
	const max = 40
	if len(raw) <= max {
		return string(raw)
	}
	return string(raw[:max]) + "..."
}

// Add returns total+v, or a *BadEventError when the sum does not fit in an
// int64. A total is never wrapped.
func Add(total, v int64) (int64, error) {
	if (v > 0 && total > math.MaxInt64-v) || (v < 0 && total < math.MinInt64-v) {
		return total, bad(ReasonOverflow, "%d + %d overflows a 64-bit total", total, v)
	}
	return total + v, nil
}

// decodeCanonical decodes the shape producers write,
// {"product":"...","value":N} (either order, whitespace allowed), without
// reflection or maps: a product string without escapes and a JSON integer
// that fits int64. Anything else, valid or not, returns false and goes to
// the general path, so both give the same result for every input (a fuzz
// test holds them to it). value is trimmed and not empty.
func decodeCanonical(value []byte) (product []byte, n int64, ok bool) {
	if product, n, ok := decodeCompact(value); ok {
		return product, n, true
	}
	i := 0
	skip := func() {
		for i < len(value) && (value[i] == ' ' || value[i] == '\t' || value[i] == '\n' || value[i] == '\r') {
			i++
		}
	}
	expect := func(c byte) bool {
		skip()
		if i < len(value) && value[i] == c {
			i++
			return true
		}
		return false
	}
	// str reads a string without escapes or control characters; valid
	// UTF-8 (encoding/json would replace invalid bytes).
	str := func() ([]byte, bool) {
		if !expect('"') {
			return nil, false
		}
		start := i
		for i < len(value) {
			c := value[i]
			switch {
			case c == '"':
				s := value[start:i]
				i++
				return s, utf8.Valid(s)
			case c == '\\' || c < 0x20:
				return nil, false
			}
			i++
		}
		return nil, false
	}
	if !expect('{') {
		return nil, 0, false
	}
	var haveProduct, haveValue bool
	for field := 0; field < 2; field++ {
		if field == 1 && !expect(',') {
			return nil, 0, false
		}
		name, ok := str()
		if !ok || !expect(':') {
			return nil, 0, false
		}
		switch string(name) {
		case "product":
			p, ok := str()
			if !ok || haveProduct {
				return nil, 0, false
			}
			product, haveProduct = p, true
		case "value":
			skip()
			v, end, ok := parseJSONInt(value, i)
			if !ok || haveValue {
				return nil, 0, false
			}
			n, haveValue, i = v, true, end
		default:
			return nil, 0, false
		}
	}
	if !expect('}') {
		return nil, 0, false
	}
	skip()
	if i != len(value) || !haveProduct || !haveValue {
		return nil, 0, false
	}
	return product, n, true
}

const (
	compactHead = `{"product":"`
	compactMid  = `","value":`
)

// decodeCompact decodes the layout producers write most,
// {"product":"...","value":N} with no whitespace, in one pass: the fixed
// parts compared whole, the product scanned once for its end, escapes,
// control characters and non-ASCII bytes (UTF-8 checked only when it has
// some). Any other layout returns false and goes to decodeCanonical's
// general loop, which gives the same answer for this one.
func decodeCompact(value []byte) (product []byte, n int64, ok bool) {
	if len(value) < len(compactHead)+len(compactMid)+2 || string(value[:len(compactHead)]) != compactHead {
		return nil, 0, false
	}
	i := len(compactHead)
	var high byte
	for ; i < len(value); i++ {
		c := value[i]
		if c == '"' {
			break
		}
		if c == '\\' || c < 0x20 {
			return nil, 0, false
		}
		high |= c
	}
	product = value[len(compactHead):i]
	if len(value)-i < len(compactMid)+2 || string(value[i:i+len(compactMid)]) != compactMid {
		return nil, 0, false
	}
	v, end, ok := parseJSONInt(value, i+len(compactMid))
	if !ok || end != len(value)-1 || value[end] != '}' {
		return nil, 0, false
	}
	if high >= utf8.RuneSelf && !utf8.Valid(product) {
		return nil, 0, false
	}
	return product, v, true
}

// parseJSONInt reads a JSON integer at b[i:] (-?(0|[1-9][0-9]*), not
// followed by a fraction or exponent) that fits int64, and returns it and
// the index after it.
func parseJSONInt(b []byte, i int) (int64, int, bool) {
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	digits := i
	var u uint64
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		d := uint64(b[i] - '0')
		if u > (math.MaxUint64-d)/10 {
			return 0, 0, false
		}
		u = u*10 + d
		i++
	}
	n := i - digits
	if n == 0 || (n > 1 && b[digits] == '0') || n > 19 {
		return 0, 0, false
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, 0, false
	}
	switch {
	case neg && u <= 1<<63:
		return int64(-u), i, true // -(1<<63) wraps to MinInt64
	case !neg && u <= math.MaxInt64:
		return int64(u), i, true
	}
	return 0, 0, false
}

// RepartitionName is the name Kafka Streams' reference application gives
// its repartition step (Repartitioned.as): its repartition topic is
// <application.id>-EMPTY_KEY_BY_PRODUCT-repartition. Under the streams
// group protocol salesagg forwards through that topic, in that format (see
// DecodeAmount), so that Kafka Streams instances of the same group read
// what it forwards and the reverse.
const RepartitionName = "EMPTY_KEY_BY_PRODUCT"

// DecodeAmount decodes a forwarded record in Kafka Streams' repartition
// format: the group key as the record key (StringSerializer) and the amount
// as the value (LongSerializer, 8 bytes big-endian).
func DecodeAmount(key, value []byte) (groupKey []byte, amount int64, err error) {
	if len(value) != 8 {
		return nil, 0, bad(ReasonBadValue, "forwarded amount is %d bytes, want 8 (a LongSerializer value)", len(value))
	}
	if !utf8.Valid(key) {
		return nil, 0, bad(ReasonInvalidUTF8, "record key is not valid UTF-8")
	}
	if err := checkKey(len(key)); err != nil {
		return nil, 0, err
	}
	return key, int64(binary.BigEndian.Uint64(value)), nil
}
