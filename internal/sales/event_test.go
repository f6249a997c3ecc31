package sales

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestDecodeGoodEvents(t *testing.T) {
	// Scenario: well-formed events decode to the group key and value a user expects.
	tests := []struct {
		name, key, value string
		want             Event
	}{
		{"plain", "p1", `{"product":"p1","value":1000}`, Event{Key: "p1", Product: "p1", Value: 1000}},
		{"negative", "p1", `{"product":"p1","value":-250}`, Event{Key: "p1", Product: "p1", Value: -250}},
		{"empty key falls back to product", "", `{"product":"p2","value":5}`, Event{Key: "p2", Product: "p2", Value: 5}},
		{"key wins over product", "k", `{"product":"p3","value":5}`, Event{Key: "k", Product: "p3", Value: 5}},
		{"no product with key", "p4", `{"value":7}`, Event{Key: "p4", Value: 7}},
		{"extra fields and spaces", "p5", ` { "value" : 9 , "product" : "p5", "ts": "x" } `, Event{Key: "p5", Product: "p5", Value: 9}},
		{"max int64", "p6", fmt.Sprintf(`{"value":%d}`, int64(math.MaxInt64)), Event{Key: "p6", Value: math.MaxInt64}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.key), []byte(tt.value))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			// Only a key and a product that are both set and differ disagree.
			if want := tt.name == "key wins over product"; got.KeyMismatch() != want {
				t.Fatalf("KeyMismatch() = %v, want %v", got.KeyMismatch(), want)
			}
			if _, _, mismatch, _ := DecodeKey([]byte(tt.key), []byte(tt.value)); mismatch != got.KeyMismatch() {
				t.Fatalf("DecodeKey's mismatch = %v, Decode's %v", mismatch, got.KeyMismatch())
			}
		})
	}
}

func TestDecodeBadEvents(t *testing.T) {
	// Scenario: every class of malformed event is rejected with its reason, never a panic.
	tests := []struct {
		name, reason string
		key, value   []byte
	}{
		{"empty record", ReasonEmpty, []byte("p"), nil},
		{"blank value", ReasonEmpty, []byte("p"), []byte("   ")},
		{"not JSON", ReasonNotJSON, []byte("p"), []byte("hello")},
		{"truncated JSON", ReasonNotJSON, []byte("p"), []byte(`{"product":"p","value":1`)},
		{"JSON array", ReasonNotObject, []byte("p"), []byte(`[1,2]`)},
		{"JSON number", ReasonNotObject, []byte("p"), []byte(`42`)},
		{"JSON null", ReasonNotObject, []byte("p"), []byte(`null`)},
		{"missing value", ReasonNoValue, []byte("p"), []byte(`{"product":"p"}`)},
		{"null value", ReasonNoValue, []byte("p"), []byte(`{"product":"p","value":null}`)},
		{"string value", ReasonBadValue, []byte("p"), []byte(`{"product":"p","value":"100"}`)},
		{"fraction", ReasonBadValue, []byte("p"), []byte(`{"product":"p","value":1.5}`)},
		{"exponent", ReasonBadValue, []byte("p"), []byte(`{"product":"p","value":1e3}`)},
		{"bool value", ReasonBadValue, []byte("p"), []byte(`{"product":"p","value":true}`)},
		{"huge number", ReasonRange, []byte("p"), []byte(`{"product":"p","value":99999999999999999999}`)},
		{"huge negative", ReasonRange, []byte("p"), []byte(`{"product":"p","value":-99999999999999999999}`)},
		{"product not a string", ReasonBadProduct, []byte(""), []byte(`{"product":7,"value":1}`)},
		{"empty key and product", ReasonNoKey, []byte(""), []byte(`{"product":"","value":1}`)},
		{"empty key, no product", ReasonNoKey, nil, []byte(`{"value":1}`)},
		{"invalid UTF-8 key", ReasonInvalidUTF8, []byte{0xff, 0xfe}, []byte(`{"value":1}`)},
		{"oversized value", ReasonTooLarge, []byte("p"), []byte(`{"value":1,"pad":"` + strings.Repeat("x", MaxEventSize) + `"}`)},
		{"oversized key", ReasonTooLarge, []byte(strings.Repeat("k", MaxKeySize+1)), []byte(`{"value":1}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.key, tt.value)
			var be *BadEventError
			if !errors.As(err, &be) {
				t.Fatalf("want *BadEventError, got %v", err)
			}
			if be.Reason != tt.reason {
				t.Fatalf("reason %q, want %q (%v)", be.Reason, tt.reason, err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("p"), []byte(`{"product":"p","value":1}`))
	f.Add([]byte(""), []byte(`{"value":-1}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		ev, err := Decode(key, value)
		if err == nil && ev.Key == "" {
			t.Fatalf("accepted an event without a group key: %q %q", key, value)
		}
	})
}

func TestAddOverflow(t *testing.T) {
	// Scenario: a sum that would overflow int64 is rejected, never wrapped.
	tests := []struct {
		total, v int64
		ok       bool
	}{
		{1, 2, true},
		{math.MaxInt64 - 1, 1, true},
		{math.MaxInt64, 1, false},
		{math.MinInt64 + 1, -1, true},
		{math.MinInt64, -1, false},
		{math.MaxInt64, math.MinInt64, true},
	}
	for _, tt := range tests {
		got, err := Add(tt.total, tt.v)
		if (err == nil) != tt.ok {
			t.Fatalf("Add(%d, %d) err = %v, want ok=%v", tt.total, tt.v, err, tt.ok)
		}
		if err == nil && got != tt.total+tt.v {
			t.Fatalf("Add(%d, %d) = %d", tt.total, tt.v, got)
		}
		if err != nil && (Reason(err) != ReasonOverflow || got != tt.total) {
			t.Fatalf("Add(%d, %d) = %d, %v: want the total unchanged and reason %s", tt.total, tt.v, got, err, ReasonOverflow)
		}
	}
}

func TestPartitionAgreesWithJavaPartitioner(t *testing.T) {
	// Scenario: a product's owning partition is the one the Java client (murmur2) picks;
	// franz-go's Kafka-compatible key partitioner is the independent reference.
	p := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		key := make([]byte, rng.IntN(40)+1)
		for j := range key {
			key[j] = byte(rng.IntN(256))
		}
		n := rng.IntN(50) + 1
		want := p.Partition(&kgo.Record{Key: key}, n)
		if got := Partition(key, int32(n)); int(got) != want {
			t.Fatalf("Partition(%x, %d) = %d, Java partitioner says %d", key, n, got, want)
		}
	}
}

func TestWireFormats(t *testing.T) {
	// Scenario: totals, notifications and offsets round-trip in the documented formats.
	if got := EncodeTotal(2000); string(got) != "\x00\x00\x00\x00\x00\x00\x07\xd0" {
		t.Fatalf("EncodeTotal(2000) = %x", got)
	}
	for _, v := range []int64{0, -1, math.MaxInt64, math.MinInt64} {
		got, err := DecodeTotal(EncodeTotal(v))
		if err != nil || got != v {
			t.Fatalf("DecodeTotal(EncodeTotal(%d)) = %d, %v", v, got, err)
		}
	}
	if _, err := DecodeTotal([]byte{1, 2}); err == nil {
		t.Fatal("DecodeTotal accepted 2 bytes")
	}
	if got := string(EncodeNotification("p1", 2500)); got != `{"sku":"p1","value":2500}` {
		t.Fatalf("notification = %s", got)
	}
	if got := string(EncodeNotification("a<b>&c", 1)); got != `{"sku":"a<b>&c","value":1}` {
		t.Fatalf("notification = %s", got)
	}
	// Offsets without a topic id keep the legacy encoding, byte for byte.
	var none [16]byte
	var offs Offsets
	offs = offs.With(none, 2, 10).With(none, 0, 5).With(none, 2, 11)
	if !offs.Reflects(none, 2, 11) || offs.Reflects(none, 2, 12) || !offs.Reflects(none, 0, 0) || offs.Reflects(none, 1, 0) {
		t.Fatalf("Reflects wrong for %v", offs)
	}
	enc := offs.AppendEncode(nil)
	if want := "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x0b"; string(enc) != want {
		t.Fatalf("legacy encoding = %x", enc)
	}
	back, err := DecodeOffsets(enc)
	if err != nil || len(back.Parts) != 2 || back.Parts[0] != (PartitionOffset{0, 5}) || back.Parts[1] != (PartitionOffset{2, 11}) || back.TopicID != none {
		t.Fatalf("DecodeOffsets = %v, %v", back, err)
	}
	if _, err := DecodeOffsets([]byte{1, 2, 3}); err == nil {
		t.Fatal("DecodeOffsets accepted 3 bytes")
	}
}

// decodeGeneral is Decode with only the general (encoding/json) path: the
// reference the canonical decoder must agree with.
func decodeGeneral(key, value []byte) (Event, error) {
	trimmed := bytes.TrimSpace(value)
	if len(trimmed) == 0 || len(trimmed) > MaxEventSize || len(key) > MaxKeySize || !utf8.Valid(key) {
		return Decode(key, value) // the checks before either path
	}
	return decodeJSON(key, trimmed)
}

// sameDecode fails t unless Decode, DecodeKey and the general path agree on
// key and value: the same event, or errors of the same reason.
func sameDecode(t *testing.T, key, value []byte) {
	t.Helper()
	got, gotErr := Decode(key, value)
	want, wantErr := decodeGeneral(key, value)
	if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && Reason(gotErr) != Reason(wantErr)) || got != want {
		t.Fatalf("Decode(%q, %q) = %+v, %v; the general decoder gives %+v, %v", key, value, got, gotErr, want, wantErr)
	}
	k, n, mismatch, err := DecodeKey(key, value)
	if (err == nil) != (wantErr == nil) || (err != nil && Reason(err) != Reason(wantErr)) || string(k) != want.Key || n != want.Value ||
		mismatch != want.KeyMismatch() {
		t.Fatalf("DecodeKey(%q, %q) = %q, %d, mismatch %v, %v; the general decoder gives %+v (mismatch %v), %v", key, value, k, n, mismatch, err,
			want, want.KeyMismatch(), wantErr)
	}
}

func TestCanonicalDecoderAgrees(t *testing.T) {
	// Scenario: the canonical fast path and encoding/json give the same event, or the same bad
	// event reason, for the canonical shape and every near miss of it.
	values := []string{
		`{"product":"p1","value":1000}`, `{"value":1000,"product":"p1"}`, ` { "product" : "p1" , "value" : -7 } `,
		`{"product":"p1","value":0}`, `{"product":"p1","value":-0}`, `{"product":"p1","value":01}`,
		`{"product":"p1","value":9223372036854775807}`, `{"product":"p1","value":9223372036854775808}`,
		`{"product":"p1","value":-9223372036854775808}`, `{"product":"p1","value":-9223372036854775809}`,
		`{"product":"p1","value":99999999999999999999}`, `{"product":"p1","value":1.0}`, `{"product":"p1","value":1e3}`,
		`{"product":"p1","value":"1"}`, `{"product":"p1","value":null}`, `{"product":null,"value":1}`,
		`{"product":"p1"}`, `{"value":1}`, `{"product":"p1","value":1,"extra":2}`, `{"product":"p1","product":"p2","value":1}`,
		`{"product":"p1","value":1,"value":2}`, `{"product":"p\u00e9","value":1}`, `{"product":"p\"q","value":1}`,
		"{\"product\":\"p\x01\",\"value\":1}", "{\"product\":\"p\xff\",\"value\":1}", `{"product":"p1","value":1}x`,
		`{"product":"p1","value":1`, `{"product":"p1" "value":1}`, `{"Product":"p1","value":1}`, `{"product":1,"value":1}`,
		`{"product":"","value":1}`, `{"product":"p1","value":-}`, `{"product":"p1","value":1 }`, `[1]`, `"x"`, `{}`,
		"{\"product\":\"p1\",\n\t\"value\":5}\r\n",
	}
	for _, key := range []string{"", "p1", "other", "p\u00e9"} {
		for _, v := range values {
			sameDecode(t, []byte(key), []byte(v))
		}
	}
}

// TestCompactLayoutTakesTheShortPath: the layout producers write most,
// with no whitespace, is decoded by the one-pass decoder, and any other
// layout is left to the general loop; where the short path answers, its
// answer is the general loop's.
func TestCompactLayoutTakesTheShortPath(t *testing.T) {
	for _, tc := range []struct {
		value   string
		product string
		n       int64
	}{
		{`{"product":"p1","value":1000}`, "p1", 1000},
		{`{"product":"p1","value":-7}`, "p1", -7},
		{`{"product":"","value":0}`, "", 0},
		{`{"product":"pé","value":9223372036854775807}`, "pé", 9223372036854775807},
		{`{"product":"p1","value":-9223372036854775808}`, "p1", -9223372036854775808},
	} {
		p, n, ok := decodeCompact([]byte(tc.value))
		if !ok || string(p) != tc.product || n != tc.n {
			t.Errorf("decodeCompact(%s) = %q, %d, %v; want %q, %d by the short path", tc.value, p, n, ok, tc.product, tc.n)
		}
	}
	for _, v := range []string{
		`{"value":1000,"product":"p1"}`, ` {"product":"p1","value":1}`, `{"product":"p1", "value":1}`,
		`{"product":"p1","value":1 }`, `{"product":"p\"q","value":1}`, "{\"product\":\"p\x01\",\"value\":1}",
		"{\"product\":\"p\xff\",\"value\":1}", `{"product":"p1","value":01}`, `{"product":"p1","value":1.5}`,
		`{"product":"p1","value":9223372036854775808}`, `{"product":"p1","value":1}}`, `{"product":"p1","value":}`,
		`{"product":"p1","value":1`, `{"product":"p1"`, `{"product":"`, `{"product":"p1","valuе":1}`,
	} {
		if p, n, ok := decodeCompact([]byte(v)); ok {
			t.Errorf("decodeCompact(%q) = %q, %d by the short path; want it left to the general loop", v, p, n)
		}
	}
}

func FuzzCanonicalDecoderAgrees(f *testing.F) {
	f.Add([]byte("p"), []byte(`{"product":"p","value":1}`))
	f.Add([]byte(""), []byte(`{"value":-1,"product":"q"}`))
	f.Add([]byte("k"), []byte(`{"product":"p\u0041","value":12e1}`))
	f.Add([]byte(""), []byte(`{"product":"p\xff","value":1}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		sameDecode(t, key, value)
		if p, n, ok := decodeCompact(value); ok {
			if len(value) > 0 && (value[0] == ' ' || value[len(value)-1] == ' ') {
				t.Fatalf("decodeCompact took %q, which has whitespace around it", value)
			}
			if ev, err := decodeJSON([]byte("k"), value); err != nil || ev.Product != string(p) || ev.Value != n {
				t.Fatalf("decodeCompact(%q) = %q, %d; encoding/json gives %+v, %v", value, p, n, ev, err)
			}
		}
	})
}

// TestDecodeAmount: a forwarded record in Kafka Streams' repartition format
// (key the product, value a LongSerializer amount) decodes to both; a value
// of another length, a key that is empty, too long or not UTF-8, is a bad
// event with its reason.
func TestDecodeAmount(t *testing.T) {
	key, amount, err := DecodeAmount([]byte("p1"), EncodeTotal(-1234))
	if err != nil || string(key) != "p1" || amount != -1234 {
		t.Fatalf("DecodeAmount = %q, %d, %v; want p1, -1234", key, amount, err)
	}
	for _, tc := range []struct {
		name, reason string
		key, value   []byte
	}{
		{"json value", ReasonBadValue, []byte("p1"), []byte(`{"product":"p1","value":1}`)},
		{"short value", ReasonBadValue, []byte("p1"), []byte{0, 1}},
		{"empty key", ReasonNoKey, nil, EncodeTotal(1)},
		{"long key", ReasonTooLarge, bytes.Repeat([]byte("k"), MaxKeySize+1), EncodeTotal(1)},
		{"not utf-8", ReasonInvalidUTF8, []byte{0xff, 0xfe}, EncodeTotal(1)},
	} {
		if _, _, err := DecodeAmount(tc.key, tc.value); Reason(err) != tc.reason {
			t.Errorf("%s: %v (reason %s), want reason %s", tc.name, err, Reason(err), tc.reason)
		}
	}
}
