package state

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
)

// Key space of a task's Pebble database:
//
//	'd' + product  -> 8-byte big-endian total, then the encoded sales.Offsets
//	                  (either of its encodings, see internal/sales/wire.go:
//	                  entries written before offsets carried the input
//	                  topic's id hold the legacy one)
//	'm' + "checkpoint" -> the Checkpoint, see encodeCheckpoint
//
// Every Apply writes the changed products and the checkpoint in one batch.
const (
	dataPrefix = 'd'
	dataEnd    = dataPrefix + 1
)

var checkpointKey = []byte("mcheckpoint")

const checkpointVersion = 1

// ErrClosed is returned by a Store used after Close.
var ErrClosed = errors.New("state: store closed")

// Entry is what a store keeps for one product.
type Entry struct {
	Total int64
	// Offsets are the input offsets the total reflects, per input partition,
	// and the id of the input topic they are of.
	Offsets sales.Offsets
}

// Update is one product's new entry, or its deletion (a changelog
// tombstone).
type Update struct {
	Product string
	Entry   Entry
	Delete  bool
}

// Checkpoint is the position a store reflects, stored in the same batch as
// the data.
type Checkpoint struct {
	// ChangelogOffset is the next changelog offset to restore from: every
	// changelog record below it is reflected in the store.
	ChangelogOffset int64
	// InputOffset is the next input offset of the task's partition that the
	// store reflects, or -1 when unknown (after a restore). Informational:
	// the input position is the group's committed offset, and duplicates are
	// recognised per product by Entry.Offsets.
	InputOffset int64
	// ChangelogTopicID is the id of the changelog topic the offsets refer to;
	// a different id means the topic was recreated, or the store was written
	// against another changelog (another application.id or store.name):
	// either way the store is void.
	ChangelogTopicID [16]byte
}

func encodeCheckpoint(cp Checkpoint) []byte {
	b := make([]byte, 0, 1+8+8+16)
	b = append(b, checkpointVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(cp.ChangelogOffset))
	b = binary.BigEndian.AppendUint64(b, uint64(cp.InputOffset))
	return append(b, cp.ChangelogTopicID[:]...)
}

func decodeCheckpoint(b []byte) (Checkpoint, error) {
	if len(b) != 1+8+8+16 || b[0] != checkpointVersion {
		return Checkpoint{}, fmt.Errorf("state: unreadable checkpoint (%d bytes)", len(b))
	}
	var cp Checkpoint
	cp.ChangelogOffset = int64(binary.BigEndian.Uint64(b[1:]))
	cp.InputOffset = int64(binary.BigEndian.Uint64(b[9:]))
	copy(cp.ChangelogTopicID[:], b[17:])
	return cp, nil
}

func encodeEntry(e Entry) []byte {
	b := make([]byte, 0, 8+e.Offsets.EncodedLen())
	b = binary.BigEndian.AppendUint64(b, uint64(e.Total))
	return e.Offsets.AppendEncode(b)
}

func decodeEntry(b []byte) (Entry, error) {
	if len(b) < 8 {
		return Entry{}, fmt.Errorf("state: unreadable entry (%d bytes)", len(b))
	}
	offs, err := sales.DecodeOffsets(b[8:])
	if err != nil {
		return Entry{}, err
	}
	return Entry{Total: int64(binary.BigEndian.Uint64(b)), Offsets: offs}, nil
}

func dataKey(product string) []byte {
	k := make([]byte, 0, 1+len(product))
	return append(append(k, dataPrefix), product...)
}

// cleanMarker is a file in a store's directory that exists only between a
// clean Close and the next Open: without it, the last run ended in a crash
// and Open verifies the whole store.
const cleanMarker = "CLEAN_SHUTDOWN"

// ErrCorrupt marks a store that cannot be trusted: Pebble reported
// corruption, or its files are damaged (see damaged). The owner
// quarantines it and restores from the changelog; any other failure to
// open is retried, never quarantined.
var ErrCorrupt = errors.New("state: store corrupted")

// ErrStoreLocked is returned by Open when the store is open already: in
// this process (a standby copy or a task that has not closed it yet) or in
// another one. It is not corruption: the store is intact and opens once
// its holder closed it; the caller waits for the holder or retries, and
// never quarantines it for this.
var ErrStoreLocked = errors.New("state: store is open elsewhere")

// openStores are the directories of the stores open in this process
// (absolute paths). Pebble takes a lock per directory and process, and
// refuses a second one with an error that names no cause it exports
// ("lock held by current process"); Open checks here first, so that a
// second open in one process is ErrStoreLocked before Pebble is asked.
// Process-wide like Pebble's own lock table.
var openStores = struct {
	mu    sync.Mutex      // guards paths
	paths map[string]bool // guarded by mu
}{paths: map[string]bool{}}

// claimStore records the store at path as open in this process; it fails
// with ErrStoreLocked when it is already. It returns the key to release.
func claimStore(path string) (string, error) {
	key, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("opening store %s: %w", path, err)
	}
	openStores.mu.Lock()
	defer openStores.mu.Unlock()
	if openStores.paths[key] {
		return "", fmt.Errorf("opening store %s: %w (by this process; it opens once closed there)", path, ErrStoreLocked)
	}
	openStores.paths[key] = true
	return key, nil
}

// releaseStore records that the store claimed as key is closed.
func releaseStore(key string) {
	openStores.mu.Lock()
	defer openStores.mu.Unlock()
	delete(openStores.paths, key)
}

// IsCorrupt reports whether err means the store is corrupted.
func IsCorrupt(err error) bool {
	return err != nil && (errors.Is(err, ErrCorrupt) || pebble.IsCorruptionError(err))
}

// Store is one task's Pebble database. Reads are safe from any goroutine;
// writes come from the task that owns the store. Every method may race Close
// (an HTTP read of a task being revoked): once Close has begun, the others
// wait for it and return ErrClosed; none reaches the closed database.
type Store struct {
	path     string
	readOnly bool
	// claim is the store's entry in openStores, released by Close.
	claim string
	// opts are the database's options, for the tables a bulk load writes.
	opts *pebble.Options

	// mu guards db, the field inside it. Get, Checkpoint, Apply, Scan and
	// Count hold the read lock while they use db, Close the write lock: a
	// read costs one RLock, and Close waits for the reads and writes under
	// way.
	mu struct {
		sync.RWMutex
		db *pebble.DB // nil once closed
	}
	// lookup is the owner's iterator for Lookup (nil: none open), and the
	// key buffer it seeks with. An iterator sees the database as it was when
	// it was made: every write drops it. Its mutex guards it and key
	// (Lookup takes it inside mu's read lock, ReleaseLookup on its own).
	lookup struct {
		sync.Mutex
		it  *pebble.Iterator // guarded by lookup's mutex
		key []byte           // guarded by lookup's mutex
	}
}

// BlockCache is Pebble's block cache (index, filter and data blocks), shared
// by the stores opened with it so that one bound covers them all.
type BlockCache struct {
	c     *pebble.Cache
	bytes int64
}

// NewBlockCache makes a block cache of the given size in bytes.
func NewBlockCache(bytes int64) *BlockCache {
	return &BlockCache{c: pebble.NewCache(bytes), bytes: bytes}
}

// Bytes returns the cache's bound.
func (b *BlockCache) Bytes() int64 { return b.bytes }

// Close releases the creator's hold on the cache; stores still open with
// it keep theirs until they close.
func (b *BlockCache) Close() { b.c.Unref() }

// closedErr is ErrClosed, named with the store's path and what was tried.
func (s *Store) closedErr(doing string) error {
	return fmt.Errorf("%s %s: %w", doing, s.path, ErrClosed)
}

// OpenOptions tune Open.
type OpenOptions struct {
	// ReadOnly opens the store for offline inspection.
	ReadOnly bool
	// BlockCache is the block cache to use; nil means one of CacheSize for
	// this store alone.
	BlockCache *BlockCache
	// CacheSize is the size in bytes of the store's own block cache when
	// BlockCache is nil; 0 means 8 MiB.
	CacheSize int64
	// BulkLoad opens the store for filling an empty store with many
	// batches of keys in no order (a full restore): no automatic
	// compactions and no write stall on level 0, so each batch is written
	// once to a table, and CompactAll then merges them in one pass instead
	// of the many rewrites a growing tree of random keys costs. Reopen the
	// store without it afterwards.
	BulkLoad bool
}

// Open opens (creating unless read-only) the Pebble database at path. A
// store open already, in this process or another, is ErrStoreLocked.
func Open(path string, log *zap.Logger, o OpenOptions) (_ *Store, err error) {
	// A symbolic link where a store goes would make Pebble write (or, read
	// only, read) wherever it points.
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("opening store %s: %w", path, ErrSymlink)
	}
	claim, err := claimStore(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			releaseStore(claim)
		}
	}()
	if o.CacheSize == 0 {
		o.CacheSize = 8 << 20
	}
	var cache *pebble.Cache
	if o.BlockCache != nil {
		cache = o.BlockCache.c
	} else {
		cache = pebble.NewCache(o.CacheSize)
		defer cache.Unref() // the database holds its own reference
	}
	opts := &pebble.Options{
		Cache:              cache,
		ReadOnly:           o.ReadOnly,
		ErrorIfNotExists:   o.ReadOnly,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{log.Sugar()},
		// Pebble's default treats corruption as fatal to the process; here
		// it is an error of this store's reads, which its task handles by
		// quarantining the store and restoring it from the changelog.
		EventListener: &pebble.EventListener{
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				log.Error("Store corruption detected", zap.String("path", info.Path), zap.Error(info.Details))
			},
		},
	}
	// A bloom filter in every table: the first event of a product the
	// store does not hold (every event of a new product set) would
	// otherwise read an index and a data block of each level to learn it.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	// A growing state is random inserts: every new product lands in every
	// level's key range. Larger memtables and a deeper level 0 write each
	// product fewer times on its way down (level 0 is merged into the
	// level below once per 16 flushes instead of 4): at 1M new products
	// per store the process's CPU per event fell by a third. The memtables
	// are outside the Go heap: 16 MiB per store, and one more while one is
	// flushed. (A bulk load keeps its own settings, below.)
	if !o.BulkLoad {
		opts.MemTableSize = 16 << 20
		opts.L0CompactionThreshold = 16
		opts.L0StopWritesThreshold = 64
	}
	if o.BulkLoad {
		opts.DisableAutomaticCompactions = true
		opts.L0CompactionThreshold = math.MaxInt32
		opts.L0CompactionFileThreshold = math.MaxInt32
		opts.L0StopWritesThreshold = math.MaxInt32
	}
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("opening store %s: not a directory: %w", path, ErrCorrupt)
	}
	_, markerErr := os.Stat(filepath.Join(path, cleanMarker))
	crashed := markerErr != nil
	db, err := openPebble(path, opts)
	if err != nil {
		if errors.Is(err, syscall.EAGAIN) {
			// Pebble's lock (fcntl) is held by another process.
			return nil, fmt.Errorf("opening store %s: %w (by another process): %w", path, ErrStoreLocked, err)
		}
		if o.ReadOnly || !damaged(err) {
			// Out of descriptors, disk full, an I/O error, no permission:
			// the store may be intact, and quarantining it would cost a
			// full restore. The task retries with its backoff.
			return nil, fmt.Errorf("opening store %s: %w", path, err)
		}
		return nil, fmt.Errorf("opening store %s: %w: %w", path, ErrCorrupt, err)
	}
	s := &Store{path: path, readOnly: o.ReadOnly, opts: opts, claim: claim}
	s.mu.db = db
	if !o.ReadOnly {
		_ = os.Remove(filepath.Join(path, cleanMarker))
		removeBulkLeftovers(path)
	}
	if crashed && !o.ReadOnly {
		// After a crash, read every block once: a checksum failure found
		// now costs a restore, found later it would stop the task.
		if _, _, err := s.Count(); err != nil {
			_ = db.Close()
			if !damaged(err) {
				return nil, fmt.Errorf("verifying store %s: %w", path, err)
			}
			return nil, fmt.Errorf("verifying store %s: %w: %w", path, ErrCorrupt, err)
		}
	}
	return s, nil
}

// errPebblePanic marks a panic inside Pebble's open (it panics on some
// corrupt files).
var errPebblePanic = errors.New("pebble panicked")

// damaged reports whether err, from opening or reading a store, means its
// files are damaged: Pebble's corruption errors (a malformed MANIFEST or
// OPTIONS file, a checksum mismatch), a panic inside Pebble, a file the
// MANIFEST names that is missing, or a table whose size differs from the
// MANIFEST's (Pebble's consistency check marks neither as corruption), or
// files without the markers that name the current MANIFEST and format
// (ErrDBNotPristine). Any other error (EMFILE, ENOSPC, EIO, EACCES) says
// nothing about the files.
func damaged(err error) bool {
	return pebble.IsCorruptionError(err) || errors.Is(err, errPebblePanic) || errors.Is(err, pebble.ErrDBNotPristine) ||
		errors.Is(err, fs.ErrNotExist) || strings.Contains(err.Error(), "object size mismatch")
}

// openPebble opens the database, turning a panic inside Pebble (it panics
// on some corrupt files) into an error.
func openPebble(path string, opts *pebble.Options) (db *pebble.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errPebblePanic, r)
		}
	}()
	return pebble.Open(path, opts)
}

// Path returns the store's directory.
func (s *Store) Path() string { return s.path }

// Get returns the entry of product, and false when the store has none.
func (s *Store) Get(product string) (Entry, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, ErrClosed)
	}
	v, closer, err := s.mu.db.Get(dataKey(product))
	if errors.Is(err, pebble.ErrNotFound) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, err)
	}
	defer closer.Close()
	e, err := decodeEntry(v)
	if err != nil {
		return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, err)
	}
	return e, true, nil
}

// Lookup is Get for the goroutine that writes the store, on the hot path:
// it seeks one iterator kept between writes, with the bloom filters of every
// level (Get skips the last level's, so each product the store does not
// hold costs an index and a data block there), and copies nothing but the
// entry.
func (s *Store) Lookup(product []byte) (Entry, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, ErrClosed)
	}
	l := &s.lookup
	l.Lock()
	defer l.Unlock()
	if l.it == nil {
		it, err := s.mu.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
		if err != nil {
			return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, err)
		}
		l.it = it
	}
	l.key = append(append(l.key[:0], dataPrefix), product...)
	if !l.it.SeekPrefixGE(l.key) {
		if err := l.it.Error(); err != nil {
			return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, err)
		}
		return Entry{}, false, nil
	}
	v, err := l.it.ValueAndErr()
	if err != nil {
		return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, err)
	}
	e, err := decodeEntry(v)
	if err != nil {
		return Entry{}, false, fmt.Errorf("reading %q from %s: %w", product, s.path, err)
	}
	return e, true, nil
}

// ReleaseLookup closes Lookup's iterator, which pins the memtables and
// tables it saw (their disk space after compactions): writes and Close call
// it, and the owner at the end of a cycle that wrote nothing.
func (s *Store) ReleaseLookup() error {
	l := &s.lookup
	l.Lock()
	defer l.Unlock()
	if l.it == nil {
		return nil
	}
	err := l.it.Close()
	l.it = nil
	return err
}

// Checkpoint returns the stored checkpoint, and false when there is none.
func (s *Store) Checkpoint() (Checkpoint, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return Checkpoint{}, false, s.closedErr("reading checkpoint of")
	}
	v, closer, err := s.mu.db.Get(checkpointKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("reading checkpoint of %s: %w", s.path, err)
	}
	defer closer.Close()
	cp, err := decodeCheckpoint(v)
	return cp, err == nil, err
}

// Apply writes updates and the checkpoint in one atomic batch, synced to
// disk. Pebble buffers unsynced WAL writes in the process, so without the
// sync a SIGKILL would lose the latest batches (data and checkpoint together:
// the totals would stay exact, but the next start would restore more of the
// changelog than the tail since the last commit). One sync per commit cycle
// and per restored fetch is cheap next to the produce round trip.
func (s *Store) Apply(updates []Update, cp Checkpoint) error {
	return s.apply(updates, cp, nil, pebble.Sync)
}

// ApplyWith is Apply with the writes of window sizes in the same batch:
// the totals and the windows of one cycle are stored together or not at
// all.
func (s *Store) ApplyWith(updates []Update, cp Checkpoint, ws []WindowWrite) error {
	return s.apply(updates, cp, ws, pebble.Sync)
}

// ApplyUnsynced is Apply without the sync: a crash may lose the latest
// batches, each with its checkpoint (a batch is atomic in Pebble's log), so
// the store stays consistent and only falls behind. For a standby copy,
// which the changelog can always bring forward again; Close syncs.
func (s *Store) ApplyUnsynced(updates []Update, cp Checkpoint) error {
	return s.apply(updates, cp, nil, pebble.NoSync)
}

func (s *Store) apply(updates []Update, cp Checkpoint, ws []WindowWrite, opts *pebble.WriteOptions) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return s.closedErr("writing batch to")
	}
	// The keys and values are encoded in the batch's own buffer
	// (deferred ops), sized once for the whole cycle: a cycle of 100k
	// products allocated 200k small slices and grew the buffer by copies.
	size := 64
	for _, u := range updates {
		size += batchRecordBytes(1+len(u.Product), 8+u.Entry.Offsets.EncodedLen())
	}
	b := s.mu.db.NewBatchWithSize(size)
	defer b.Close()
	for _, u := range updates {
		if err := putUpdate(b, u); err != nil {
			return fmt.Errorf("writing batch to %s: %w", s.path, err)
		}
	}
	if err := b.Set(checkpointKey, encodeCheckpoint(cp), nil); err != nil {
		return fmt.Errorf("writing batch to %s: %w", s.path, err)
	}
	if err := appendWindows(b, ws); err != nil {
		return fmt.Errorf("writing batch to %s: %w", s.path, err)
	}
	if err := b.Commit(opts); err != nil {
		return fmt.Errorf("committing batch to %s: %w", s.path, err)
	}
	return s.ReleaseLookup()
}

// batchRecordBytes bounds what a set of a key and a value of these lengths
// takes in a Pebble batch: its kind, two uvarint lengths and the bytes.
func batchRecordBytes(keyLen, valueLen int) int {
	return 1 + 2*binary.MaxVarintLen32 + keyLen + valueLen
}

// putUpdate adds u to b, its key and entry encoded in place in the batch.
func putUpdate(b *pebble.Batch, u Update) error {
	if u.Delete {
		op := b.DeleteDeferred(1 + len(u.Product))
		op.Key[0] = dataPrefix
		copy(op.Key[1:], u.Product)
		return op.Finish()
	}
	n := 8 + u.Entry.Offsets.EncodedLen()
	op := b.SetDeferred(1+len(u.Product), n)
	op.Key[0] = dataPrefix
	copy(op.Key[1:], u.Product)
	binary.BigEndian.PutUint64(op.Value, uint64(u.Entry.Total))
	if got := u.Entry.Offsets.AppendEncode(op.Value[8:8:n]); len(got) != n-8 {
		return fmt.Errorf("entry of %q encodes to %d bytes of offsets, not the %d it said", u.Product, len(got), n-8)
	}
	return op.Finish()
}

// CompactAll flushes the memtable and compacts the whole store into the
// last level, in parallel where Pebble can split the work: the end of a
// BulkLoad.
func (s *Store) CompactAll(ctx context.Context) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return s.closedErr("compacting")
	}
	if err := s.mu.db.Flush(); err != nil {
		return fmt.Errorf("flushing %s: %w", s.path, err)
	}
	if err := s.mu.db.Compact(ctx, []byte{0}, []byte{0xff}, true); err != nil {
		return fmt.Errorf("compacting %s: %w", s.path, err)
	}
	return nil
}

// DiskUsage returns the bytes the store takes on disk (its tables, logs
// and manifests), 0 once closed.
func (s *Store) DiskUsage() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return 0
	}
	return int64(s.mu.db.Metrics().DiskSpaceUsage())
}

// Total is one product's total, as listed by Scan.
type Total struct {
	Product string `json:"product"`
	Total   int64  `json:"total"`
}

// Scan returns up to limit products sorted by name, starting after the
// product after ("" starts at the first).
func (s *Store) Scan(after string, limit int) ([]Total, error) {
	lower := dataKey(after)
	if after != "" {
		lower = append(lower, 0)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return nil, s.closedErr("scanning")
	}
	it, err := s.mu.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: []byte{dataEnd}})
	if err != nil {
		return nil, fmt.Errorf("scanning %s: %w", s.path, err)
	}
	var out []Total
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("scanning %s: %w", s.path, err)
		}
		e, err := decodeEntry(v)
		if err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("scanning %s: %w", s.path, err)
		}
		out = append(out, Total{Product: string(it.Key()[1:]), Total: e.Total})
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("scanning %s: %w", s.path, err)
	}
	return out, nil
}

// Each calls fn with every product's total in product order, reading
// chunk products per Scan (each under the store's read lock, released
// between chunks: a write waits at most one chunk). It stops at fn's first
// error and returns it.
func (s *Store) Each(chunk int, fn func(Total) error) error {
	for after := ""; ; {
		page, err := s.Scan(after, chunk)
		if err != nil {
			return err
		}
		for _, t := range page {
			if err := fn(t); err != nil {
				return err
			}
		}
		if len(page) < chunk {
			return nil
		}
		after = page[len(page)-1].Product
	}
}

// ProductIter lists the products a store held when the iterator was made:
// writes after that do not show in it (a Pebble iterator is a point-in-time
// view). It pins what it sees, and must be closed before the store is.
// Used by one goroutine at a time.
type ProductIter struct {
	it   *pebble.Iterator
	path string
}

// Products returns an iterator over the store's products as they are now.
func (s *Store) Products() (*ProductIter, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return nil, s.closedErr("listing the products of")
	}
	it, err := s.mu.db.NewIter(&pebble.IterOptions{LowerBound: []byte{dataPrefix}, UpperBound: []byte{dataEnd}})
	if err != nil {
		return nil, fmt.Errorf("listing the products of %s: %w", s.path, err)
	}
	return &ProductIter{it: it, path: s.path}, nil
}

// Each calls fn with every product, in order; the slice is valid during the
// call only. It stops early, with ctx's error, once ctx is done.
func (p *ProductIter) Each(ctx context.Context, fn func(product []byte)) error {
	n := 0
	for ok := p.it.First(); ok; ok = p.it.Next() {
		if n++; n%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		fn(p.it.Key()[1:])
	}
	if err := p.it.Error(); err != nil {
		return fmt.Errorf("listing the products of %s: %w", p.path, err)
	}
	return nil
}

// Close releases what the iterator pins.
func (p *ProductIter) Close() error { return p.it.Close() }

// Count returns the number of products and the sum of their totals.
func (s *Store) Count() (products int64, sum int64, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return 0, 0, s.closedErr("counting")
	}
	it, err := s.mu.db.NewIter(&pebble.IterOptions{LowerBound: []byte{dataPrefix}, UpperBound: []byte{dataEnd}})
	if err != nil {
		return 0, 0, fmt.Errorf("counting %s: %w", s.path, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return 0, 0, fmt.Errorf("counting %s: %w", s.path, err)
		}
		if len(v) >= 8 {
			sum += int64(binary.BigEndian.Uint64(v))
		}
		products++
	}
	if err := it.Close(); err != nil {
		return 0, 0, fmt.Errorf("counting %s: %w", s.path, err)
	}
	return products, sum, nil
}

// Close syncs and closes the database, after the reads and writes under way;
// those that come after it return ErrClosed. Closing again returns ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	db := s.mu.db
	if db == nil {
		return s.closedErr("closing store")
	}
	s.mu.db = nil
	errs := []error{s.ReleaseLookup()}
	if !s.readOnly {
		// A flushed memtable makes the next open quick: no WAL to replay.
		errs = append(errs, db.Flush())
	}
	errs = append(errs, db.Close())
	// Pebble's lock is released by its Close, failed or not.
	releaseStore(s.claim)
	if !s.readOnly && errors.Join(errs...) == nil {
		if f, err := os.Create(filepath.Join(s.path, cleanMarker)); err == nil {
			_ = f.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing store %s: %w", s.path, err)
	}
	return nil
}

// pebbleLogger routes Pebble's logs to zap: its chatty info lines at debug.
// Fatalf panics instead of exiting so the owner of the store can recover.
type pebbleLogger struct{ s *zap.SugaredLogger }

func (l pebbleLogger) Infof(format string, args ...any)  { l.s.Debugf("pebble: "+format, args...) }
func (l pebbleLogger) Errorf(format string, args ...any) { l.s.Errorf("pebble: "+format, args...) }
func (l pebbleLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("pebble: "+format, args...))
}
