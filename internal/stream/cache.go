package stream

import (
	"hash/maphash"
	"sync/atomic"
	"unsafe"

	"github.com/salesagg/salesagg/internal/sales"

	"github.com/salesagg/salesagg/internal/state"
)

// entryCache is a task's bounded, write-through cache of the entries its
// store holds (total and reflected input offsets), so that folding an event
// of a hot product reads no Pebble. It only ever holds what the store holds:
// entries are put after the store write that made them durable, never from
// a cycle that may still abort. It is used by the task goroutine only; its
// counters are read by the status (published once a cycle, see publish).
//
// It holds no pointers the collector has to follow: entries are fixed-size
// slots in chunks, product keys are bytes in chunks, and the index is an
// open-addressing table of slot numbers. Its size is the bytes of those
// chunks and of the index, which is the Go heap it takes; an entry with
// offsets of more than two input partitions is not cached (the store has
// it). When a new entry would pass the bound, an entry not read since the
// clock hand last passed it is evicted (CLOCK), and key chunks are compacted
// once half their bytes are of evicted keys.
type entryCache struct {
	max  int64
	size int64
	seed maphash.Seed
	// cacheChunk is the slots of a chunk, keyChunk the bytes of a key
	// chunk (the longest key cached).
	cacheChunk, keyChunk int

	slots [][]cacheSlot // chunks of cacheChunk slots
	used  int           // the slots below it hold the entries
	hand  int           // the clock hand, a slot number
	// idx maps hashes to slot numbers + 1 (0: empty), linear probing; its
	// length is a power of two, at least twice the slots.
	idx []uint32
	// keys are the products' bytes, in chunks of keyChunk bytes; garbage
	// counts the bytes of keys no slot refers to.
	keys    [][]byte
	garbage int

	hits, misses, evictions int64 // since the last publish
	stats                   cacheStats
}

// cacheStats are the cache's counters as the status reads them.
type cacheStats struct {
	hits, misses, evictions atomic.Int64
	bytes                   atomic.Int64
}

// cacheSlot is one cached entry; its key is keyLen bytes at keyOff of key
// chunk keyChunkN.
type cacheSlot struct {
	hash      uint64
	total     int64
	topic     [16]byte
	parts     [2]sales.PartitionOffset
	keyChunkN uint32
	keyOff    uint32
	keyLen    uint32
	nparts    uint8
	ref       bool
}

const slotBytes = int64(unsafe.Sizeof(cacheSlot{}))

// newEntryCache makes a cache of max bytes; its chunks are a sixteenth of
// that at most (4,096 slots, 256 KiB of keys), so that a small bound still
// holds entries.
func newEntryCache(bound int64) *entryCache {
	return &entryCache{
		max:        bound,
		seed:       maphash.MakeSeed(),
		cacheChunk: int(min(max(bound/16/slotBytes, 16), 4096)),
		keyChunk:   int(min(max(bound/16, 1024), 256<<10)),
	}
}

// len returns the number of cached entries.
func (c *entryCache) len() int { return c.used }

func (c *entryCache) slot(i int) *cacheSlot { return &c.slots[i/c.cacheChunk][i%c.cacheChunk] }

func (c *entryCache) key(s *cacheSlot) []byte {
	return c.keys[s.keyChunkN][s.keyOff : s.keyOff+s.keyLen]
}

// find returns the index position and slot number of key (slot -1: none;
// the position is then the empty one to insert at).
func (c *entryCache) find(h uint64, key string) (pos, slot int) {
	if len(c.idx) == 0 {
		return -1, -1
	}
	mask := len(c.idx) - 1
	for pos = int(h) & mask; ; pos = (pos + 1) & mask {
		v := c.idx[pos]
		if v == 0 {
			return pos, -1
		}
		if s := c.slot(int(v - 1)); s.hash == h && string(c.key(s)) == key {
			return pos, int(v - 1)
		}
	}
}

// get returns the cached entry of key; its offsets are the caller's.
func (c *entryCache) get(key string) (state.Entry, bool) {
	if c.max <= 0 {
		return state.Entry{}, false
	}
	_, i := c.find(maphash.String(c.seed, key), key)
	if i < 0 {
		c.misses++
		return state.Entry{}, false
	}
	c.hits++
	s := c.slot(i)
	s.ref = true
	e := state.Entry{Total: s.total, Offsets: sales.Offsets{TopicID: s.topic}}
	if s.nparts > 0 {
		e.Offsets.Parts = append([]sales.PartitionOffset(nil), s.parts[:s.nparts]...)
	}
	return e, true
}

// getInto is get into e, an arena entry: its offsets go to the parts e
// already holds (an arena entry's own, see entryArena), allocating nothing.
// e is left as it was when key is not cached.
func (c *entryCache) getInto(key string, e *state.Entry) bool {
	if c.max <= 0 {
		return false
	}
	_, i := c.find(maphash.String(c.seed, key), key)
	if i < 0 {
		c.misses++
		return false
	}
	c.hits++
	s := c.slot(i)
	s.ref = true
	e.Total = s.total
	e.Offsets.TopicID = s.topic
	e.Offsets.Parts = append(e.Offsets.Parts[:0], s.parts[:s.nparts]...)
	return true
}

// put records key's entry as the store now holds it.
func (c *entryCache) put(key string, e state.Entry) {
	if c.max <= 0 {
		return
	}
	h := maphash.String(c.seed, key)
	_, i := c.find(h, key)
	if len(e.Offsets.Parts) > len(cacheSlot{}.parts) || len(key) > c.keyChunk {
		if i >= 0 {
			c.remove(i)
		}
		return
	}
	if i < 0 {
		if i = c.newSlot(key); i < 0 {
			return
		}
		c.slot(i).hash = h
		pos, _ := c.find(h, key)
		c.idx[pos] = uint32(i + 1)
	}
	s := c.slot(i)
	s.total, s.topic, s.ref = e.Total, e.Offsets.TopicID, true
	s.nparts = uint8(copy(s.parts[:], e.Offsets.Parts))
}

// newSlot returns a new slot holding key (not indexed yet), evicting to
// stay within the bound; -1 when the bound cannot take it.
func (c *entryCache) newSlot(key string) int {
	if c.used == len(c.slots)*c.cacheChunk {
		if grow := c.growBytes(); c.size+grow <= c.max {
			c.slots = append(c.slots, make([]cacheSlot, c.cacheChunk))
			c.size += slotBytes * int64(c.cacheChunk)
			if len(c.idx) < 2*len(c.slots)*c.cacheChunk {
				c.rehash(2 * len(c.slots) * c.cacheChunk)
			}
		} else if c.used == 0 {
			return -1
		} else {
			c.evict()
		}
	}
	chunk, off, ok := c.storeKey(key)
	if !ok {
		return -1
	}
	i := c.used
	c.used++
	s := c.slot(i)
	s.keyChunkN, s.keyOff, s.keyLen = chunk, off, uint32(len(key))
	return i
}

// growBytes is what one more chunk of slots costs, with the index it needs.
func (c *entryCache) growBytes() int64 {
	grow := slotBytes * int64(c.cacheChunk)
	if need := 2 * (len(c.slots) + 1) * c.cacheChunk; len(c.idx) < need {
		grow += 4 * int64(nextPow2(need)-len(c.idx))
	}
	return grow
}

func nextPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// storeKey copies key into the key chunks, making room (evicting,
// compacting) within the bound, and returns where it is.
func (c *entryCache) storeKey(key string) (chunk, off uint32, ok bool) {
	for {
		if n := len(c.keys); n > 0 && len(c.keys[n-1])+len(key) <= c.keyChunk {
			last := c.keys[n-1]
			c.keys[n-1] = append(last, key...)
			return uint32(n - 1), uint32(len(last)), true
		}
		switch {
		case c.size+int64(c.keyChunk) <= c.max:
			c.keys = append(c.keys, make([]byte, 0, c.keyChunk))
			c.size += int64(c.keyChunk)
		case c.garbage > 0 && c.garbage >= len(c.keys)*c.keyChunk/2:
			c.compactKeys()
		case c.used == 0:
			return 0, 0, false
		default:
			c.evict()
		}
	}
}

// evict drops the first entry the clock hand finds not read since it last
// passed.
func (c *entryCache) evict() {
	for {
		c.hand++
		if c.hand >= c.used {
			c.hand = 0
		}
		if s := c.slot(c.hand); s.ref {
			s.ref = false
			continue
		}
		c.remove(c.hand)
		c.evictions++
		return
	}
}

// indexOf returns the index position of slot i.
func (c *entryCache) indexOf(i int) int {
	mask := len(c.idx) - 1
	pos := int(c.slot(i).hash) & mask
	for c.idx[pos] != uint32(i+1) {
		pos = (pos + 1) & mask
	}
	return pos
}

// remove drops the entry of slot i; the last slot moves into it, so that
// the slots below used are the entries.
func (c *entryCache) remove(i int) {
	mask := len(c.idx) - 1
	pos := c.indexOf(i)
	// Backward-shift deletion: no tombstones, probes stay short.
	for next := (pos + 1) & mask; c.idx[next] != 0; next = (next + 1) & mask {
		home := int(c.slot(int(c.idx[next]-1)).hash) & mask
		if (next-home)&mask >= (next-pos)&mask {
			c.idx[pos] = c.idx[next]
			pos = next
		}
	}
	c.idx[pos] = 0
	c.garbage += int(c.slot(i).keyLen)
	last := c.used - 1
	if i != last {
		c.idx[c.indexOf(last)] = uint32(i + 1)
		*c.slot(i) = *c.slot(last)
	}
	*c.slot(last) = cacheSlot{}
	c.used--
}

// rehash rebuilds the index with n positions (a power of two).
func (c *entryCache) rehash(n int) {
	old := len(c.idx)
	c.idx = make([]uint32, nextPow2(n))
	c.size += 4 * int64(len(c.idx)-old)
	mask := len(c.idx) - 1
	for i := range c.used {
		s := c.slot(i)
		pos := int(s.hash) & mask
		for c.idx[pos] != 0 {
			pos = (pos + 1) & mask
		}
		c.idx[pos] = uint32(i + 1)
	}
}

// compactKeys copies the live keys into fresh chunks.
func (c *entryCache) compactKeys() {
	old := c.keys
	c.keys = nil
	c.size -= int64(len(old)) * int64(c.keyChunk)
	c.garbage = 0
	for i := range c.used {
		s := c.slot(i)
		k := old[s.keyChunkN][s.keyOff : s.keyOff+s.keyLen]
		if n := len(c.keys); n == 0 || len(c.keys[n-1])+len(k) > c.keyChunk {
			c.keys = append(c.keys, make([]byte, 0, c.keyChunk))
			c.size += int64(c.keyChunk)
		}
		n := len(c.keys) - 1
		s.keyChunkN, s.keyOff = uint32(n), uint32(len(c.keys[n]))
		c.keys[n] = append(c.keys[n], k...)
	}
}

// publish makes the counters since the last publish visible to the status.
func (c *entryCache) publish() {
	c.stats.hits.Add(c.hits)
	c.stats.misses.Add(c.misses)
	c.stats.evictions.Add(c.evictions)
	c.stats.bytes.Store(c.size)
	c.hits, c.misses, c.evictions = 0, 0, 0
}

// forget empties the cache (the store was wiped or replaced).
func (c *entryCache) forget() {
	c.slots, c.idx, c.keys = nil, nil, nil
	c.used, c.hand, c.garbage, c.size = 0, 0, 0, 0
	c.publish()
}

// entryArena hands out the entries of a task's dirty map from chunks that
// are reused once the map is emptied, so that a cycle allocates no entry per
// product, nor its offsets: each entry comes with room for the offsets of
// two input partitions (more grow a slice of its own). Only the map points
// into it; produced updates hold copies of the entries and their offsets
// (aggregation.records).
type entryArena struct {
	chunks [][]arenaEntry
	chunk  int // index of the chunk being filled
	used   int // entries used of it
}

// arenaEntry is an entry and the room for its offsets.
type arenaEntry struct {
	e     state.Entry
	parts [2]sales.PartitionOffset
}

const arenaChunk = 1024

// alloc returns an empty entry whose offsets have the arena's room.
func (a *entryArena) alloc() *state.Entry {
	if a.chunk == len(a.chunks) {
		a.chunks = append(a.chunks, make([]arenaEntry, arenaChunk))
	}
	s := &a.chunks[a.chunk][a.used]
	if a.used++; a.used == arenaChunk {
		a.chunk, a.used = a.chunk+1, 0
	}
	s.e = state.Entry{Offsets: sales.Offsets{Parts: s.parts[:0]}}
	return &s.e
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
