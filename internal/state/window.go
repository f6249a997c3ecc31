package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Window key space of a task's store, one per window size, beside the
// totals (see the key space at the top of store.go):
//
//	'w' + size (8 bytes, ms) + start (8 bytes, ms) + product
//	    -> the window's Entry, encoded as a total's
//	'm' + "checkpoint/w" + size (8 bytes, ms)
//	    -> the Checkpoint of the size's changelog
//	'm' + "streamtime/w" + size (8 bytes, ms)
//	    -> the stream time (8 bytes, ms): the latest event time folded,
//	       which windows close and expire by
//
// All integers are big-endian. Keys sort by window start before product:
// the products of one window are one range (a window's listing), the
// windows past retention are one range below a start (one range deletion),
// and a product's windows from one time to another are a point read per
// start (windows of one size start on multiples of it).
const (
	windowPrefix = 'w'
	// windowKeyLen is the length of a window key before its product.
	windowKeyLen = 1 + 8 + 8
)

var (
	windowCheckpointPrefix = []byte("mcheckpoint/w")
	streamTimePrefix       = []byte("mstreamtime/w")
)

// MaxWindowReads bounds the windows one Fetch reads: (to-from)/size+1.
const MaxWindowReads = 10_000

// ErrTooManyWindows is returned by Fetch for a time range that spans more
// than MaxWindowReads windows of the size.
var ErrTooManyWindows = errors.New("state: the range spans too many windows")

// Windows is the key space of one window size in a store. It is a view:
// the store owns the data and its lock, and Windows is as safe for
// concurrent use as the store.
type Windows struct {
	s      *Store
	sizeMS int64
	// prefix is 'w' + size, the start of every key of the size.
	prefix [1 + 8]byte
}

// WindowUpdate is one window's new entry, or its deletion.
type WindowUpdate struct {
	Product string
	// Start is the window's start, in ms since the epoch (non-negative, a
	// multiple of the size).
	Start  int64
	Entry  Entry
	Delete bool
}

// WindowTotal is one window's total, as listed by Fetch and Scan.
type WindowTotal struct {
	Product string `json:"product"`
	Start   int64  `json:"start"`
	Total   int64  `json:"total"`
}

// Windows returns the key space of windows of size (at least 1 ms).
func (s *Store) Windows(size time.Duration) *Windows {
	w := &Windows{s: s, sizeMS: size.Milliseconds()}
	w.prefix[0] = windowPrefix
	binary.BigEndian.PutUint64(w.prefix[1:], uint64(w.sizeMS))
	return w
}

// Size returns the window size.
func (w *Windows) Size() time.Duration { return time.Duration(w.sizeMS) * time.Millisecond }

// startKey returns the first key of the window starting at start.
func (w *Windows) startKey(start int64) []byte {
	k := make([]byte, 0, windowKeyLen+16)
	k = append(k, w.prefix[:]...)
	return binary.BigEndian.AppendUint64(k, uint64(start))
}

func (w *Windows) key(product string, start int64) []byte {
	return append(w.startKey(start), product...)
}

// end returns the key just past the size's key space.
func (w *Windows) end() []byte {
	k := append([]byte(nil), w.prefix[:]...)
	binary.BigEndian.PutUint64(k[1:], uint64(w.sizeMS)+1)
	return k
}

func (w *Windows) checkpointKey() []byte {
	return binary.BigEndian.AppendUint64(append([]byte(nil), windowCheckpointPrefix...), uint64(w.sizeMS))
}

func (w *Windows) streamTimeKey() []byte {
	return binary.BigEndian.AppendUint64(append([]byte(nil), streamTimePrefix...), uint64(w.sizeMS))
}

// StreamTime returns the stored stream time of the size, and false when
// there is none.
func (w *Windows) StreamTime() (int64, bool, error) {
	s := w.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return 0, false, s.closedErr("reading the stream time of")
	}
	v, closer, err := s.mu.db.Get(w.streamTimeKey())
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading the %d ms stream time of %s: %w", w.sizeMS, s.path, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, false, fmt.Errorf("reading the %d ms stream time of %s: %d bytes, want 8", w.sizeMS, s.path, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), true, nil
}

// checkStart refuses a start that is negative or not on the size's grid.
func (w *Windows) checkStart(start int64) error {
	if start < 0 || w.sizeMS <= 0 || start%w.sizeMS != 0 {
		return fmt.Errorf("state: window start %d is not a non-negative multiple of the window size %d ms", start, w.sizeMS)
	}
	return nil
}

// Get returns the entry of product's window starting at start, and false
// when the store has none.
func (w *Windows) Get(product string, start int64) (Entry, bool, error) {
	w.s.mu.RLock()
	defer w.s.mu.RUnlock()
	return w.get(product, start)
}

// get is Get under the store's read lock.
func (w *Windows) get(product string, start int64) (Entry, bool, error) {
	s := w.s
	if s.mu.db == nil {
		return Entry{}, false, fmt.Errorf("reading window %d of %q from %s: %w", start, product, s.path, ErrClosed)
	}
	v, closer, err := s.mu.db.Get(w.key(product, start))
	if errors.Is(err, pebble.ErrNotFound) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("reading window %d of %q from %s: %w", start, product, s.path, err)
	}
	defer closer.Close()
	e, err := decodeEntry(v)
	if err != nil {
		return Entry{}, false, fmt.Errorf("reading window %d of %q from %s: %w", start, product, s.path, err)
	}
	return e, true, nil
}

// Fetch returns product's windows that start from from to to (both
// included, in ms), in start order: Kafka Streams' WindowStore.fetch(key,
// from, to). A range of more than MaxWindowReads windows fails with
// ErrTooManyWindows.
func (w *Windows) Fetch(product string, from, to int64) ([]WindowTotal, error) {
	if w.sizeMS <= 0 {
		return nil, fmt.Errorf("state: window size %d ms", w.sizeMS)
	}
	first := max(from, 0)
	if r := first % w.sizeMS; r != 0 {
		first += w.sizeMS - r
	}
	if to < first {
		return nil, nil
	}
	if n := (to-first)/w.sizeMS + 1; n > MaxWindowReads {
		return nil, fmt.Errorf("%w: %d windows of %d ms from %d to %d, at most %d", ErrTooManyWindows, n, w.sizeMS, from, to, MaxWindowReads)
	}
	w.s.mu.RLock()
	defer w.s.mu.RUnlock()
	var out []WindowTotal
	for i := range (to-first)/w.sizeMS + 1 {
		start := first + i*w.sizeMS
		e, ok, err := w.get(product, start)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, WindowTotal{Product: product, Start: start, Total: e.Total})
		}
	}
	return out, nil
}

// Scan returns up to limit products of the window starting at start,
// sorted by name, starting after the product after ("" starts at the
// first).
func (w *Windows) Scan(start int64, after string, limit int) ([]WindowTotal, error) {
	s := w.s
	lower := w.key(after, start)
	if after != "" {
		lower = append(lower, 0)
	}
	upper := w.startKey(start + 1)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return nil, s.closedErr("scanning windows of")
	}
	it, err := s.mu.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("scanning windows of %s: %w", s.path, err)
	}
	var out []WindowTotal
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("scanning windows of %s: %w", s.path, err)
		}
		e, err := decodeEntry(v)
		if err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("scanning windows of %s: %w", s.path, err)
		}
		out = append(out, WindowTotal{Product: string(it.Key()[windowKeyLen:]), Start: start, Total: e.Total})
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("scanning windows of %s: %w", s.path, err)
	}
	return out, nil
}

// Starts returns up to limit starts of the windows the store holds, from
// the first at or after from, in order. It reads one key per window.
func (w *Windows) Starts(from int64, limit int) ([]int64, error) {
	s := w.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return nil, s.closedErr("listing windows of")
	}
	it, err := s.mu.db.NewIter(&pebble.IterOptions{LowerBound: w.startKey(max(from, 0)), UpperBound: w.end()})
	if err != nil {
		return nil, fmt.Errorf("listing windows of %s: %w", s.path, err)
	}
	var out []int64
	for ok := it.First(); ok && len(out) < limit; {
		k := it.Key()
		if len(k) < windowKeyLen {
			ok = it.Next()
			continue
		}
		start := int64(binary.BigEndian.Uint64(k[1+8:]))
		out = append(out, start)
		ok = it.SeekGE(w.startKey(start + 1))
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("listing windows of %s: %w", s.path, err)
	}
	return out, nil
}

// Checkpoint returns the checkpoint of the size's changelog, and false
// when there is none.
func (w *Windows) Checkpoint() (Checkpoint, bool, error) {
	s := w.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return Checkpoint{}, false, s.closedErr("reading a window checkpoint of")
	}
	v, closer, err := s.mu.db.Get(w.checkpointKey())
	if errors.Is(err, pebble.ErrNotFound) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("reading the %d ms window checkpoint of %s: %w", w.sizeMS, s.path, err)
	}
	defer closer.Close()
	cp, err := decodeCheckpoint(v)
	return cp, err == nil, err
}

// NoStreamTime, as a WindowWrite's StreamTime, leaves the stored stream
// time as it is; ClearStreamTime deletes it.
const (
	NoStreamTime    = -1
	ClearStreamTime = math.MinInt64
)

// WindowWrite is what one cycle writes to one window size: its updates,
// the windows it expires (every window starting before ExpireBefore; 0
// expires none), its changelog's checkpoint and the stream time (or
// NoStreamTime, ClearStreamTime).
type WindowWrite struct {
	Windows      *Windows
	Updates      []WindowUpdate
	ExpireBefore int64
	Checkpoint   Checkpoint
	StreamTime   int64
}

// ApplyWindows writes ws in one atomic batch, synced to disk unless
// unsynced (see Apply and ApplyUnsynced).
func (s *Store) ApplyWindows(ws []WindowWrite, unsynced bool) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return s.closedErr("writing windows to")
	}
	b := s.mu.db.NewBatch()
	defer b.Close()
	if err := appendWindows(b, ws); err != nil {
		return fmt.Errorf("writing windows to %s: %w", s.path, err)
	}
	opts := pebble.Sync
	if unsynced {
		opts = pebble.NoSync
	}
	if err := b.Commit(opts); err != nil {
		return fmt.Errorf("committing windows to %s: %w", s.path, err)
	}
	return s.ReleaseLookup()
}

// appendWindows adds ws to a batch: the expiry first, so that an update of
// a window it expires is refused rather than deleted with it.
func appendWindows(b *pebble.Batch, ws []WindowWrite) error {
	for _, w := range ws {
		if w.Windows == nil || w.Windows.s == nil {
			return errors.New("state: a window write without its windows")
		}
		if w.ExpireBefore > 0 {
			if err := b.DeleteRange(w.Windows.startKey(0), w.Windows.startKey(w.ExpireBefore), nil); err != nil {
				return err
			}
		}
		for _, u := range w.Updates {
			if err := w.Windows.checkStart(u.Start); err != nil {
				return err
			}
			if u.Start < w.ExpireBefore && !u.Delete {
				return fmt.Errorf("state: an update of window %d of %q, which the same write expires (before %d)", u.Start, u.Product, w.ExpireBefore)
			}
			var err error
			if u.Delete {
				err = b.Delete(w.Windows.key(u.Product, u.Start), nil)
			} else {
				err = b.Set(w.Windows.key(u.Product, u.Start), encodeEntry(u.Entry), nil)
			}
			if err != nil {
				return err
			}
		}
		if err := b.Set(w.Windows.checkpointKey(), encodeCheckpoint(w.Checkpoint), nil); err != nil {
			return err
		}
		if w.StreamTime == ClearStreamTime {
			if err := b.Delete(w.Windows.streamTimeKey(), nil); err != nil {
				return err
			}
		} else if w.StreamTime >= 0 {
			if err := b.Set(w.Windows.streamTimeKey(), binary.BigEndian.AppendUint64(nil, uint64(w.StreamTime)), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// Each calls fn with every window of the size, by start and then
// product (see EachBetween).
func (w *Windows) Each(fn func(WindowTotal) error) error {
	return w.EachBetween(0, math.MaxInt64, fn)
}

// EachBetween calls fn with every window of the size starting from from
// to before (excluded), by start and then product, reading a page of
// products at a time (each under the store's read lock). It stops at
// fn's first error and returns it.
func (w *Windows) EachBetween(from, before int64, fn func(WindowTotal) error) error {
	for {
		starts, err := w.Starts(from, 64)
		if err != nil {
			return err
		}
		for _, start := range starts {
			if start >= before {
				return nil
			}
			for after := ""; ; {
				page, err := w.Scan(start, after, 1000)
				if err != nil {
					return err
				}
				for _, wt := range page {
					if err := fn(wt); err != nil {
						return err
					}
				}
				if len(page) < 1000 {
					break
				}
				after = page[len(page)-1].Product
			}
		}
		if len(starts) < 64 {
			return nil
		}
		from = starts[len(starts)-1] + 1
	}
}
