package state

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
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

func TestRunRoundTripsLargeRecordsAndRefusesACutOne(t *testing.T) {
	// Scenario: a run holds 3,000 records, one with a 1 MiB value and one with a 100 KiB
	// key (both larger than the run's read and write buffers), and deletions; read from
	// its start and from a key past its second mark it gives back every record in key
	// order; cut inside a record (in a length, a key or the large value) it is an error,
	// never a clean end.
	type rec struct {
		k, v []byte
		del  bool
	}
	buf := &sortBuffer{chunkSize: 64 << 10}
	var want []rec
	for i := range 3000 {
		k := []byte(fmt.Sprintf("k%05d", i))
		v := []byte(strconv.Itoa(i))
		switch i {
		case 500:
			v = bytes.Repeat([]byte{'v'}, 1<<20)
		case 1500:
			k = append(k, bytes.Repeat([]byte{'x'}, 100<<10)...)
		}
		del := i%10 == 7
		if del {
			v = nil
		}
		buf.add(k, v, del)
		want = append(want, rec{k, v, del})
	}
	buf.sort()
	path := filepath.Join(t.TempDir(), "run")
	sp := spill(buf, path)
	if sp.err != nil {
		t.Fatal(sp.err)
	}
	if len(sp.r.marks) != 3 {
		t.Fatalf("%d marks, want 3", len(sp.r.marks))
	}
	read := func(lo []byte, path string) ([]rec, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		src, err := openRunSource(f, sp.r.marks, lo, nil)
		if err != nil {
			return nil, err
		}
		var got []rec
		for {
			ok, err := src.next()
			if err != nil || !ok {
				return got, err
			}
			v, del := src.value()
			got = append(got, rec{slices.Clone(src.key()), slices.Clone(v), del})
		}
	}
	same := func(got, want []rec) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%d records read, want %d", len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i].k, want[i].k) || !bytes.Equal(got[i].v, want[i].v) || got[i].del != want[i].del {
				t.Fatalf("record %d: key %.20q (%d bytes), %d value bytes, deletion %v; want %.20q (%d bytes), %d, %v",
					i, got[i].k, len(got[i].k), len(got[i].v), got[i].del, want[i].k, len(want[i].k), len(want[i].v), want[i].del)
			}
		}
	}
	got, err := read(nil, path)
	if err != nil {
		t.Fatal(err)
	}
	same(got, want)
	if got, err = read(want[2100].k, path); err != nil {
		t.Fatal(err)
	}
	same(got, want[2100:])

	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	large := bytes.Index(whole, bytes.Repeat([]byte{'v'}, 64))
	for _, cut := range []int{1, 3, large + 1000, len(whole) - 1} {
		cutPath := filepath.Join(t.TempDir(), "cut")
		if err := os.WriteFile(cutPath, whole[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := read(nil, cutPath); err == nil {
			t.Errorf("a run cut at byte %d of %d read as %d records and a clean end", cut, len(whole), len(got))
		}
	}
}
