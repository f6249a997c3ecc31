package stream

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// aggregation is one of a task's aggregations: its store, the entries
// changed since the last cycle and the caches in front of the store, and
// the folding of events into entries. The task goroutine owns it; store is
// also read by queries while the task runs.
type aggregation struct {
	// changelog is the aggregation's changelog topic; the task's partition
	// of it is the store's.
	changelog string
	// store is set once opened; it is read by queries while running.
	store atomic.Pointer[state.Store]
	// dirty are the entries changed in the current cycle, not yet
	// produced; they are the aggregation's own (see fold) and come from
	// arena.
	dirty map[string]*state.Entry
	arena entryArena
	// cache holds entries the store holds, in front of it.
	cache *entryCache
	// filter knows the products the store cannot hold (see storeFilter);
	// building is the listing of the store's products it adopts when the
	// store started with data (nil: none under way).
	filter   storeFilter
	building *filterBuild
	// cp is the checkpoint the store holds.
	cp state.Checkpoint
}

// newAggregation returns an aggregation whose changelog is the topic
// changelog, with an entry cache of cacheBytes.
func newAggregation(changelog string, cacheBytes int64) aggregation {
	return aggregation{changelog: changelog, dirty: make(map[string]*state.Entry), cache: newEntryCache(cacheBytes)}
}

// source is where an event was read: its input topic's id, partition and
// offset. record says whether the entry records it (see task.process).
type source struct {
	topic     [16]byte
	partition int32
	offset    int64
	record    bool
}

// fold adds value to the entry of the product key, unless the entry
// reflects src already (a redelivery: dup). An entry in the dirty map is the
// aggregation's own, changed in place; the first event of a product in a
// cycle copies the committed entry (from the cache, else the store, unless
// the filter knows the store cannot hold it) into one. bad is the event's
// own error (a total out of range), err the store's.
func (a *aggregation) fold(key []byte, value int64, src source) (dup bool, bad, err error) {
	e, owned := a.dirty[string(key)]
	if !owned {
		// The cache copies the committed entry into the arena's; the
		// store hands out offsets of its own. An entry taken for a
		// duplicate stays unused until the cycle ends.
		e = a.arena.alloc()
		if !a.cache.getInto(string(key), e) && a.filter.mayHold(key) {
			if *e, _, err = a.store.Load().Lookup(key); err != nil {
				return false, nil, err
			}
		}
		if e.Offsets.Reflects(src.topic, src.partition, src.offset) {
			return true, nil, nil
		}
	} else if e.Offsets.Reflects(src.topic, src.partition, src.offset) {
		return true, nil, nil
	}
	total, bad := sales.Add(e.Total, value)
	if bad != nil {
		return false, bad, nil
	}
	e.Total = total
	if src.record {
		e.Offsets.Set(src.topic, src.partition, src.offset)
	}
	if !owned {
		a.dirty[string(key)] = e
	}
	return false, nil, nil
}

// recordSpec is where an aggregation's records go besides its changelog:
// the task's partition of it, and the notification topic with its
// partitions and threshold.
type recordSpec struct {
	partition              int32
	threshold              int64
	notifications          string
	notificationPartitions int32
}

// records builds the cycle's records of the dirty entries and hands each
// to emit (changelog true for a changelog record): per entry its changelog
// record (the total, with the input offsets it reflects as a header) and,
// at or above the threshold, a notification. It returns the store updates
// and how many records it built.
//
// The records, headers and bytes come from three allocations, not six per
// product: they live until the last record's callback. The updates keep the
// product strings (the map's keys) and their offsets in one allocation of
// their own: the arena's are reused by the next cycle's folds, while the
// updates wait for the changelog's acknowledgements (and, on a store that
// cannot be written, for longer).
func (a *aggregation) records(spec recordSpec, emit func(rec *kgo.Record, changelog bool)) ([]state.Update, int) {
	n, notes, size, nparts := len(a.dirty), 0, 0, 0
	for key, e := range a.dirty {
		nparts += len(e.Offsets.Parts)
		size += len(key) + 8 + e.Offsets.EncodedLen()
		if sales.Notify(e.Total, spec.threshold) {
			notes++
			size += len(key) + 40 // {"sku":key,"value":total}
		}
	}
	recs := make([]kgo.Record, n+notes)
	headers := make([]kgo.RecordHeader, n)
	buf := make([]byte, 0, size)
	updates := make([]state.Update, 0, n)
	parts := make([]sales.PartitionOffset, 0, nparts)
	i, j := 0, 0
	for key, e := range a.dirty {
		// Each field is appended to buf and taken capacity-limited, so
		// nothing appended later can reach it.
		at := len(buf)
		buf = append(buf, key...)
		k := buf[at:len(buf):len(buf)]
		at = len(buf)
		buf = sales.AppendTotal(buf, e.Total)
		total := buf[at:len(buf):len(buf)]
		at = len(buf)
		buf = e.Offsets.AppendEncode(buf)
		headers[i] = kgo.RecordHeader{Key: sales.OffsetsHeader, Value: buf[at:len(buf):len(buf)]}
		rec := &recs[i]
		*rec = kgo.Record{Topic: a.changelog, Partition: spec.partition, Key: k, Value: total, Headers: headers[i : i+1 : i+1]}
		emit(rec, true)
		if sales.Notify(e.Total, spec.threshold) {
			at = len(buf)
			buf = sales.AppendNotification(buf, key, e.Total)
			note := &recs[n+j]
			j++
			*note = kgo.Record{
				Topic:     spec.notifications,
				Partition: sales.Partition(k, spec.notificationPartitions),
				Key:       k,
				Value:     buf[at:len(buf):len(buf)],
			}
			emit(note, false)
		}
		u := state.Update{Product: key, Entry: *e}
		at = len(parts)
		parts = append(parts, e.Offsets.Parts...)
		u.Entry.Offsets.Parts = parts[at:len(parts):len(parts)]
		updates = append(updates, u)
		i++
	}
	return updates, len(recs)
}

// reset empties the dirty map, reusing its entries' memory.
func (a *aggregation) reset() {
	clear(a.dirty)
	a.arena.reset()
}

// write writes updates to the store with the checkpoint cp (and the
// windows' writes ws in the same batch), and then to
// the cache. The filter learns the products before the write: it may know
// more than the store holds (a failed write), never less.
func (a *aggregation) write(updates []state.Update, cp state.Checkpoint, ws []state.WindowWrite) error {
	for _, u := range updates {
		a.filter.add(u.Product)
	}
	if err := a.store.Load().ApplyWith(updates, cp, ws); err != nil {
		return err
	}
	for _, u := range updates {
		a.cache.put(u.Product, u.Entry)
	}
	a.cp = cp
	return nil
}
