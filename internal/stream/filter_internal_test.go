package stream

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"testing"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
)

func TestALearningFilterAdoptsTheStoreAsItWasAtTheStart(t *testing.T) {
	// Scenario: a store holds 100,000 products when a task starts on it. Its filter
	// learns what the task writes from then on (2,000 products, half of them new) and is
	// not used meanwhile. The listing, taken before those writes, holds the 100,000 and
	// none of the new ones; once adopted, the filter says "may hold" for every product of
	// the store (old, rewritten and new) and "cannot hold" for nearly every other one. A
	// listing of another seed, or a filter that is not learning, adopts nothing. A
	// listing cut short by its context ends with the context's error.
	st, err := state.Open(t.TempDir(), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	write := func(prefix string, from, to int) {
		var ups []state.Update
		for i := from; i < to; i++ {
			ups = append(ups, state.Update{Product: fmt.Sprintf("%s%d", prefix, i), Entry: state.Entry{Total: int64(i)}})
		}
		if err := st.Apply(ups, state.Checkpoint{}); err != nil {
			t.Fatal(err)
		}
	}
	const old = 100_000
	write("old", 0, old)

	var f storeFilter
	f.reset(false)
	it, err := st.Products()
	if err != nil {
		t.Fatal(err)
	}
	f.learn()
	for i := range 1000 {
		f.add(fmt.Sprintf("old%d", i))
		f.add(fmt.Sprintf("new%d", i))
	}
	write("old", 0, 1000)
	write("new", 0, 1000)
	if !f.mayHold([]byte("never")) {
		t.Fatal("a learning filter, which is not used, says the store cannot hold a product")
	}

	base, n, err := buildFilter(context.Background(), it, f.seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if n != old {
		t.Fatalf("the listing held %d products, want the %d the store held when it was taken", n, old)
	}

	other := f
	other.seed = maphash.MakeSeed()
	other.adopt(base)
	if other.mode != filterLearning {
		t.Fatal("a filter adopted a listing of another seed")
	}
	var notLearning storeFilter
	notLearning.reset(false)
	notLearning.seed = base.seed
	notLearning.adopt(base)
	if notLearning.mode != filterOff {
		t.Fatal("a filter that was not learning adopted a listing")
	}

	f.adopt(base)
	if f.mode != filterKnown {
		t.Fatalf("after adopt: %v, want known", f.mode)
	}
	for i := range old {
		if p := fmt.Sprintf("old%d", i); !f.mayHold([]byte(p)) {
			t.Fatalf("the store holds %s, the filter says it cannot", p)
		}
	}
	for i := range 1000 {
		if p := fmt.Sprintf("new%d", i); !f.mayHold([]byte(p)) {
			t.Fatalf("the store holds %s (learned), the filter says it cannot", p)
		}
	}
	wrong := falsePositives(&f, "never", old)
	if wrong > old*3/100 {
		t.Errorf("%d of %d products never written may be held (want ≤ 3 %%)", wrong, old)
	}
	f.add("after")
	if !f.mayHold([]byte("after")) {
		t.Fatal("a product written after the adoption is not in the filter")
	}

	it, err = st.Products()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := buildFilter(ctx, it, f.seed); err != context.Canceled {
		t.Fatalf("a listing under a canceled context ended with %v, want context.Canceled", err)
	}
}

func TestTheFilterModesMoveOnlyAsAllowed(t *testing.T) {
	// Scenario: each move of a storeFilter from each state. reset goes to known (an empty
	// store) or off from anywhere; learn moves off → learning only; adopt moves learning →
	// known only, with a listing of its seed; abandon moves learning → off only and drops what
	// was learned, so that a failed listing leaves a filter that records nothing and is not
	// used (every lookup goes to the store).
	at := func(m filterMode) storeFilter {
		var f storeFilter
		f.reset(m == filterKnown)
		if m == filterLearning {
			f.learn()
		}
		if f.mode != m {
			t.Fatalf("could not put a filter in %v (it is %v)", m, f.mode)
		}
		return f
	}
	modes := []filterMode{filterOff, filterLearning, filterKnown}
	for _, from := range modes {
		for _, m := range []struct {
			name string
			do   func(*storeFilter)
			want map[filterMode]filterMode
		}{
			{"reset(empty)", func(f *storeFilter) { f.reset(true) }, map[filterMode]filterMode{filterOff: filterKnown, filterLearning: filterKnown, filterKnown: filterKnown}},
			{"reset(data)", func(f *storeFilter) { f.reset(false) }, map[filterMode]filterMode{filterOff: filterOff, filterLearning: filterOff, filterKnown: filterOff}},
			{"learn", (*storeFilter).learn, map[filterMode]filterMode{filterOff: filterLearning, filterLearning: filterLearning, filterKnown: filterKnown}},
			{"adopt", func(f *storeFilter) { f.adopt(storeFilter{mode: filterKnown, seed: f.seed}) }, map[filterMode]filterMode{filterOff: filterOff, filterLearning: filterKnown, filterKnown: filterKnown}},
			{"abandon", (*storeFilter).abandon, map[filterMode]filterMode{filterOff: filterOff, filterLearning: filterOff, filterKnown: filterKnown}},
		} {
			f := at(from)
			f.add("p")
			m.do(&f)
			if f.mode != m.want[from] {
				t.Errorf("%v --%s--> %v, want %v", from, m.name, f.mode, m.want[from])
			}
		}
	}

	f := at(filterLearning)
	f.add("learned")
	f.abandon()
	if f.levels != nil || f.bytes != 0 {
		t.Errorf("an abandoned filter keeps %d levels, %d bytes", len(f.levels), f.bytes)
	}
	f.add("after")
	if f.levels != nil || !f.mayHold([]byte("never")) {
		t.Error("a filter that is off records a write or says a product cannot be held")
	}
}

func TestStoreFilterNeverMissesAWrittenProduct(t *testing.T) {
	// Scenario: a filter of a store that started empty learns 1,000,000 products (four
	// levels): it says "may hold" for each of them, "cannot hold" for nearly every other
	// product (at most 3 % wrong), and a filter of a store that started with data always
	// says "may hold".
	var f storeFilter
	f.reset(true)
	const n = 1_000_000
	for i := range n {
		f.add(fmt.Sprintf("p%d", i))
	}
	for i := range n {
		if !f.mayHold([]byte(fmt.Sprintf("p%d", i))) {
			t.Fatalf("product p%d was added, the filter says the store cannot hold it", i)
		}
	}
	wrong := falsePositives(&f, "q", n)
	if wrong > n*3/100 {
		t.Errorf("%d of %d products never added may be held (want ≤ 3 %%)", wrong, n)
	}
	t.Logf("%d levels, %d bytes, %.2f %% false positives", len(f.levels), f.bytes, 100*float64(wrong)/n)
	var unknown storeFilter
	unknown.reset(false)
	unknown.add("p1")
	if !unknown.mayHold([]byte("anything")) {
		t.Error("a filter of a store with unknown products says it cannot hold one")
	}
}

// falsePositives counts the products prefix0 … prefix(n-1), none of them
// ever added, that f says the store may hold.
func falsePositives(f *storeFilter, prefix string, n int) int {
	wrong := 0
	for i := range n {
		if f.mayHold([]byte(prefix + strconv.Itoa(i))) {
			wrong++
		}
	}
	return wrong
}

func TestFilterFalsePositives(t *testing.T) {
	// Scenario: a task's filter holds 1M products (three levels, as a task's third of
	// 3M), written as a task writes them (asked first) and as a restored store's listing
	// adds them; of 500,000 products it never held it answers "maybe" for at most 0.2 %
	// (each a store lookup; 0.9 % at the 12 bits a product it once had), and "maybe"
	// for every product it holds.
	const n, q = 1_000_000, 500_000
	for _, listed := range []bool{false, true} {
		seed := maphash.MakeSeed()
		f := storeFilter{mode: filterKnown, seed: seed}
		for i := range n {
			h := maphash.String(seed, "p"+strconv.Itoa(i))
			if listed {
				f.addNew(h)
			} else {
				f.addHash(h)
			}
		}
		for i := 0; i < n; i += 97 {
			if !f.mayHold([]byte("p" + strconv.Itoa(i))) {
				t.Fatalf("listed %v: the filter says it cannot hold p%d, which it holds", listed, i)
			}
		}
		maybe := 0
		for i := range q {
			if f.mayHold([]byte("q" + strconv.Itoa(i))) {
				maybe++
			}
		}
		if rate := float64(maybe) / q; rate > 0.002 {
			t.Errorf("listed %v: %d of %d products never held answered maybe (%.3f %%), want at most 0.2 %%", listed, maybe, q, 100*rate)
		}
		t.Logf("listed %v: %d levels, %d bytes, false positives %.3f %%", listed, len(f.levels), f.bytes, 100*float64(maybe)/q)
	}
}
