package config

import (
	"crypto/rand"
	"fmt"
	"runtime"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func TestStoreCachesInHeapSaysWherePebbleAllocates(t *testing.T) {
	// Scenario: the default memory limit counts Pebble's block cache only when this build
	// allocates it in the Go heap (StoreCachesInHeap). A store on disk with 32 MiB of
	// incompressible values, read back whole through a 64 MiB block cache: the Go heap grows by
	// about the cache's size when the constant says in heap, and by little when it says outside.
	if raceEnabled {
		t.Skip("under -race Pebble allocates its caches in the Go heap half the time, with cgo or not; make test runs this test again without -race, with and without cgo")
	}
	cache := pebble.NewCache(64 << 20)
	defer cache.Unref()
	db, err := pebble.Open(t.TempDir(), &pebble.Options{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	value := make([]byte, 4096)
	for i := range 8192 {
		_, _ = rand.Read(value)
		if err := db.Set(fmt.Appendf(nil, "k%06d", i), value, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	cached := cache.Metrics().Size
	grew := int64(heap()) - int64(before)
	t.Logf("read %d values: block cache %d MiB, Go heap grew %d MiB (StoreCachesInHeap %v)", n, cached>>20, grew>>20, StoreCachesInHeap)
	if n != 8192 || cached < 24<<20 {
		t.Fatalf("read %d values into a cache of %d bytes: want 8192 and at least 24 MiB", n, cached)
	}
	switch {
	case StoreCachesInHeap && grew < cached/2:
		t.Errorf("StoreCachesInHeap is true but the Go heap grew %d bytes for %d cached", grew, cached)
	case !StoreCachesInHeap && grew > cached/4:
		t.Errorf("StoreCachesInHeap is false but the Go heap grew %d bytes for %d cached", grew, cached)
	}
}
