package stream

import (
	"sync/atomic"

	"github.com/salesagg/salesagg/internal/state"
)

// entryCache is a task's bounded, write-through cache of the entries its
// store holds (total and reflected input offsets), so that folding an event
// of a hot product reads no Pebble. It only ever holds what the store holds:
// entries are put after the store write that made them durable, never from
// a cycle that may still abort. It is used by the task goroutine only; its
// counters are read by the status.
//
// The bound is in bytes, estimated per entry; when an entry would pass it,
// entries are evicted in map order (random), which keeps the cost of an
// eviction constant and the hot entries likely to stay.
type entryCache struct {
	max  int64
	size int64
	m    map[string]state.Entry

	hits, misses, evictions atomic.Int64
	bytes                   atomic.Int64
}

// entryOverhead estimates the bytes an entry takes besides its key and
// offsets: the map slot, the string and slice headers, the total.
const entryOverhead = 96

func newEntryCache(max int64) *entryCache {
	return &entryCache{max: max, m: make(map[string]state.Entry)}
}

func entrySize(key string, e state.Entry) int64 {
	return entryOverhead + int64(len(key)) + int64(len(e.Offsets.Parts))*12
}

// get returns the cached entry of key.
func (c *entryCache) get(key string) (state.Entry, bool) {
	if c.max <= 0 {
		return state.Entry{}, false
	}
	e, ok := c.m[key]
	if ok {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
	return e, ok
}

// put records key's entry as the store now holds it.
func (c *entryCache) put(key string, e state.Entry) {
	if c.max <= 0 {
		return
	}
	n := entrySize(key, e)
	if old, ok := c.m[key]; ok {
		c.size -= entrySize(key, old)
	} else if n > c.max {
		return
	}
	if c.size+n > c.max {
		// Evict down to 15/16 of the bound in one pass: a map range costs
		// more to start than to step, and a cache at its bound would
		// otherwise start one for every put.
		low := c.max - c.max/16
		var evicted int64
		for k, old := range c.m {
			if c.size+n <= low {
				break
			}
			if k == key {
				continue
			}
			c.size -= entrySize(k, old)
			delete(c.m, k)
			evicted++
		}
		c.evictions.Add(evicted)
	}
	c.m[key] = e
	c.size += n
	c.bytes.Store(c.size)
}

// forget empties the cache (the store was wiped or replaced).
func (c *entryCache) forget() {
	clear(c.m)
	c.size = 0
	c.bytes.Store(0)
}

// entryArena hands out the entries of a task's dirty map from chunks that
// are reused once the map is emptied, so that a cycle allocates no entry per
// product. Only the map points into it; produced updates hold copies.
type entryArena struct {
	chunks [][]state.Entry
	chunk  int // index of the chunk being filled
	used   int // entries used of it
}

const arenaChunk = 1024

func (a *entryArena) alloc() *state.Entry {
	if a.chunk == len(a.chunks) {
		a.chunks = append(a.chunks, make([]state.Entry, arenaChunk))
	}
	e := &a.chunks[a.chunk][a.used]
	if a.used++; a.used == arenaChunk {
		a.chunk, a.used = a.chunk+1, 0
	}
	return e
}

// reset makes every entry free again; the caller holds no pointer into it.
// Chunks beyond what the last cycles needed are let go, so that one large
// cycle does not pin its memory.
func (a *entryArena) reset() {
	needed := a.chunk + 1
	for i := range a.chunks[:min(needed, len(a.chunks))] {
		clear(a.chunks[i]) // drop the offsets they point to
	}
	if len(a.chunks) > 2*needed {
		clear(a.chunks[needed:])
		a.chunks = a.chunks[:needed]
	}
	a.chunk, a.used = 0, 0
}
