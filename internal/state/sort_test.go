package state

import (
	"bufio"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// fillSortBuffer adds n records with keys drawn by key from rng, in order,
// values carrying their arrival number.
func fillSortBuffer(n int, rng *rand.Rand, key func(*rand.Rand) string) *sortBuffer {
	b := &sortBuffer{chunkSize: 64 << 10}
	for i := 0; i < n; i++ {
		b.add([]byte(key(rng)), []byte(strconv.Itoa(i)), rng.IntN(10) == 0)
	}
	return b
}

func TestRadixSortOrdersAsTheComparison(t *testing.T) {
	// Scenario: short keys, keys that share their first 8 bytes and differ
	// after them, keys repeated (the later record must sort after the
	// earlier), over sizes below and far above the comparison cut-off:
	// the radix sort gives exactly the comparison sort's order.
	keys := map[string]func(*rand.Rand) string{
		"short":    func(r *rand.Rand) string { return "p" + strconv.Itoa(r.IntN(5000)) },
		"shared-8": func(r *rand.Rand) string { return "product-" + strconv.Itoa(r.IntN(5000)) },
		"mixed": func(r *rand.Rand) string {
			return string([]byte{byte(r.IntN(4)), byte(r.IntN(256))})[:1+r.IntN(2)] + strconv.Itoa(r.IntN(300))
		},
		"one-key": func(*rand.Rand) string { return "same" },
		"binary": func(r *rand.Rand) string {
			k := make([]byte, 6+r.IntN(7))
			for i := range k {
				k[i] = byte(r.IntN(3) * 127) // few digits: long runs of equal bytes
			}
			return string(k)
		},
		"empty-or-one": func(r *rand.Rand) string { return "x"[:r.IntN(2)] },
	}
	for name, key := range keys {
		for _, n := range []int{0, 1, radixSmall - 1, radixSmall, 1000, 50_000} {
			rng := rand.New(rand.NewPCG(uint64(n), 7))
			b := fillSortBuffer(n, rng, key)
			want := slices.Clone(b.idx)
			slices.SortFunc(want, b.compare)
			for _, depth := range []int{-1, 0} { // -1: order(), which picks its depth
				got := slices.Clone(b.idx)
				if depth < 0 {
					b.order(got)
				} else {
					b.radixSort(got, depth)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s, %d records, depth %d: the radix sort's order differs from the comparison's", name, n, depth)
				}
			}
		}
	}
}

func TestSortKeepsTheLastRecordOfEachKey(t *testing.T) {
	b := &sortBuffer{chunkSize: 1 << 10}
	for i, k := range []string{"b", "product-2", "a", "b", "product-1", "product-2", "a"} {
		b.add([]byte(k), []byte{byte('0' + i)}, false)
	}
	b.add([]byte("gone"), nil, true)
	b.sort()
	var got []string
	for i := range b.idx {
		v, del := b.value(&b.idx[i])
		got = append(got, string(b.key(&b.idx[i]))+"="+string(v)+map[bool]string{true: "(deleted)"}[del])
	}
	want := []string{"a=6", "b=3", "gone=(deleted)", "product-1=4", "product-2=5"}
	if !slices.Equal(got, want) {
		t.Fatalf("sorted = %v, want %v", got, want)
	}
}

// BenchmarkSortBuffer sorts one run's references (1M records, keys "p<N>"
// over 1M products, as a 10M-product restore's runs hold them) by the
// comparison sort and by the radix sort, side by side.
func BenchmarkSortBuffer(b *testing.B) {
	const n = 1_000_000
	for _, kind := range []struct {
		name string
		key  func(*rand.Rand) string
	}{
		{"short-keys", func(r *rand.Rand) string { return "p" + strconv.Itoa(r.IntN(n)) }},
		{"shared-prefix", func(r *rand.Rand) string { return "product-" + strconv.Itoa(r.IntN(n)) }},
	} {
		buf := fillSortBuffer(n, rand.New(rand.NewPCG(1, 2)), kind.key)
		orig := slices.Clone(buf.idx)
		for _, sorter := range []struct {
			name string
			sort func([]sortRef)
		}{
			{"comparison", func(refs []sortRef) { slices.SortFunc(refs, buf.compare) }},
			{"radix", func(refs []sortRef) { buf.order(refs) }},
		} {
			b.Run(kind.name+"/"+sorter.name, func(b *testing.B) {
				refs := make([]sortRef, n)
				for b.Loop() {
					copy(refs, orig)
					sorter.sort(refs)
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "refs/s")
			})
		}
	}
}

// BenchmarkWriteRun writes one sorted run (300,000 records of a
// 10M-product restore: keys "p<N>", a total and offsets as values) as a
// spill does, to a discarding writer: the gather of the records in key
// order from the buffer's chunks.
func BenchmarkWriteRun(b *testing.B) {
	const n = 300_000
	rng := rand.New(rand.NewPCG(1, 2))
	buf := &sortBuffer{chunkSize: 1 << 20}
	value := make([]byte, 8+17+12)
	for range n {
		buf.add([]byte("p"+strconv.Itoa(rng.IntN(10_000_000))), value, false)
	}
	buf.sort()
	w := bufio.NewWriterSize(io.Discard, 256<<10)
	for b.Loop() {
		if _, err := buf.writeRun(w); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(buf.idx))/b.Elapsed().Seconds(), "records/s")
}
