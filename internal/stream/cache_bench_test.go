package stream

import (
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// BenchmarkEntryLookup compares what folding an event of a product not
// changed in the current cycle costs to read: the entry cache against the
// Pebble store it fronts (100,000 products, 8 MiB block cache).
func BenchmarkEntryLookup(b *testing.B) {
	const products = 100_000
	st, err := state.Open(b.TempDir(), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	c := newEntryCache(64 << 20)
	keys := make([]string, products)
	var updates []state.Update
	for i := range products {
		keys[i] = fmt.Sprintf("product%d", i)
		e := state.Entry{Total: int64(i), Offsets: sales.Offsets{}.With([16]byte{1}, 0, int64(i))}
		updates = append(updates, state.Update{Product: keys[i], Entry: e})
		c.put(keys[i], e)
	}
	if err := st.Apply(updates, state.Checkpoint{ChangelogOffset: products}); err != nil {
		b.Fatal(err)
	}
	b.Run("cache", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, ok := c.get(keys[i%products]); !ok {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, ok, err := st.Get(keys[i%products]); err != nil || !ok {
				b.Fatal("miss", err)
			}
			i += 7919
		}
	})
}
