package stream

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

func TestEntryCacheStaysWithinItsBound(t *testing.T) {
	// Scenario: a cache of 20 entries' worth of bytes takes 1,000 products with random
	// offsets: its estimated size never passes the bound, a put entry is read back until it
	// is evicted, the counters add up, and a cache of 0 bytes keeps nothing.
	entry := func(i int) state.Entry {
		return state.Entry{Total: int64(i), Offsets: sales.Offsets{}.With([16]byte{1}, int32(i%3), int64(i))}
	}
	max := 20 * entrySize("product-0000", entry(0))
	c := newEntryCache(max)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 1000 {
		k := fmt.Sprintf("product-%04d", r.IntN(200))
		c.put(k, entry(i))
		if c.size > max || c.bytes.Load() != c.size {
			t.Fatalf("after %d puts: size %d (reported %d), bound %d", i+1, c.size, c.bytes.Load(), max)
		}
		if e, ok := c.get(k); !ok || e.Total != int64(i) {
			t.Fatalf("entry just put: %+v %v, want total %d", e, ok, i)
		}
	}
	var sum int64
	for k, e := range c.m {
		sum += entrySize(k, e)
	}
	if sum != c.size || len(c.m) > 20 || len(c.m) < 15 {
		t.Fatalf("%d entries summing %d bytes, size %d, bound %d", len(c.m), sum, c.size, max)
	}
	if c.hits.Load() != 1000 || c.evictions.Load() == 0 {
		t.Fatalf("hits %d, evictions %d", c.hits.Load(), c.evictions.Load())
	}
	if _, ok := c.get("never-put"); ok || c.misses.Load() != 1 {
		t.Fatalf("a product never put was found, or misses = %d", c.misses.Load())
	}
	c.forget()
	if len(c.m) != 0 || c.size != 0 {
		t.Fatalf("after forget: %d entries, size %d", len(c.m), c.size)
	}
	off := newEntryCache(0)
	off.put("p", entry(1))
	if _, ok := off.get("p"); ok || len(off.m) != 0 {
		t.Fatal("a cache of 0 bytes kept an entry")
	}
}
