package stream

import (
	"context"
	"fmt"
	"hash/maphash"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
)

// storeFilter tells the products a task's store cannot hold: a blocked
// Bloom filter of every product the store held when the task started and
// of every product written since,
// so that the first event of a new product (every event, while the state
// grows) skips the store lookup, which reads the filter, index and data
// blocks of every level. It never says no for a product the store holds
// (no false negatives); a yes may be wrong (about 1 %), and costs the lookup
// it would have cost anyway.
//
// A task whose store started empty knows every product from the start
// (filterKnown). One whose store started with data learns the products it
// writes (filterLearning) while a goroutine of its own lists the store's
// products as they were at the start (buildFilter); until the task adopts
// that list the filter is not used, and every lookup goes to the store.
// A listing that fails leaves the filter off for the rest of the task's run
// (filterOff: not used, records nothing).
//
// The filter grows in levels, each four times the capacity of the one
// before, so that neither its size nor the number of levels a query reads
// (a cache line each) depends on a guess of the state's size. Its words hold
// no pointers: the collector does not scan them. Used by the task goroutine
// only.
type storeFilter struct {
	mode   filterMode
	seed   maphash.Seed
	levels []filterLevel
	bytes  int64
}

// filterMode is a storeFilter's state. Its moves: reset to filterKnown (an
// empty store) or filterOff from any state; filterOff → filterLearning
// (learn); filterLearning → filterKnown (adopt) or filterOff (abandon).
type filterMode uint8

const (
	filterOff      filterMode = iota // not used, records nothing
	filterLearning                   // not used, records what is written
	filterKnown                      // used: holds every product of the store
)

func (m filterMode) String() string {
	switch m {
	case filterOff:
		return "off"
	case filterLearning:
		return "learning"
	case filterKnown:
		return "known"
	}
	return fmt.Sprintf("filterMode(%d)", uint8(m))
}

type filterLevel struct {
	blocks []filterBlock
	cap, n int
}

// filterBlock is one cache line: the bits of the keys that hash to it.
type filterBlock [8]uint64

// Filter geometry: 20 bits per product, 7 bits set per product within one
// 512-bit block; the first level holds 65,536 products (160 KiB). A false
// positive costs a store lookup, tens of microseconds once the store is
// larger than the block cache: at 12 bits a task of 3.3M products (10M over
// three tasks) answered 1.2 % of new products "maybe", at 20 bits 0.1 %
// (TestFilterFalsePositives).
const (
	filterBitsPerKey = 20
	filterFirstCap   = 1 << 16
	filterGrowth     = 4
)

// reset starts the filter over, under a new seed: known when the store is
// empty, else off.
func (f *storeFilter) reset(empty bool) {
	f.mode, f.levels, f.bytes = filterOff, nil, 0
	if empty {
		f.mode = filterKnown
	}
	f.seed = maphash.MakeSeed()
}

// learn makes a filter that is off record the products written from now
// on, for adopt.
func (f *storeFilter) learn() {
	if f.mode == filterOff {
		f.mode = filterLearning
	}
}

// adopt makes a learning filter known: base holds, under the same seed,
// every product the store held when the filter began to learn, and the
// filter every product written since.
func (f *storeFilter) adopt(base storeFilter) {
	if f.mode != filterLearning || base.seed != f.seed {
		return
	}
	f.levels = append(base.levels, f.levels...)
	f.bytes += base.bytes
	f.mode = filterKnown
}

// abandon turns a learning filter off (its listing failed) and lets go of
// what it learned.
func (f *storeFilter) abandon() {
	if f.mode == filterLearning {
		f.mode, f.levels, f.bytes = filterOff, nil, 0
	}
}

// buildFilter returns a known filter of seed that holds every product it
// lists: the base a learning filter adopts. A store lists each product
// once, so nothing is asked before it is added (the check is a cache miss
// per level, half the listing's cost at 10M products).
func buildFilter(ctx context.Context, it *state.ProductIter, seed maphash.Seed) (storeFilter, int, error) {
	f := storeFilter{mode: filterKnown, seed: seed}
	n := 0
	err := it.Each(ctx, func(product []byte) {
		f.addNew(maphash.Bytes(seed, product))
		n++
	})
	return f, n, err
}

// mayHold reports whether the store may hold product key: false only when
// it surely does not.
func (f *storeFilter) mayHold(key []byte) bool {
	if f.mode != filterKnown {
		return true
	}
	return f.has(maphash.Bytes(f.seed, key))
}

func (f *storeFilter) has(h uint64) bool {
	for i := range f.levels {
		if f.levels[i].has(h) {
			return true
		}
	}
	return false
}

// add records that the store holds product key.
func (f *storeFilter) add(key string) {
	if f.mode != filterOff {
		f.addHash(maphash.String(f.seed, key))
	}
}

// addHash adds hash h unless the filter may hold it already.
func (f *storeFilter) addHash(h uint64) {
	if !f.has(h) {
		f.addNew(h)
	}
}

// addNew adds hash h, which the filter does not hold yet: asked or known.
func (f *storeFilter) addNew(h uint64) {
	if len(f.levels) == 0 || f.levels[len(f.levels)-1].n >= f.levels[len(f.levels)-1].cap {
		c := filterFirstCap
		if len(f.levels) > 0 {
			c = f.levels[len(f.levels)-1].cap * filterGrowth
		}
		nb := c * filterBitsPerKey / 512
		f.levels = append(f.levels, filterLevel{blocks: make([]filterBlock, nb), cap: c})
		f.bytes += int64(nb) * 64
	}
	l := &f.levels[len(f.levels)-1]
	l.set(h)
	l.n++
}

// block is the block of hash h; bits are the 7 bit positions in it, 9 bits
// each from a second mix of h.
func (l *filterLevel) block(h uint64) *filterBlock {
	return &l.blocks[(h>>32)*uint64(len(l.blocks))>>32]
}

func (l *filterLevel) has(h uint64) bool {
	b := l.block(h)
	g := h * 0x9e3779b97f4a7c15
	for range 7 {
		if b[(g>>6)&7]&(1<<(g&63)) == 0 {
			return false
		}
		g >>= 9
	}
	return true
}

func (l *filterLevel) set(h uint64) {
	b := l.block(h)
	g := h * 0x9e3779b97f4a7c15
	for range 7 {
		b[(g>>6)&7] |= 1 << (g & 63)
		g >>= 9
	}
}

// filterBuild is a goroutine listing a task's store into the base of the
// task's learning filter. Its fields are written by the goroutine before it
// closes done, and read by the task goroutine after.
type filterBuild struct {
	cancel context.CancelFunc
	done   chan struct{}
	base   storeFilter
	n      int
	took   time.Duration
	err    error
}

// doneC is closed when the listing ended; nil (never ready) when none is
// under way.
func (b *filterBuild) doneC() <-chan struct{} {
	if b == nil {
		return nil
	}
	return b.done
}

// stop cancels the listing under way and waits for it to let go of the
// store.
func (b *filterBuild) stop() {
	if b == nil {
		return
	}
	b.cancel()
	<-b.done
}

// startFilter sets the task's filter up as it starts running on its
// restored store: known when the store is empty; otherwise learning, with
// the store's products listed by a goroutine of its own from a view of the
// store taken now, before the task writes anything.
func (t *task) startFilter(ctx context.Context) {
	t.totals.building.stop()
	t.totals.building = nil
	t.totals.filter.reset(t.storeEmpty())
	st := t.totals.store.Load()
	if t.totals.filter.mode == filterKnown || st == nil {
		return
	}
	it, err := st.Products()
	if err != nil {
		t.log.Debug(fmt.Sprintf("task [%s] Not listing the store's products; every new product is looked up in the store", t.name), zap.Error(err))
		return
	}
	t.totals.filter.learn()
	bctx, cancel := context.WithCancel(ctx)
	b := &filterBuild{cancel: cancel, done: make(chan struct{})}
	t.totals.building = b
	seed := t.totals.filter.seed
	go func() {
		defer close(b.done)
		if hold := t.deps.env.knobs.BeforeProductListing; hold != nil {
			hold(bctx, t.partition)
		}
		began := time.Now()
		b.base, b.n, b.err = buildFilter(bctx, it, seed)
		b.took = time.Since(began)
		if err := it.Close(); err != nil && b.err == nil {
			b.err = err
		}
	}()
}

// adoptFilter makes the learning filter known once the listing ended well.
func (t *task) adoptFilter() {
	b := t.totals.building
	t.totals.building = nil
	if b.err != nil {
		t.totals.filter.abandon()
		t.log.Info(fmt.Sprintf("task [%s] Listing the store's products failed; every new product is looked up in the store", t.name), zap.Error(b.err))
		return
	}
	t.totals.filter.adopt(b.base)
	t.log.Info(fmt.Sprintf("task [%s] The store's products are in the filter of new products", t.name),
		zap.Int("products", b.n), zap.Int64("filter_bytes", t.totals.filter.bytes), zap.Duration("took", b.took.Round(time.Millisecond)))
}
