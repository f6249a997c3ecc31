package stream

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// TestCycleUpdatesOutliveTheArena: a cycle's updates wait for the
// changelog's acknowledgements while the next cycle folds into the same
// arena entries; their offsets must stay the ones the cycle produced. The
// products come from the entry cache (offsets copied into the arena's room)
// and from the store.
func TestCycleUpdatesOutliveTheArena(t *testing.T) {
	st, err := state.Open(t.TempDir(), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	in := [16]byte{7}
	a := newAggregation("changelog", 1<<20)
	a.store.Store(st)
	// Half the products committed in the store only, half in the store
	// and the cache, all at offsets of partition 0.
	var committed []state.Update
	for i := range 200 {
		committed = append(committed, state.Update{Product: fmt.Sprintf("p%03d", i),
			Entry: state.Entry{Total: 1, Offsets: sales.Offsets{}.With(in, 0, int64(i))}})
	}
	if err := a.write(committed, state.Checkpoint{ChangelogOffset: 200}, nil); err != nil {
		t.Fatal(err)
	}
	a.cache.forget()
	for _, u := range committed[:100] {
		a.cache.put(u.Product, u.Entry)
	}
	cycle := func(first int64) []state.Update {
		for i := range 200 {
			if dup, bad, err := a.fold([]byte(fmt.Sprintf("p%03d", i)), 10, source{topic: in, partition: 0, offset: first + int64(i), record: true}); dup || bad != nil || err != nil {
				t.Fatalf("fold p%03d at %d: dup %t, bad %v, err %v", i, first+int64(i), dup, bad, err)
			}
		}
		updates, _ := a.records(recordSpec{threshold: 1 << 40}, func(*kgo.Record, bool) {})
		a.reset()
		return updates
	}
	first := cycle(1000)
	// The next cycle folds the same products into the same arena entries
	// before the first cycle's updates are written.
	cycle(2000)
	if len(first) != 200 {
		t.Fatalf("%d updates, want 200", len(first))
	}
	for _, u := range first {
		var i int64
		fmt.Sscanf(u.Product, "p%03d", &i)
		want := sales.Offsets{}.With(in, 0, 1000+i)
		if u.Entry.Total != 11 || !reflect.DeepEqual(u.Entry.Offsets, want) {
			t.Errorf("%s: the first cycle's update is total %d, offsets %v; want 11, %v", u.Product, u.Entry.Total, u.Entry.Offsets, want)
		}
	}
}
