package sales

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestWindowStartIsKafkaStreamsTumblingWindow(t *testing.T) {
	const hour = int64(time.Hour / time.Millisecond)
	for _, c := range []struct{ ts, size, want int64 }{
		{0, hour, 0},
		{hour - 1, hour, 0},
		{hour, hour, hour},
		{5*hour + 17, hour, 5 * hour},
		{1_764_892_800_123, 24 * hour, 1_764_892_800_000 - 1_764_892_800_000%(24*hour)},
		{-5, hour, 0}, // before the epoch: the first window
	} {
		if got := WindowStart(c.ts, c.size); got != c.want {
			t.Errorf("WindowStart(%d, %d) = %d, want %d", c.ts, c.size, got, c.want)
		}
	}
}

func TestWindowKeyIsWindowKeySchema(t *testing.T) {
	// The bytes Kafka Streams' WindowKeySchema.toStoreKeyBinary("p1", 3600000, 0) gives:
	// the key, the start as a long, the sequence number as an int, all big-endian.
	want := []byte{'p', '1', 0, 0, 0, 0, 0, 0x36, 0xee, 0x80, 0, 0, 0, 0}
	got := AppendWindowKey(nil, []byte("p1"), 3_600_000)
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendWindowKey = % x, want % x", got, want)
	}
	p, start, err := DecodeWindowKey(got)
	if err != nil || string(p) != "p1" || start != 3_600_000 {
		t.Fatalf("DecodeWindowKey = %q, %d, %v", p, start, err)
	}
	// A product may be empty or hold any byte, the tail is fixed.
	p, start, err = DecodeWindowKey(AppendWindowKey(nil, nil, 7))
	if err != nil || len(p) != 0 || start != 7 {
		t.Fatalf("empty product: %q, %d, %v", p, start, err)
	}
	if _, _, err := DecodeWindowKey([]byte("short")); !errors.Is(err, ErrBadWindowKey) {
		t.Fatalf("a 5-byte key: %v, want ErrBadWindowKey", err)
	}
}

func TestWindowStoreNames(t *testing.T) {
	for _, c := range []struct {
		size time.Duration
		want string
	}{
		{time.Hour, "1h"}, {24 * time.Hour, "24h"}, {15 * time.Minute, "15m"}, {90 * time.Second, "90s"},
		{90 * time.Minute, "90m"}, {1500 * time.Millisecond, "1500ms"},
	} {
		if got := FormatWindowSize(c.size); got != c.want {
			t.Errorf("FormatWindowSize(%s) = %q, want %q", c.size, got, c.want)
		}
	}
	if got := ChangelogTopic("app", WindowStoreName(StoreName, time.Hour)); got != "app-PRODUCT_AGGREGATED_SALES-1h-changelog" {
		t.Fatalf("window changelog = %q", got)
	}
}

func TestEventTimeFromAField(t *testing.T) {
	for _, c := range []struct {
		value string
		want  int64
		bad   bool
	}{
		{`{"product":"p","value":1,"at":1764892800123}`, 1_764_892_800_123, false},
		{`{"product":"p","value":1,"at":"2025-12-05T00:00:00.5Z"}`, 1_764_892_800_500, false},
		{`{"product":"p","value":1,"at":"2025-12-05T01:00:00+01:00"}`, 1_764_892_800_000, false},
		{`{"product":"p","value":1}`, 0, true},
		{`{"product":"p","value":1,"at":"yesterday"}`, 0, true},
		{`{"product":"p","value":1,"at":1.5}`, 0, true},
		{`[1]`, 0, true},
	} {
		got, err := EventTime([]byte(c.value), "at")
		if c.bad {
			if Reason(err) != ReasonBadTime {
				t.Errorf("EventTime(%s) = %d, %v; want a %s error", c.value, got, err, ReasonBadTime)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("EventTime(%s) = %d, %v; want %d", c.value, got, err, c.want)
		}
	}
}
