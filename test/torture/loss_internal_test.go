//go:build torture

package torture

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

// Scenario: the input holds five events of p1 on partition 0; the changelog
// holds a right value at offset 1 and then one that misses the event at
// offset 3. The localizer names the record, the last right one and the
// events between, and the offset range on partition 0.
func TestTortureCheckerLocalizesAWrongValue(t *testing.T) {
	id := [16]byte{1}
	var in []*kgo.Record
	for i, v := range []int64{10, 20, 30, 40, 50} {
		in = append(in, &kgo.Record{Partition: 0, Offset: int64(i), Key: []byte("p1"),
			Value: []byte(fmt.Sprintf(`{"product":"p1","value":%d}`, v))})
	}
	cl := func(off int64, v int64, reflects int64) *kgo.Record {
		offs := sales.Offsets{TopicID: id, Parts: []sales.PartitionOffset{{Partition: 0, Offset: reflects}}}
		return &kgo.Record{Partition: 2, Offset: off, Key: []byte("p1"), Value: sales.EncodeTotal(v),
			Headers: []kgo.RecordHeader{{Key: sales.OffsetsHeader, Value: offs.AppendEncode(nil)}}}
	}
	got := localizeMismatches(in, []*kgo.Record{cl(0, 30, 1), cl(1, 110, 4)}, id)
	if len(got) != 2 {
		t.Fatalf("got %d lines, want 2: %q", len(got), got)
	}
	for _, want := range []string{"p1: changelog 2@1 holds 110", "sums to 150 (off by -40)", "right at 2@0", "[0@2=30 0@3=40 0@4=50]"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("line %q lacks %q", got[0], want)
		}
	}
	if want := "input partition 0: the wrong values' windows span offsets 2..4"; got[1] != want {
		t.Errorf("got %q, want %q", got[1], want)
	}
	if got := localizeMismatches(in, []*kgo.Record{cl(0, 30, 1), cl(1, 150, 4)}, id); len(got) != 0 {
		t.Errorf("right values judged wrong: %q", got)
	}
}
