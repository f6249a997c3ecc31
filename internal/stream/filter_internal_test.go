package stream

import (
	"context"
	"fmt"
	"hash/maphash"
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
	if other.known {
		t.Fatal("a filter adopted a listing of another seed")
	}
	var notLearning storeFilter
	notLearning.reset(false)
	notLearning.seed = base.seed
	notLearning.adopt(base)
	if notLearning.known {
		t.Fatal("a filter that was not learning adopted a listing")
	}

	f.adopt(base)
	if !f.known || f.learning {
		t.Fatalf("after adopt: known %v, learning %v; want known and not learning", f.known, f.learning)
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
	wrong := 0
	for i := range old {
		if f.mayHold([]byte(fmt.Sprintf("never%d", i))) {
			wrong++
		}
	}
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
