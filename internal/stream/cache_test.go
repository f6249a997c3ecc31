package stream

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

func TestEntryCacheStaysWithinItsBound(t *testing.T) {
	// Scenario: a cache of 64 KiB takes 20,000 products with random offsets (some of
	// several partitions) over and over: its size never passes the bound, a put entry is
	// read back with its offsets until it is evicted, entries of more than two partitions
	// are not kept, the counters add up, and a cache of 0 bytes keeps nothing.
	entry := func(i int) state.Entry {
		offs := sales.Offsets{}.With([16]byte{1}, int32(i%3), int64(i))
		if i%7 == 0 {
			offs = offs.With([16]byte{1}, int32(i%3+1), int64(i+1))
		}
		if i%11 == 0 {
			offs = offs.With([16]byte{1}, 5, 1).With([16]byte{1}, 6, 2)
		}
		return state.Entry{Total: int64(i), Offsets: offs}
	}
	const max = 64 << 10
	c := newEntryCache(max)
	r := rand.New(rand.NewPCG(1, 2))
	want := map[string]state.Entry{}
	for i := range 100_000 {
		k := fmt.Sprintf("product-%0*d", 1+r.IntN(12), r.IntN(20_000))
		e := entry(i)
		c.put(k, e)
		want[k] = e
		if c.size > max {
			t.Fatalf("after %d puts: size %d, bound %d", i+1, c.size, max)
		}
		got, ok := c.get(k)
		if len(e.Offsets.Parts) > 2 {
			if ok {
				t.Fatalf("entry of %d partitions kept", len(e.Offsets.Parts))
			}
			delete(want, k)
			continue
		}
		if !ok || got.Total != e.Total || !slices.Equal(got.Offsets.Parts, e.Offsets.Parts) || got.Offsets.TopicID != e.Offsets.TopicID {
			t.Fatalf("entry just put: %+v %v, want %+v", got, ok, e)
		}
		if i%1000 == 0 {
			// Every cached entry is the latest put of its product.
			for j := range c.used {
				s := c.slot(j)
				k := string(c.key(s))
				if w, ok := want[k]; !ok || w.Total != s.total {
					t.Fatalf("cached %q total %d, latest put %+v (%v)", k, s.total, w, ok)
				}
				if _, at := c.find(s.hash, k); at != j {
					t.Fatalf("slot %d (%q) found at %d", j, k, at)
				}
			}
		}
	}
	if c.len() < 100 {
		t.Fatalf("%d entries in %d bytes", c.len(), c.size)
	}
	c.publish()
	if c.stats.hits.Load() < 90_000 || c.stats.evictions.Load() == 0 || c.stats.bytes.Load() != c.size {
		t.Fatalf("hits %d, evictions %d, bytes %d (size %d)", c.stats.hits.Load(), c.stats.evictions.Load(), c.stats.bytes.Load(), c.size)
	}
	if _, ok := c.get("never-put"); ok {
		t.Fatal("a product never put was found")
	}
	c.forget()
	if c.len() != 0 || c.size != 0 {
		t.Fatalf("after forget: %d entries, size %d", c.len(), c.size)
	}
	if _, ok := c.get("product-1"); ok {
		t.Fatal("found after forget")
	}
	off := newEntryCache(0)
	off.put("p", entry(1))
	if _, ok := off.get("p"); ok || off.len() != 0 {
		t.Fatal("a cache of 0 bytes kept an entry")
	}
}

func TestEntryCacheEstimateMatchesItsHeap(t *testing.T) {
	// Scenario: a cache of a task's default share (64 MiB over 3 tasks) filled with products
	// as a growing state fills it (short keys, offsets of one partition, many evictions): its
	// estimated size is within 10 % of the Go heap it takes (runtime.MemStats, after a
	// collection).
	heap := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	for _, keyLen := range []int{8, 24} {
		before := heap()
		c := newEntryCache(64 << 20 / 3)
		pad := strings.Repeat("x", keyLen-7)
		for i := range 600_000 {
			offs := sales.Offsets{TopicID: [16]byte{1}, Parts: []sales.PartitionOffset{{Partition: int32(i % 3), Offset: int64(i)}}}
			c.put(fmt.Sprintf("p%06d%s", i, pad)[:keyLen], state.Entry{Total: int64(i), Offsets: offs.Clone()})
		}
		real := heap() - before
		ratio := float64(c.size) / float64(real)
		t.Logf("keys of %d bytes: %d entries, estimate %d bytes, heap %d bytes (%.2f)", keyLen, c.len(), c.size, real, ratio)
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("keys of %d bytes: estimate %d bytes, heap %d bytes: not within 10 %%", keyLen, c.size, real)
		}
		runtime.KeepAlive(c)
	}
}
