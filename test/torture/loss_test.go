//go:build torture

package torture

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

// inputEvent is one event of the input as the checker read it.
type inputEvent struct {
	partition int32
	offset    int64
	value     int64
}

// localizeMismatches says, for each product whose changelog holds a value
// that is not what the input sums to at the offsets the record says it
// reflects, where that first happened: the record, the last earlier record
// that was right (if compaction left one), and the product's events
// between the two, which hold the ones missed or folded twice. Then, per
// input partition, the offset range those windows span: a loss confined to
// one range of one partition points at one rewind, hand-over or restore in
// the logs. Records of another topic than the input (repartitioned events)
// are not judged.
func localizeMismatches(in []*kgo.Record, changelog []*kgo.Record, inputID [16]byte) []string {
	events := map[string][]inputEvent{}
	for _, rec := range in {
		ev, err := sales.Decode(rec.Key, rec.Value)
		if err != nil {
			continue
		}
		events[ev.Key] = append(events[ev.Key], inputEvent{rec.Partition, rec.Offset, ev.Value})
	}
	sumAt := func(product string, offs sales.Offsets) int64 {
		var s int64
		for _, ev := range events[product] {
			if offs.Reflects(inputID, ev.partition, ev.offset) {
				s += ev.value
			}
		}
		return s
	}
	type where struct {
		at   string
		offs sales.Offsets
	}
	good := map[string]where{}
	judged := map[string]bool{}
	type span struct{ lo, hi int64 }
	spans := map[int32]*span{}
	var out []string
	for _, rec := range changelog {
		product := string(rec.Key)
		if judged[product] || len(rec.Value) != 8 {
			continue
		}
		var offs sales.Offsets
		found := false
		for _, h := range rec.Headers {
			if h.Key == sales.OffsetsHeader {
				if o, err := sales.DecodeOffsets(h.Value); err == nil {
					offs, found = o, true
				}
			}
		}
		if !found || (offs.TopicID != inputID && offs.TopicID != [16]byte{}) {
			continue
		}
		v := int64(binary.BigEndian.Uint64(rec.Value))
		at := fmt.Sprintf("%d@%d", rec.Partition, rec.Offset)
		want := sumAt(product, offs)
		if v == want {
			good[product] = where{at, offs}
			continue
		}
		judged[product] = true
		prev, hasPrev := good[product]
		var between []string
		var d int64
		for _, ev := range events[product] {
			if offs.Reflects(inputID, ev.partition, ev.offset) && !(hasPrev && prev.offs.Reflects(inputID, ev.partition, ev.offset)) {
				between = append(between, fmt.Sprintf("%d@%d=%d", ev.partition, ev.offset, ev.value))
				s := spans[ev.partition]
				if s == nil {
					s = &span{ev.offset, ev.offset}
					spans[ev.partition] = s
				}
				s.lo, s.hi = min(s.lo, ev.offset), max(s.hi, ev.offset)
				d += ev.value
			}
		}
		since := "no earlier record left"
		if hasPrev {
			since = fmt.Sprintf("right at %s (input %v)", prev.at, prev.offs.Parts)
		}
		if len(between) > 12 {
			between = append(between[:12], fmt.Sprintf("… %d more", len(between)-12))
		}
		out = append(out, fmt.Sprintf("%s: changelog %s holds %d, reflecting input %v, where the input sums to %d (off by %d); %s; its events between (sum %d): %v",
			product, at, v, offs.Parts, want, v-want, since, d, between))
	}
	var parts []int32
	for p := range spans {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	for _, p := range parts {
		out = append(out, fmt.Sprintf("input partition %d: the wrong values' windows span offsets %d..%d", p, spans[p].lo, spans[p].hi))
	}
	return out
}
