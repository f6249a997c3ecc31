package sales

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
)

var (
	topicA = [16]byte{0xa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	topicB = [16]byte{0xb, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	noID   [16]byte
)

func TestOffsetsEncodingRoundTrip(t *testing.T) {
	// Scenario: offsets round-trip in both encodings, the new one only when the topic id is known.
	for _, tc := range []struct {
		name    string
		offs    Offsets
		wantLen int
	}{
		{"legacy empty", Offsets{}, 0},
		{"legacy one", Offsets{Parts: []PartitionOffset{{1, 7}}}, 12},
		{"legacy several", Offsets{Parts: []PartitionOffset{{0, 0}, {2, 1 << 40}, {9, -1}}}, 36},
		{"v2 empty", Offsets{TopicID: topicA}, 17},
		{"v2 one", Offsets{TopicID: topicA, Parts: []PartitionOffset{{1, 7}}}, 29},
		{"v2 several", Offsets{TopicID: topicB, Parts: []PartitionOffset{{0, 0}, {2, 1 << 40}, {2147483647, 9}}}, 53},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc := tc.offs.AppendEncode([]byte("prefix"))
			if !bytes.HasPrefix(enc, []byte("prefix")) {
				t.Fatalf("AppendEncode dropped what it appended to: %x", enc)
			}
			enc = enc[len("prefix"):]
			if len(enc) != tc.wantLen || tc.offs.EncodedLen() != tc.wantLen {
				t.Fatalf("encoding is %d bytes, EncodedLen %d, want %d", len(enc), tc.offs.EncodedLen(), tc.wantLen)
			}
			if tc.offs.TopicID != noID && (enc[0] != 2 || !bytes.Equal(enc[1:17], tc.offs.TopicID[:])) {
				t.Fatalf("v2 encoding does not start with version 2 and the id: %x", enc)
			}
			back, err := DecodeOffsets(enc)
			if err != nil || back.TopicID != tc.offs.TopicID || !slices.Equal(back.Parts, tc.offs.Parts) {
				t.Fatalf("DecodeOffsets(%x) = %+v, %v; want %+v", enc, back, err, tc.offs)
			}
		})
	}
}

func TestDecodeOffsetsLegacy(t *testing.T) {
	// Scenario: a header or store entry written before offsets carried a topic id decodes with a zero id.
	legacy := []byte{
		0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 42, // partition 1, offset 42
		0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 1, 0, // partition 3, offset 256
	}
	offs, err := DecodeOffsets(legacy)
	if err != nil {
		t.Fatal(err)
	}
	if offs.TopicID != noID || !slices.Equal(offs.Parts, []PartitionOffset{{1, 42}, {3, 256}}) {
		t.Fatalf("legacy decoded as %+v", offs)
	}
	// Legacy offsets match any topic: an upgraded instance still skips redelivered events.
	if !offs.Reflects(topicA, 1, 42) || offs.Reflects(topicA, 1, 43) || !offs.Reflects(topicB, 3, 0) {
		t.Fatalf("legacy offsets %+v do not match a known topic", offs)
	}
	// The first fold after the upgrade ties them to the topic and keeps them.
	offs = offs.With(topicA, 1, 43)
	if offs.TopicID != topicA || !slices.Equal(offs.Parts, []PartitionOffset{{1, 43}, {3, 256}}) {
		t.Fatalf("after With: %+v", offs)
	}
	if !bytes.Equal(offs.AppendEncode(nil)[17:29], []byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 43}) {
		t.Fatalf("re-encoded %x", offs.AppendEncode(nil))
	}
}

func TestDecodeOffsetsRejectsBadEncodings(t *testing.T) {
	// Scenario: lengths that are neither form, and an unknown version, are ErrBadOffsets, never a panic.
	v3 := append([]byte{3}, make([]byte, 16+12)...)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"1 byte", []byte{2}},
		{"3 bytes", []byte{1, 2, 3}},
		{"5 bytes (v2 length class, shorter than its head)", []byte{2, 0, 0, 0, 0}},
		{"11 bytes", make([]byte, 11)},
		{"13 bytes", make([]byte, 13)},
		{"16 bytes (id without version)", topicA[:]},
		{"18 bytes", append([]byte{2}, make([]byte, 17)...)},
		{"v2 head and half an entry", append(append([]byte{2}, topicA[:]...), 0, 0, 0, 1, 0, 0)},
		{"version 3", v3},
		{"version 0 with v2 length", append([]byte{0}, make([]byte, 16)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if offs, err := DecodeOffsets(tc.b); !errors.Is(err, ErrBadOffsets) {
				t.Fatalf("DecodeOffsets(%x) = %+v, %v; want ErrBadOffsets", tc.b, offs, err)
			}
		})
	}
}

func TestOffsetsAcrossTopicIDs(t *testing.T) {
	// Scenario: offsets of one incarnation of the input topic say nothing about another's events;
	// an unknown (zero) id on either side matches.
	stored := Offsets{TopicID: topicA, Parts: []PartitionOffset{{0, 100}, {2, 50}}}
	for _, tc := range []struct {
		name    string
		offs    Offsets
		topicID [16]byte
		p       int32
		o       int64
		want    bool
	}{
		{"same id, at the offset", stored, topicA, 0, 100, true},
		{"same id, below", stored, topicA, 2, 3, true},
		{"same id, above", stored, topicA, 0, 101, false},
		{"same id, other partition", stored, topicA, 1, 0, false},
		{"other id, below", stored, topicB, 0, 5, false},
		{"other id, at the offset", stored, topicB, 2, 50, false},
		{"event id unknown", stored, noID, 0, 100, true},
		{"stored id unknown", Offsets{Parts: stored.Parts}, topicB, 2, 50, true},
		{"both unknown", Offsets{Parts: stored.Parts}, noID, 2, 51, false},
		{"nothing stored", Offsets{}, topicA, 0, 0, false},
	} {
		t.Run("Reflects/"+tc.name, func(t *testing.T) {
			if got := tc.offs.Reflects(tc.topicID, tc.p, tc.o); got != tc.want {
				t.Fatalf("%+v.Reflects(%x, %d, %d) = %v, want %v", tc.offs, tc.topicID[:1], tc.p, tc.o, got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name    string
		offs    Offsets
		topicID [16]byte
		p       int32
		o       int64
		want    Offsets
	}{
		{"same id, known partition", stored, topicA, 2, 51,
			Offsets{TopicID: topicA, Parts: []PartitionOffset{{0, 100}, {2, 51}}}},
		{"same id, new partition sorts in", stored, topicA, 1, 7,
			Offsets{TopicID: topicA, Parts: []PartitionOffset{{0, 100}, {1, 7}, {2, 50}}}},
		{"other id drops the old offsets", stored, topicB, 2, 0,
			Offsets{TopicID: topicB, Parts: []PartitionOffset{{2, 0}}}},
		{"stored id unknown: kept and tied to the topic", Offsets{Parts: []PartitionOffset{{0, 100}}}, topicB, 1, 3,
			Offsets{TopicID: topicB, Parts: []PartitionOffset{{0, 100}, {1, 3}}}},
		{"event id unknown: the stored id stays", stored, noID, 0, 101,
			Offsets{TopicID: topicA, Parts: []PartitionOffset{{0, 101}, {2, 50}}}},
		{"both unknown", Offsets{}, noID, 4, 1,
			Offsets{Parts: []PartitionOffset{{4, 1}}}},
		{"nothing stored", Offsets{}, topicA, 0, 9,
			Offsets{TopicID: topicA, Parts: []PartitionOffset{{0, 9}}}},
	} {
		t.Run("With/"+tc.name, func(t *testing.T) {
			got := tc.offs.Clone().With(tc.topicID, tc.p, tc.o)
			if got.TopicID != tc.want.TopicID || !slices.Equal(got.Parts, tc.want.Parts) {
				t.Fatalf("%+v.With(%x, %d, %d) = %+v, want %+v", tc.offs, tc.topicID[:1], tc.p, tc.o, got, tc.want)
			}
			if !got.Reflects(tc.topicID, tc.p, tc.o) || got.Reflects(tc.topicID, tc.p, tc.o+1) {
				t.Fatalf("%+v does not reflect exactly up to what With folded", got)
			}
		})
		t.Run("Set/"+tc.name, func(t *testing.T) {
			got := tc.offs.Clone()
			got.Set(tc.topicID, tc.p, tc.o)
			if got.TopicID != tc.want.TopicID || !slices.Equal(got.Parts, tc.want.Parts) {
				t.Fatalf("%+v.Set(%x, %d, %d) = %+v, want %+v", tc.offs, tc.topicID[:1], tc.p, tc.o, got, tc.want)
			}
		})
	}

	// The recreated topic's events are folded, then recognised when redelivered.
	offs := stored.Clone()
	if offs.Reflects(topicB, 0, 0) {
		t.Fatal("offset 0 of a recreated topic taken for a duplicate")
	}
	offs = offs.With(topicB, 0, 0)
	if !offs.Reflects(topicB, 0, 0) || offs.Reflects(topicA, 0, 100) {
		t.Fatalf("after the recreated topic's first event: %+v", offs)
	}
	if stored.Parts[0] != (PartitionOffset{0, 100}) {
		t.Fatalf("With on a clone changed the original: %+v", stored)
	}
}

func TestWithNeverChangesItsReceiver(t *testing.T) {
	// Scenario: an entry's offsets shared with another holder (a cache of committed entries) are
	// never changed by With on a copy, whether it updates a partition or adds one; changing them
	// made a redelivered event after an aborted transaction look like a duplicate and be lost.
	id := [16]byte{7}
	held := Offsets{}.With(id, 0, 10).With(id, 2, 20)
	want := held.Clone()
	_ = held.With(id, 0, 11)
	_ = held.With(id, 1, 15)
	_ = held.With(id, 2, 21)
	if !reflect.DeepEqual(held, want) {
		t.Fatalf("With changed its receiver: %+v, want %+v", held, want)
	}
	if got := held.With(id, 0, 11); !got.Reflects(id, 0, 11) || got.Reflects(id, 0, 12) {
		t.Fatalf("With(0, 11) = %+v", got)
	}
}

func TestAppendNotificationMatchesEncode(t *testing.T) {
	// Scenario: the notification value built without encoding/json is byte for byte what
	// encoding/json writes, for plain products and for every product that needs escaping.
	for _, p := range []string{"p1", "", "a b~", `q"uote`, `back\slash`, "tab\t", "nl\n", "\x01", "del\x7f", "é", "\u2028", "<&>", "\xff"} {
		for _, total := range []int64{0, -1, 2000, math.MaxInt64, math.MinInt64} {
			got := AppendNotification([]byte("prefix"), p, total)
			if want := append([]byte("prefix"), EncodeNotification(p, total)...); !bytes.Equal(got, want) {
				t.Errorf("AppendNotification(%q, %d) = %s, want %s", p, total, got, want)
			}
		}
	}
}

func FuzzAppendNotificationMatchesEncode(f *testing.F) {
	f.Add("p1", int64(2000))
	f.Add(`a"b`, int64(-5))
	f.Fuzz(func(t *testing.T, p string, total int64) {
		if got, want := AppendNotification(nil, p, total), EncodeNotification(p, total); !bytes.Equal(got, want) {
			t.Fatalf("AppendNotification(%q, %d) = %s, want %s", p, total, got, want)
		}
	})
}

// TestChangelogTopicIsKafkaStreamsName: the changelog topic is named as Kafka
// Streams names the reference application's, and is recognised as one.
func TestChangelogTopicIsKafkaStreamsName(t *testing.T) {
	for _, tc := range []struct {
		appID, store, want string
	}{
		{"sales-aggregator", StoreName, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog"},
		{"app", "totals", "app-totals-changelog"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			got := ChangelogTopic(tc.appID, tc.store)
			if got != tc.want {
				t.Fatalf("ChangelogTopic(%q, %q) = %q, want %q", tc.appID, tc.store, got, tc.want)
			}
			if !IsChangelogTopic(got) {
				t.Fatalf("IsChangelogTopic(%q) = false", got)
			}
		})
	}
	for _, topic := range []string{"sales-events-v1", "app-totals-repartition", "changelog"} {
		if IsChangelogTopic(topic) {
			t.Errorf("IsChangelogTopic(%q) = true", topic)
		}
	}
}

func TestCanonicalOffsetsIsDecodeThenEncode(t *testing.T) {
	// Scenario: a bulk restore copies the header's bytes instead of decoding and encoding them again; for every encoding, valid or not, the bytes it keeps are the ones the decode and encode would write.
	parts := []PartitionOffset{{0, 7}, {2, 1 << 40}}
	v2 := func(id [16]byte, ps []PartitionOffset) []byte {
		b := append([]byte{offsetsVersion}, id[:]...)
		return Offsets{Parts: ps}.AppendEncode(b)
	}
	cases := [][]byte{
		nil,
		{},
		Offsets{Parts: parts}.AppendEncode(nil), // legacy
		v2(topicA, parts),                       // version 2
		v2(topicA, nil),                         // version 2, no parts
		v2(noID, parts),                         // version 2 of a zero id
		v2(noID, nil),                           // the same, no parts
		{2},                                     // too short
		append([]byte{3}, make([]byte, 16+12)...),  // unknown version
		append([]byte{2}, make([]byte, 17)...),     // no class
		append(v2(topicA, parts)[:30], 1, 2, 3, 4), // cut
	}
	for i := range 64 {
		// Every length up to five entries past a head, of noise.
		b := make([]byte, i)
		for j := range b {
			b[j] = byte(j*31 + i)
		}
		if i > 0 && i%3 == 0 {
			b[0] = offsetsVersion
		}
		cases = append(cases, b)
	}
	for _, b := range cases {
		var want []byte
		if offs, err := DecodeOffsets(b); err == nil {
			want = offs.AppendEncode(nil)
		}
		if got := CanonicalOffsets(b); !bytes.Equal(got, want) {
			t.Errorf("CanonicalOffsets(%x) = %x; DecodeOffsets then AppendEncode = %x", b, got, want)
		}
	}
}
