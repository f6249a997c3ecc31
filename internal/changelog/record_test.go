package changelog_test

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/sales"
)

func TestEncodedReadsWhatUpdateReads(t *testing.T) {
	// Scenario: a bulk restore keeps a record's offsets as their bytes (Encoded) where every other reader decodes them (Update); for every kind of record the two give the same stored entry.
	id := [16]byte{7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	offs := sales.Offsets{TopicID: id, Parts: []sales.PartitionOffset{{Partition: 0, Offset: 9}, {Partition: 2, Offset: 1 << 33}}}
	legacy := sales.Offsets{Parts: offs.Parts}
	zeroV2 := append(append([]byte{2}, make([]byte, 16)...), legacy.AppendEncode(nil)...)
	hdr := func(vs ...[]byte) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for _, v := range vs {
			hs = append(hs, kgo.RecordHeader{Key: sales.OffsetsHeader, Value: v})
		}
		return hs
	}
	for _, tc := range []struct {
		name string
		rec  kgo.Record
		bad  bool
	}{
		{"tombstone", kgo.Record{Key: []byte("p1")}, false},
		{"no header (the reference's)", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(42)}, false},
		{"version 2", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(-5), Headers: hdr(offs.AppendEncode(nil))}, false},
		{"legacy", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(5), Headers: hdr(legacy.AppendEncode(nil))}, false},
		{"version 2 of a zero id", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(5), Headers: hdr(zeroV2)}, false},
		{"empty header", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(5), Headers: hdr([]byte{})}, false},
		{"unreadable header", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(5), Headers: hdr([]byte{1, 2, 3})}, false},
		{"unreadable after a readable one", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(5), Headers: hdr(offs.AppendEncode(nil), []byte{9})}, false},
		{"readable after an unreadable one", kgo.Record{Key: []byte("p1"), Value: sales.EncodeTotal(5), Headers: hdr([]byte{9}, legacy.AppendEncode(nil))}, false},
		{"a value that is not a total", kgo.Record{Key: []byte("p1"), Value: []byte("12")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, uerr := changelog.Update(&tc.rec)
			total, enc, del, err := changelog.Encoded(&tc.rec)
			if (uerr != nil) != tc.bad || (err != nil) != tc.bad {
				t.Fatalf("Update error %v, Encoded error %v; want an error: %v", uerr, err, tc.bad)
			}
			if tc.bad {
				return
			}
			if del != u.Delete || total != u.Entry.Total {
				t.Fatalf("Encoded = total %d, deletion %v; Update = %+v", total, del, u)
			}
			if want := u.Entry.Offsets.AppendEncode(nil); !bytes.Equal(enc, want) {
				t.Fatalf("Encoded offsets %x; Update's, encoded, %x", enc, want)
			}
		})
	}
}
