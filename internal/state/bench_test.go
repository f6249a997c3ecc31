package state

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
)

// BenchmarkApply writes batches of 1000 products with their checkpoint, as a
// commit cycle or a restore fetch does.
func BenchmarkApply(b *testing.B) {
	s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ups := make([]Update, 1000)
	for i := range ups {
		ups[i] = Update{Product: fmt.Sprintf("product%06d", i), Entry: Entry{Total: int64(i), Offsets: sales.Offsets{TopicID: [16]byte{1}, Parts: []sales.PartitionOffset{{Partition: 0, Offset: int64(i)}}}}}
	}
	b.ReportAllocs()
	n := int64(0)
	for b.Loop() {
		n++
		if err := s.Apply(ups, Checkpoint{ChangelogOffset: n}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(ups))/b.Elapsed().Seconds(), "products/s")
}

func BenchmarkGet(b *testing.B) {
	s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ups := make([]Update, 10000)
	for i := range ups {
		ups[i] = Update{Product: fmt.Sprintf("product%06d", i), Entry: Entry{Total: int64(i)}}
	}
	if err := s.Apply(ups, Checkpoint{}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, err := s.Get(ups[i%len(ups)].Product); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// restoreProducts is the number of products BenchmarkRestoreBatches
// restores.
var restoreProducts = flag.Int("restore-products", 1_000_000, "products restored by BenchmarkRestoreBatches")

// restoreBudget is the memory of BenchmarkRestoreBatches' sorted load: a
// restore of three tasks at once gives each a third of 64 MiB.
var restoreBudget = flag.Int64("restore-budget", 64<<20, "memory of BenchmarkRestoreBatches/sorted's bulk load, in bytes")

// BenchmarkRestoreBatches writes 1,000,000 products (-restore-products) in random order into an
// empty store in unsynced batches of 20,000 with a final synced one, as a
// full restore does with the changelog's fetches: "tree" into a store opened
// as for running, "bulk" into one opened with BulkLoad, then one CompactAll,
// and "sorted" as a full restore does now: a Store.BulkLoad of 64 MiB,
// sorted runs merged into last-level tables and ingested. One iteration is
// one restore.
func BenchmarkRestoreBatches(b *testing.B) {
	products, batch := *restoreProducts, 20_000
	ups := make([]Update, products)
	perm := rand.New(rand.NewPCG(1, 2)).Perm(products)
	for i, p := range perm {
		ups[i] = Update{Product: "p" + strconv.Itoa(p), Entry: Entry{Total: int64(p), Offsets: sales.Offsets{TopicID: [16]byte{1}, Parts: []sales.PartitionOffset{{Partition: int32(p % 3), Offset: int64(i)}}}}}
	}
	for _, bulk := range []bool{false, true} {
		name := "tree"
		if bulk {
			name = "bulk"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{BulkLoad: bulk})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				for i := 0; i < products; i += batch {
					apply := s.ApplyUnsynced
					if i+batch >= products {
						apply = s.Apply
					}
					if err := apply(ups[i:min(i+batch, products)], Checkpoint{ChangelogOffset: int64(i + batch)}); err != nil {
						b.Fatal(err)
					}
				}
				if bulk {
					if err := s.CompactAll(b.Context()); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*products)/b.Elapsed().Seconds(), "records/s")
		})
	}
	b.Run("sorted", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			l, err := s.BulkLoad(BulkOptions{Budget: NewBulkBudget(*restoreBudget)})
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < products; i += batch {
				if err := l.Add(ups[i:min(i+batch, products)]); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := l.Finish(b.Context(), Checkpoint{ChangelogOffset: int64(products)}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(b.N*products)/b.Elapsed().Seconds(), "records/s")
	})
}

// BenchmarkGetMissing reads products the store does not hold, as the first
// event of every new product does, the way a task reads (Lookup, on the
// runtime's default 64 MiB block cache): 1,000,000 products in the store,
// written in batches so that they spread over several levels.
func BenchmarkGetMissing(b *testing.B) {
	bc := NewBlockCache(64 << 20)
	defer bc.Close()
	s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{BlockCache: bc})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ups := make([]Update, 20_000)
	for n := 0; n < 1_000_000; n += len(ups) {
		for i := range ups {
			ups[i] = Update{Product: "p" + strconv.Itoa(n+i), Entry: Entry{Total: int64(i)}}
		}
		if err := s.ApplyUnsynced(ups, Checkpoint{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	key := []byte{}
	for b.Loop() {
		key = strconv.AppendInt(append(key[:0], 'p'), int64(i), 10)
		key = append(key, 'x')
		if _, ok, err := s.Lookup(key); err != nil || ok {
			b.Fatal("found", err)
		}
		i = (i + 7919) % 1_000_000
	}
}

// BenchmarkGrowingStore fills a store opened as for running with products
// it has never seen, in random order, the way a task's commit cycles do when
// every event is a new product: each looked up first (a miss), then written
// in synced batches of 30,000 with the checkpoint. One iteration is one
// fill of an empty store; cpu-µs/product is the process's CPU (user+sys,
// Pebble's flushes and compactions included, until they are done) per
// product. 3M products is a task's share of 10M over three partitions.
func BenchmarkGrowingStore(b *testing.B) {
	for _, products := range []int{1_000_000, 3_000_000} {
		b.Run(strconv.Itoa(products), func(b *testing.B) {
			const batch = 30_000
			perm := rand.New(rand.NewPCG(1, 2)).Perm(products)
			bc := NewBlockCache(64 << 20)
			defer bc.Close()
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{BlockCache: bc})
				if err != nil {
					b.Fatal(err)
				}
				ups := make([]Update, 0, batch)
				key := []byte{}
				b.StartTimer()
				began := processCPU()
				for i, p := range perm {
					key = strconv.AppendInt(append(key[:0], 'p'), int64(p), 10)
					if _, ok, err := s.Lookup(key); err != nil || ok {
						b.Fatal("found", err)
					}
					ups = append(ups, Update{Product: string(key), Entry: Entry{Total: int64(p), Offsets: sales.Offsets{TopicID: [16]byte{1}, Parts: []sales.PartitionOffset{{Partition: int32(p % 3), Offset: int64(i)}}}}})
					if len(ups) == batch || i == len(perm)-1 {
						if err := s.Apply(ups, Checkpoint{ChangelogOffset: int64(i)}); err != nil {
							b.Fatal(err)
						}
						ups = ups[:0]
					}
				}
				for s.mu.db.Metrics().Compact.NumInProgress > 0 {
					time.Sleep(10 * time.Millisecond)
				}
				cpu += processCPU() - began
				b.StopTimer()
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*products), "cpu-µs/product")
			b.ReportMetric(float64(b.N*products)/b.Elapsed().Seconds(), "products/s")
		})
	}
}

// processCPU is the process's user+sys CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
