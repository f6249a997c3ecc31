package stream

import (
	"fmt"
	"hash/maphash"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"

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

// BenchmarkFold measures one event folded by a task (decode, owner check,
// lookup, duplicate check, add, offsets), the per-event work of the
// processing loop, over 100,000 products of partition 0 in a real store.
// "dirty": the product already changed this cycle; "cache": changed in an
// earlier cycle (the dirty map is emptied every 100,000 events, as a commit
// does); "store": the same with the entry cache off, so every first event
// of a product in a cycle reads Pebble.
func BenchmarkFold(b *testing.B) {
	const products = 100_000
	var keys []string
	for i := 0; len(keys) < products; i++ {
		k := fmt.Sprintf("p%d", i)
		if sales.Partition([]byte(k), 3) == 0 {
			keys = append(keys, k)
		}
	}
	recs := make([]*kgo.Record, products)
	for i, k := range keys {
		recs[i] = &kgo.Record{Key: []byte(k), Value: fmt.Appendf(nil, `{"product":%q,"value":%d}`, k, 1+i%1000)}
	}
	for _, c := range []struct {
		name     string
		cacheMax int64
		cycle    int
	}{{"dirty", 64 << 20, 1 << 62}, {"cache", 64 << 20, products}, {"store", 0, products}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := config.Default()
			cfg.StateDir = b.TempDir()
			cfg.CacheMaxBytes = c.cacheMax
			dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
			if err != nil {
				b.Fatal(err)
			}
			defer dir.Close()
			// A task alone, given what it uses: no runtime, no broker.
			e := &env{cfg: cfg, log: zap.NewNop(), dir: dir, metrics: newInstruments(cfg.ProcessingGuarantee)}
			// The store as Run opens it: on the runtime's block cache.
			e.blockCache = state.NewBlockCache(cfg.StoreCacheBytes)
			defer e.blockCache.Close()
			topo := topology{partitions: 3, notificationPartitions: 3, inputID: [16]byte{1}, changelogID: [16]byte{2}}
			t := newTask(taskDeps{env: e, topo: topo}, 0)
			st, err := state.Open(dir.TaskPath(0), zap.NewNop(), e.storeOptions())
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			t.totals.store.Store(st)
			ctx := b.Context()
			offset := int64(0)
			// One pass so that every product has an entry in the store (and
			// the cache when it is on).
			fold := func() {
				r := recs[offset%products]
				r.Offset = offset
				offset++
				if err := t.process(ctx, cfg.InputTopic, r); err != nil {
					b.Fatal(err)
				}
				if len(t.totals.dirty) >= c.cycle || (offset%int64(c.cycle) == 0) {
					updates := make([]state.Update, 0, len(t.totals.dirty))
					for k, e := range t.totals.dirty {
						// Copies: the arena's offsets are reused once emptied.
						updates = append(updates, state.Update{Product: k, Entry: state.Entry{Total: e.Total, Offsets: e.Offsets.Clone()}})
					}
					t.dropDirty()
					if err := t.apply(updates, -1, offset); err != nil {
						b.Fatal(err)
					}
				}
			}
			for range products {
				fold()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				fold()
			}
		})
	}
}

// BenchmarkFilterBuild adds 3,300,000 distinct products (a task's third of
// 10M) to a filter as the listing of a restored store does ("new"), and
// as a filter that asks first does ("checked").
func BenchmarkFilterBuild(b *testing.B) {
	const n = 3_300_000
	seed := maphash.MakeSeed()
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = maphash.String(seed, "p"+strconv.Itoa(i))
	}
	for _, checked := range []bool{true, false} {
		name := "new"
		if checked {
			name = "checked"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				f := storeFilter{mode: filterKnown, seed: seed}
				for _, h := range hs {
					if checked {
						f.addHash(h)
					} else {
						f.addNew(h)
					}
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "products/s")
		})
	}
}
