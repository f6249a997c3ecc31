package state

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// A bulk load fills an empty store with a stream of updates in no order (a
// full restore) by an external sort: the updates are gathered in memory up
// to the load's share of a BulkBudget, sorted, reduced to the last update of
// each product, and spilled to a sorted run; at the end the runs are merged
// (the latest wins, a deletion removes the product) into non-overlapping
// tables of the last level, written once, and ingested together with the
// checkpoint in one atomic step. Until then the store holds nothing: a
// crash in the middle leaves an empty store without checkpoint (and runs
// that the next Open deletes), which is restored from the start again.

// bulkDirName is the directory in a store's directory that holds a bulk
// load's runs and tables until they are ingested.
const bulkDirName = "bulk-load.tmp"

// bulkTableBytes is the size of key and value bytes after which a bulk
// load starts its next table.
const bulkTableBytes = 64 << 20

// removeBulkLeftovers deletes what a bulk load that did not finish left in
// the store's directory.
func removeBulkLeftovers(path string) {
	_ = os.RemoveAll(filepath.Join(path, bulkDirName))
}

// BulkBudget is the memory that the bulk loads under way share: each takes
// an equal share of it, recomputed as loads begin and end. A load reads its
// share at every update, so the count is an atomic, not a lock.
type BulkBudget struct {
	bytes int64
	loads atomic.Int64 // the loads under way
}

// NewBulkBudget makes a budget of bytes for the bulk loads under way.
func NewBulkBudget(bytes int64) *BulkBudget { return &BulkBudget{bytes: bytes} }

func (b *BulkBudget) join()  { b.loads.Add(1) }
func (b *BulkBudget) leave() { b.loads.Add(-1) }

// share is what one load may hold now.
func (b *BulkBudget) share() int64 {
	return b.bytes / max(1, b.loads.Load())
}

// BulkOptions tune a bulk load.
type BulkOptions struct {
	// Budget is the memory shared with the other loads; nil means 64 MiB
	// for this load alone.
	Budget *BulkBudget
	// AfterSpill, if set, is called after each run is written, with the
	// number of runs so far (a test's crash point).
	AfterSpill func(runs int)
	// BeforeIngest, if set, is called once the tables are written, before
	// they are ingested (a test's crash point).
	BeforeIngest func()
}

// BulkStats describe a finished bulk load.
type BulkStats struct {
	// Updates is the number of updates added, Products the number of
	// products the store holds after it.
	Updates, Products int64
	// Runs is the number of sorted runs spilled, Tables the number of
	// tables ingested.
	Runs, Tables int
}

// BulkLoad is a bulk load into an empty store, made by Store.BulkLoad. It
// is used by one goroutine.
type BulkLoad struct {
	s   *Store
	o   BulkOptions
	dir string
	// buf gathers the updates; a full one is sorted and written by a
	// goroutine of its own (spilling, nil when none is under way) while
	// spare, the buffer it gave back last, gathers the next ones: each
	// holds up to half the load's share.
	buf      *sortBuffer
	spare    *sortBuffer
	spilling chan spilled
	runs     []run
	n        int64
	value    []byte
	closed   bool
	// prefix is the key space's (before each key added); key is scratch.
	prefix []byte
	key    []byte
}

// spilled is the end of a spill: the run written, or the error, and the
// buffer emptied.
type spilled struct {
	r   run
	buf *sortBuffer
	err error
}

// BulkLoad begins a bulk load into the store, which must be empty (no
// product, no checkpoint). Close it when done with it, after Finish too.
func (s *Store) BulkLoad(o BulkOptions) (*BulkLoad, error) {
	return s.bulkLoad(o, []byte{dataPrefix}, nil, nil)
}

// BulkLoad begins a bulk load of windows into the size's key space, which
// must be empty (the rest of the store need not be): AddWindows, then
// FinishWindows, which writes no checkpoint (the caller writes the size's
// checkpoint and stream time once the windows are in). Close it when done
// with it.
func (w *Windows) BulkLoad(o BulkOptions) (*BulkLoad, error) {
	return w.s.bulkLoad(o, w.prefix[:], w.startKey(0), w.end())
}

// bulkLoad begins a load of keys under prefix; the range [lo, hi) (nil:
// the whole store) must be empty.
func (s *Store) bulkLoad(o BulkOptions, prefix, lo, hi []byte) (*BulkLoad, error) {
	if o.Budget == nil {
		o.Budget = NewBulkBudget(64 << 20)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return nil, s.closedErr("bulk loading")
	}
	it, err := s.mu.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, fmt.Errorf("bulk loading %s: %w", s.path, err)
	}
	nonEmpty := it.First()
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, fmt.Errorf("bulk loading %s: %w", s.path, err)
	}
	if nonEmpty {
		what := "the store"
		if lo != nil {
			what = "the key space"
		}
		return nil, fmt.Errorf("bulk loading %s: %s is not empty", s.path, what)
	}
	dir := filepath.Join(s.path, bulkDirName)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("bulk loading %s: %w", s.path, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bulk loading %s: %w", s.path, err)
	}
	o.Budget.join()
	chunk := int(min(max(o.Budget.bytes/64, 16<<10), 1<<20))
	return &BulkLoad{s: s, o: o, dir: dir, prefix: slices.Clone(prefix), buf: &sortBuffer{chunkSize: chunk}, spare: &sortBuffer{chunkSize: chunk}}, nil
}

// Add adds updates, later ones replacing earlier ones of the same product.
// Whenever they fill half the load's share of the budget, a goroutine sorts
// them and writes them as a run, while the other half gathers the next ones.
// The check runs after each update, not once per call, so that the memory a
// load holds and the runs it spills depend on the data and the budget alone,
// never on how many updates a fetch happened to bring.
func (l *BulkLoad) Add(updates []Update) error {
	limit := l.o.Budget.share() / 2
	for _, u := range updates {
		l.key = append(l.key[:0], u.Product...)
		if err := l.add(l.key, u.Entry, u.Delete, limit); err != nil {
			return err
		}
	}
	return nil
}

// AddEncoded adds one update as Add does, of product, with the entry's
// offsets in their encoding as sales.Offsets.AppendEncode writes it (see
// sales.CanonicalOffsets): a restore copies a changelog record's header
// into the load without decoding it. del adds a deletion; total and
// offsets are then not read.
//
// It is for a load of totals (Store.BulkLoad): a load of windows refuses it.
func (l *BulkLoad) AddEncoded(product []byte, total int64, offsets []byte, del bool) error {
	if len(l.prefix) != 1 || l.prefix[0] != dataPrefix {
		return fmt.Errorf("bulk loading %s: AddEncoded adds totals, not windows", l.s.path)
	}
	l.key = append(l.key[:0], product...)
	if !del {
		l.value = append(binary.BigEndian.AppendUint64(l.value[:0], uint64(total)), offsets...)
	}
	return l.addValue(l.key, l.value, del, l.o.Budget.share()/2)
}

// AddWindows adds window updates (see Add) to a load of windows
// (Windows.BulkLoad).
func (l *BulkLoad) AddWindows(updates []WindowUpdate) error {
	limit := l.o.Budget.share() / 2
	for _, u := range updates {
		if u.Start < 0 {
			return fmt.Errorf("state: window start %d of %q is negative", u.Start, u.Product)
		}
		l.key = append(binary.BigEndian.AppendUint64(l.key[:0], uint64(u.Start)), u.Product...)
		if err := l.add(l.key, u.Entry, u.Delete, limit); err != nil {
			return err
		}
	}
	return nil
}

// add adds one update of key (within the load's key space), and spills the
// buffer once it holds limit bytes.
func (l *BulkLoad) add(key []byte, e Entry, del bool, limit int64) error {
	if !del {
		l.value = binary.BigEndian.AppendUint64(l.value[:0], uint64(e.Total))
		l.value = e.Offsets.AppendEncode(l.value)
	}
	return l.addValue(key, l.value, del, limit)
}

// addValue adds one update of key with its stored value (not read for a
// deletion), and spills the buffer once it holds limit bytes.
func (l *BulkLoad) addValue(key, value []byte, del bool, limit int64) error {
	if l.closed {
		return l.s.closedErr("bulk loading")
	}
	if del {
		l.buf.add(key, nil, true)
	} else {
		l.buf.add(key, value, false)
	}
	l.n++
	if l.buf.bytes() < limit {
		return nil
	}
	return l.spillBuf()
}

// spillBuf hands the full buffer to a goroutine that sorts and writes it
// as the next run, after the spill under way, if any, has ended, and
// gathers the next updates in the buffer that spill gave back.
func (l *BulkLoad) spillBuf() error {
	if err := l.waitSpill(); err != nil {
		return err
	}
	full := l.buf
	l.buf, l.spare = l.spare, nil
	l.spilling = make(chan spilled, 1)
	path := filepath.Join(l.dir, "run-"+strconv.Itoa(len(l.runs)))
	go func() { l.spilling <- spill(full, path) }()
	return nil
}

// waitSpill waits for the spill under way, if any.
func (l *BulkLoad) waitSpill() error {
	if l.spilling == nil {
		return nil
	}
	sp := <-l.spilling
	l.spilling = nil
	l.spare = sp.buf
	if sp.err != nil {
		return fmt.Errorf("bulk loading %s: writing run: %w", l.s.path, sp.err)
	}
	l.runs = append(l.runs, sp.r)
	if l.o.AfterSpill != nil {
		l.o.AfterSpill(len(l.runs))
	}
	return nil
}

// spill sorts buf and writes it as the run at path, and empties it.
func spill(buf *sortBuffer, path string) spilled {
	defer buf.reset()
	buf.sort()
	r := run{path: path}
	f, err := os.Create(path)
	if err != nil {
		return spilled{buf: buf, err: err}
	}
	r.marks, err = buf.writeRun(bufio.NewWriterSize(f, 256<<10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return spilled{r: r, buf: buf, err: err}
}

// bulkPartMin is the least number of updates for which Finish merges and
// writes several key ranges at once.
const bulkPartMin = 100_000

// Finish merges what was added into tables and ingests them with the
// checkpoint cp, atomically: the store holds everything or nothing of the
// load. The key space is cut into ranges of about equal size, merged and
// written in parallel (up to GOMAXPROCS, at most 4), each range into its
// own tables. The load is closed after it.
func (l *BulkLoad) Finish(ctx context.Context, cp Checkpoint) (BulkStats, error) {
	return l.finish(ctx, encodeCheckpoint(cp))
}

// FinishWindows ends a load of windows as Finish does, without a
// checkpoint: the caller writes the size's checkpoint once the windows are
// in (until then the size keeps the checkpoint it had).
func (l *BulkLoad) FinishWindows(ctx context.Context) (BulkStats, error) {
	return l.finish(ctx, nil)
}

// finish writes the tables and ingests them, last (a value of
// checkpointKey, which sorts after every product) when not nil.
func (l *BulkLoad) finish(ctx context.Context, last []byte) (BulkStats, error) {
	if l.closed {
		return BulkStats{}, l.s.closedErr("bulk loading")
	}
	defer l.Close()
	if err := l.waitSpill(); err != nil {
		return BulkStats{}, err
	}
	st := BulkStats{Updates: l.n, Runs: len(l.runs)}
	l.spare = nil
	l.buf.sort()
	var bounds [][]byte
	if parts := min(runtime.GOMAXPROCS(0), 4); parts > 1 && l.n >= bulkPartMin {
		bounds = l.splitKeys(parts)
	}

	s := l.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return st, s.closedErr("bulk loading")
	}
	db := s.mu.db
	opts := s.opts.Clone()
	opts.EnsureDefaults()
	wo := opts.MakeWriterOptions(len(opts.Levels)-1, db.TableFormat())

	parts := make([]bulkPart, len(bounds)+1)
	var wg sync.WaitGroup
	for i := range parts {
		p := &parts[i]
		p.tw = tableWriter{dir: l.dir, name: "table-" + strconv.Itoa(i) + "-", fs: opts.FS, wo: wo}
		if i > 0 {
			p.lo = bounds[i-1]
		}
		if i < len(bounds) {
			p.hi = bounds[i]
		} else {
			// The checkpoint sorts after every product: it goes in the
			// last table, and comes with the data in the same ingestion.
			p.last = last
		}
		wg.Go(func() { p.err = l.writePart(ctx, p) })
	}
	wg.Wait()
	var paths []string
	var errs []error
	for _, p := range parts {
		paths = append(paths, p.tw.paths...)
		st.Products += p.products
		errs = append(errs, p.err)
	}
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		return st, fmt.Errorf("bulk loading %s: %w", s.path, err)
	}
	st.Tables = len(paths)
	if l.o.BeforeIngest != nil {
		l.o.BeforeIngest()
	}
	if err := s.ReleaseLookup(); err != nil {
		return st, err
	}
	if err := db.Ingest(ctx, paths); err != nil {
		return st, fmt.Errorf("bulk loading %s: ingesting: %w", s.path, err)
	}
	return st, nil
}

// bulkPart is one key range [lo, hi) of a Finish (nil: unbounded), with
// the checkpoint's value when it is the last.
type bulkPart struct {
	lo, hi   []byte
	last     []byte
	tw       tableWriter
	products int64
	err      error
}

// splitKeys returns up to parts-1 keys that cut what was added into ranges
// of about equal numbers of records, from the runs' marks and a sample of
// the buffer.
func (l *BulkLoad) splitKeys(parts int) [][]byte {
	var sample [][]byte
	for _, r := range l.runs {
		for _, m := range r.marks {
			sample = append(sample, m.key)
		}
	}
	for i := 0; i < len(l.buf.idx); i += runMarkEvery {
		sample = append(sample, l.buf.key(&l.buf.idx[i]))
	}
	slices.SortFunc(sample, bytes.Compare)
	var bounds [][]byte
	for k := 1; k < parts; k++ {
		b := sample[len(sample)*k/parts]
		if len(b) == 0 || len(bounds) > 0 && bytes.Equal(bounds[len(bounds)-1], b) {
			continue
		}
		bounds = append(bounds, b)
	}
	return bounds
}

// writePart merges the records of p's range from the runs and the buffer
// into p's tables.
func (l *BulkLoad) writePart(ctx context.Context, p *bulkPart) (err error) {
	defer func() {
		if err != nil {
			p.tw.abandon()
		}
	}()
	var srcs []source
	for _, r := range l.runs {
		f, err := os.Open(r.path)
		if err != nil {
			return err
		}
		defer f.Close()
		rs, err := openRunSource(f, r.marks, p.lo, p.hi)
		if err != nil {
			return fmt.Errorf("reading run: %w", err)
		}
		srcs = append(srcs, rs)
	}
	srcs = append(srcs, newMemSource(l.buf, p.lo, p.hi))
	next := (&singleSource{srcs[0]}).next
	if len(srcs) > 1 {
		m, err := newMerger(srcs)
		if err != nil {
			return fmt.Errorf("reading run: %w", err)
		}
		next = m.next
	}
	key := slices.Clone(l.prefix)
	for n := 0; ; n++ {
		k, v, del, ok, err := next()
		if err != nil {
			return fmt.Errorf("reading run: %w", err)
		}
		if !ok {
			break
		}
		if del {
			// Nothing is below: the deletion has nothing left to delete.
			continue
		}
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		key = append(key[:len(l.prefix)], k...)
		if err := p.tw.set(key, v); err != nil {
			return err
		}
		p.products++
	}
	if p.last != nil {
		if err := p.tw.set(checkpointKey, p.last); err != nil {
			return err
		}
	}
	return p.tw.finish()
}

// Close ends the load, deleting its runs and tables. It does not touch what
// Finish ingested.
func (l *BulkLoad) Close() {
	if l.closed {
		return
	}
	l.closed = true
	if l.spilling != nil {
		<-l.spilling // its files are removed next
		l.spilling = nil
	}
	l.buf, l.spare = nil, nil
	l.o.Budget.leave()
	_ = os.RemoveAll(l.dir)
}

// tableWriter writes keys in order to tables of the last level, starting a
// new one every bulkTableBytes.
type tableWriter struct {
	dir   string
	name  string // the prefix of its tables' names
	fs    vfs.FS
	wo    sstable.WriterOptions
	w     *sstable.Writer
	bytes int
	paths []string
}

func (t *tableWriter) set(k, v []byte) error {
	if t.w != nil && t.bytes >= bulkTableBytes {
		if err := t.w.Close(); err != nil {
			t.w = nil
			return err
		}
		t.w = nil
	}
	if t.w == nil {
		name := filepath.Join(t.dir, t.name+strconv.Itoa(len(t.paths))+".sst")
		f, err := t.fs.Create(name, vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		t.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), t.wo)
		t.paths = append(t.paths, name)
		t.bytes = 0
	}
	t.bytes += len(k) + len(v)
	return t.w.Set(k, v)
}

// finish closes (and syncs: Ingest needs it) the last table.
func (t *tableWriter) finish() error {
	if t.w == nil {
		return nil
	}
	err := t.w.Close()
	t.w = nil
	return err
}

// abandon closes the table being written after an error.
func (t *tableWriter) abandon() {
	if t.w != nil {
		_ = t.w.Close()
		t.w = nil
	}
}

// sortBuffer holds records in chunks of memory, each record its key then
// its value; idx refers to them, with the first 8 bytes of the key to
// compare most of them without reading the chunks.
type sortBuffer struct {
	chunkSize int
	chunks    [][]byte
	cur       int   // the chunk being filled
	filled    int64 // the bytes of keys and values added since the reset
	idx       []sortRef
}

type sortRef struct {
	prefix uint64
	// chunk and off locate the record: in the order the records came.
	chunk, off uint32
	klen       uint32
	vlen       uint32 // the value's length + 1; 0: a deletion
}

// sortRefBytes is the size of a sortRef.
const sortRefBytes = 24

func keyPrefix(k []byte) uint64 {
	if len(k) >= 8 {
		return binary.BigEndian.Uint64(k[:8])
	}
	var b [8]byte
	copy(b[:], k)
	return binary.BigEndian.Uint64(b[:])
}

func (b *sortBuffer) add(key []byte, value []byte, del bool) {
	n := len(key) + len(value)
	if len(b.chunks) == 0 || len(b.chunks[b.cur])+n > cap(b.chunks[b.cur]) {
		if len(b.chunks) > 0 && len(b.chunks[b.cur]) > 0 {
			b.cur++
		}
		if b.cur == len(b.chunks) {
			b.chunks = append(b.chunks, make([]byte, 0, max(b.chunkSize, n)))
		} else if cap(b.chunks[b.cur]) < n {
			b.chunks[b.cur] = make([]byte, 0, n)
		}
	}
	c := b.chunks[b.cur]
	r := sortRef{prefix: keyPrefix(key), chunk: uint32(b.cur), off: uint32(len(c)), klen: uint32(len(key))}
	if !del {
		r.vlen = uint32(len(value)) + 1
	}
	b.idx = append(b.idx, r)
	b.filled += int64(n)
	c = append(c, key...)
	b.chunks[b.cur] = append(c, value...)
}

// bytes is the size of what the buffer holds: the updates added since its
// reset, with their references. It is not the capacity: a buffer given
// back by a spill keeps its chunks for the next updates, and counting them
// would make it look full while it is empty.
func (b *sortBuffer) bytes() int64 {
	return b.filled + int64(len(b.idx))*sortRefBytes
}

func (b *sortBuffer) key(r *sortRef) []byte {
	return b.chunks[r.chunk][r.off : r.off+r.klen]
}

func (b *sortBuffer) value(r *sortRef) ([]byte, bool) {
	if r.vlen == 0 {
		return nil, true
	}
	at := r.off + r.klen
	return b.chunks[r.chunk][at : at+r.vlen-1], false
}

// sort orders idx by key and keeps the last record of each key.
func (b *sortBuffer) sort() {
	b.order(b.idx)
	out := b.idx[:0]
	for i := range b.idx {
		r := b.idx[i]
		if i+1 < len(b.idx) && b.idx[i+1].prefix == r.prefix && bytes.Equal(b.key(&b.idx[i+1]), b.key(&r)) {
			continue // a later record of the key follows
		}
		out = append(out, r)
	}
	b.idx = out
}

// order sorts refs by compare.
func (b *sortBuffer) order(refs []sortRef) {
	// The radix passes start at the first byte in which the prefixes
	// differ; when none does (keys that share their first 8 bytes), the
	// comparison does it all, as the passes would find nothing to split.
	var or, and uint64 = 0, ^uint64(0)
	for i := range refs {
		or |= refs[i].prefix
		and &= refs[i].prefix
	}
	if diff := or ^ and; diff == 0 {
		slices.SortFunc(refs, b.compare)
	} else {
		b.radixSort(refs, bits.LeadingZeros64(diff)/8)
	}
}

// compare orders references by key, then in the order the records came
// (chunk, offset), so that the last record of a key sorts last.
func (b *sortBuffer) compare(x, y sortRef) int {
	if x.prefix != y.prefix {
		if x.prefix < y.prefix {
			return -1
		}
		return 1
	}
	if c := bytes.Compare(b.key(&x), b.key(&y)); c != 0 {
		return c
	}
	if x.chunk != y.chunk {
		return cmp.Compare(x.chunk, y.chunk)
	}
	return cmp.Compare(x.off, y.off)
}

// insertionSort sorts a few references by compare, comparing their
// prefixes in line: most small buckets differ there, and a call per
// comparison costs more than the comparison.
func (b *sortBuffer) insertionSort(refs []sortRef) {
	for i := 1; i < len(refs); i++ {
		r := refs[i]
		j := i
		for ; j > 0; j-- {
			p := &refs[j-1]
			if p.prefix < r.prefix || p.prefix == r.prefix && b.compare(*p, r) <= 0 {
				break
			}
			refs[j] = *p
		}
		refs[j] = r
	}
}

// radixSmall is the size under which a radix bucket is sorted by
// comparison: below it the passes cost more than they save.
const radixSmall = 64

// radixSort sorts refs in place by compare: an in-place most significant
// digit radix sort (American flag sort) on byte depth of the 8-byte key
// prefix, which the references carry, so the chunks are read only for
// references whose prefixes are equal: those, and the small buckets, are
// sorted by comparison.
func (b *sortBuffer) radixSort(refs []sortRef, depth int) {
	for {
		if len(refs) < radixSmall {
			b.insertionSort(refs)
			return
		}
		if depth == 8 {
			slices.SortFunc(refs, b.compare)
			return
		}
		shift := uint(56 - 8*depth)
		var count [256]int
		for i := range refs {
			count[byte(refs[i].prefix>>shift)]++
		}
		if count[byte(refs[0].prefix>>shift)] == len(refs) {
			depth++ // every reference has this byte: on to the next
			continue
		}
		// next[d] is where the next reference of digit d goes; end[d]
		// where digit d's bucket ends.
		var next, end [256]int
		at := 0
		for d := range 256 {
			next[d] = at
			at += count[d]
			end[d] = at
		}
		for d := range 256 {
			for next[d] < end[d] {
				r := refs[next[d]]
				for {
					rd := byte(r.prefix >> shift)
					if int(rd) == d {
						break
					}
					r, refs[next[rd]] = refs[next[rd]], r
					next[rd]++
				}
				refs[next[d]] = r
				next[d]++
			}
		}
		start := 0
		for d := range 256 {
			if count[d] > 1 {
				b.radixSort(refs[start:end[d]], depth+1)
			}
			start = end[d]
		}
		return
	}
}

// writeRun writes the sorted records to w as a run holds them: uvarint key
// length, key, uvarint value length + 1 (0: a deletion), value. It returns
// the run's marks.
// Each record is appended to w's buffer in one piece (four small writes
// cost three times as much).
func (b *sortBuffer) writeRun(w *bufio.Writer) ([]runMark, error) {
	var marks []runMark
	var off int64
	for i := range b.idx {
		r := &b.idx[i]
		if i%runMarkEvery == 0 {
			marks = append(marks, runMark{key: slices.Clone(b.key(r)), off: off})
		}
		v, _ := b.value(r)
		n := 2*binary.MaxVarintLen32 + int(r.klen) + len(v)
		if w.Available() < n {
			if err := w.Flush(); err != nil {
				return nil, err
			}
		}
		out := w.AvailableBuffer()
		if cap(out) < n {
			out = make([]byte, 0, n) // larger than w's buffer
		}
		out = binary.AppendUvarint(out, uint64(r.klen))
		out = append(out, b.key(r)...)
		out = binary.AppendUvarint(out, uint64(r.vlen))
		out = append(out, v...)
		if _, err := w.Write(out); err != nil {
			return nil, err
		}
		off += int64(len(out))
	}
	return marks, w.Flush()
}

// run is a sorted run on disk, with the key and offset of every
// runMarkEvery-th record, to start reading it at a key.
type run struct {
	path  string
	marks []runMark
}

type runMark struct {
	key []byte
	off int64
}

const runMarkEvery = 1024

// reset empties the buffer, keeping its memory for the next run.
func (b *sortBuffer) reset() {
	for i := range b.chunks {
		b.chunks[i] = b.chunks[i][:0]
	}
	b.cur = 0
	b.filled = 0
	b.idx = b.idx[:0]
}

// source is a sorted sequence of records with unique keys.
type source interface {
	// next moves to the next record; false at the end.
	next() (bool, error)
	key() []byte
	value() (v []byte, del bool)
}

type memSource struct {
	b      *sortBuffer
	i, end int
	k, v   []byte
	del    bool
}

// newMemSource reads the sorted buffer's records in [lo, hi) (nil:
// unbounded).
func newMemSource(b *sortBuffer, lo, hi []byte) *memSource {
	find := func(k []byte) int {
		i, _ := slices.BinarySearchFunc(b.idx, k, func(r sortRef, k []byte) int { return bytes.Compare(b.key(&r), k) })
		return i
	}
	s := &memSource{b: b, i: -1, end: len(b.idx)}
	if lo != nil {
		s.i = find(lo) - 1
	}
	if hi != nil {
		s.end = find(hi)
	}
	return s
}

func (s *memSource) next() (bool, error) {
	s.i++
	if s.i >= s.end {
		return false, nil
	}
	r := &s.b.idx[s.i]
	s.k = s.b.key(r)
	s.v, s.del = s.b.value(r)
	return true, nil
}

func (s *memSource) key() []byte           { return s.k }
func (s *memSource) value() ([]byte, bool) { return s.v, s.del }

type runSource struct {
	r    *bufio.Reader
	hi   []byte
	k, v []byte
	del  bool
	// pending is set when the record in k and v was read ahead (the first
	// at or past lo) and is the next to return; done when the run holds
	// nothing at or past lo.
	pending, done bool
}

// openRunSource reads the run in f from its first record at or past lo up
// to hi (nil: unbounded), starting at its mark before lo.
func openRunSource(f *os.File, marks []runMark, lo, hi []byte) (*runSource, error) {
	if lo != nil {
		i, _ := slices.BinarySearchFunc(marks, lo, func(m runMark, k []byte) int { return bytes.Compare(m.key, k) })
		// marks[i-1] is the last mark below lo.
		if i > 0 {
			if _, err := f.Seek(marks[i-1].off, io.SeekStart); err != nil {
				return nil, err
			}
		}
	}
	s := &runSource{r: bufio.NewReaderSize(f, 64<<10), hi: hi}
	for lo != nil {
		ok, err := s.read()
		if err != nil || !ok {
			s.done = true
			return s, err
		}
		if bytes.Compare(s.k, lo) >= 0 {
			s.pending = true
			break
		}
	}
	return s, nil
}

func (s *runSource) next() (bool, error) {
	if s.done {
		return false, nil
	}
	if s.pending {
		s.pending = false
	} else if ok, err := s.read(); !ok || err != nil {
		return false, err
	}
	if s.hi != nil && bytes.Compare(s.k, s.hi) >= 0 {
		return false, nil
	}
	return true, nil
}

// read reads the next record of the file. The lengths are read from the
// reader's buffer in place (Peek), not a byte at a time.
func (s *runSource) read() (bool, error) {
	n, err := s.uvarint()
	if err != nil {
		return false, err
	}
	if n < 0 {
		return false, nil
	}
	s.k = slices.Grow(s.k[:0], int(n))[:n]
	if _, err := io.ReadFull(s.r, s.k); err != nil {
		return false, unexpectedEOF(err)
	}
	vl, err := s.uvarint()
	if err == nil && vl < 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return false, err
	}
	s.del = vl == 0
	if vl == 0 {
		s.v = s.v[:0]
		return true, nil
	}
	s.v = slices.Grow(s.v[:0], int(vl-1))[:vl-1]
	if _, err := io.ReadFull(s.r, s.v); err != nil {
		return false, unexpectedEOF(err)
	}
	return true, nil
}

// unexpectedEOF is err, io.ErrUnexpectedEOF for io.EOF: inside a record,
// the end of the file is not the end of the run.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// uvarint reads a length as writeRun writes it: -1 at the end of the file.
func (s *runSource) uvarint() (int64, error) {
	b, err := s.r.Peek(binary.MaxVarintLen32)
	if len(b) == 0 {
		if err == io.EOF {
			return -1, nil
		}
		return 0, err
	}
	v, n := binary.Uvarint(b)
	if n == 0 && err != nil {
		// The file ends, or fails, inside the length.
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	if n <= 0 || v > math.MaxUint32 {
		return 0, fmt.Errorf("state: corrupt run: bad length %x", b)
	}
	_, _ = s.r.Discard(n)
	return int64(v), nil
}

func (s *runSource) key() []byte           { return s.k }
func (s *runSource) value() ([]byte, bool) { return s.v, s.del }

// singleSource reads one source as merger reads several.
type singleSource struct{ s source }

func (s *singleSource) next() (k, v []byte, del, ok bool, err error) {
	if ok, err = s.s.next(); !ok || err != nil {
		return nil, nil, false, false, err
	}
	v, del = s.s.value()
	return s.s.key(), v, del, true, nil
}

// merger merges sources, oldest first: of the records of one key, the
// newest source's wins. Its heap is typed and keeps each source's current
// key beside it, so a comparison reads two slices, not two interface calls.
type merger struct {
	h []mergeItem
	// started is set once a record was returned: the next call first moves
	// past its key (its bytes stay valid until then).
	started bool
	key     []byte
}

type mergeItem struct {
	src source
	key []byte // src.key(), valid until src moves
	age int    // the index of the source: higher is newer
}

// before orders the heap: by key, then the newest source first.
func (x *mergeItem) before(y *mergeItem) bool {
	if c := bytes.Compare(x.key, y.key); c != 0 {
		return c < 0
	}
	return x.age > y.age
}

func newMerger(srcs []source) (*merger, error) {
	m := &merger{}
	for i, s := range srcs {
		ok, err := s.next()
		if err != nil {
			return nil, err
		}
		if ok {
			m.h = append(m.h, mergeItem{src: s, key: s.key(), age: i})
		}
	}
	for i := len(m.h)/2 - 1; i >= 0; i-- {
		m.down(i)
	}
	return m, nil
}

// down moves the item at i down to its place in the heap.
func (m *merger) down(i int) {
	h := m.h
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		c := l
		if r := l + 1; r < len(h) && h[r].before(&h[l]) {
			c = r
		}
		if !h[c].before(&h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// next returns the next key and its newest record. The returned slices are
// valid until the next call.
func (m *merger) next() (k, v []byte, del, ok bool, err error) {
	// Move on the source of the previous record, and drop the older
	// records of its key.
	if len(m.h) > 0 && m.started {
		if err := m.advance(); err != nil {
			return nil, nil, false, false, err
		}
	}
	if len(m.h) == 0 {
		return nil, nil, false, false, nil
	}
	m.started = true
	top := &m.h[0]
	v, del = top.src.value()
	return top.key, v, del, true, nil
}

// advance moves the top source past its record and every older record of
// the same key.
func (m *merger) advance() error {
	// The key's bytes belong to the top source, which is about to move:
	// keep a copy.
	m.key = append(m.key[:0], m.h[0].key...)
	for len(m.h) > 0 && bytes.Equal(m.h[0].key, m.key) {
		top := &m.h[0]
		ok, err := top.src.next()
		if err != nil {
			return err
		}
		if ok {
			top.key = top.src.key()
		} else {
			last := len(m.h) - 1
			m.h[0] = m.h[last]
			m.h = m.h[:last]
		}
		m.down(0)
	}
	return nil
}
