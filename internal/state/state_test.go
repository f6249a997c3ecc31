package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

var inputID = [16]byte{0xee, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

func TestStoreApplyGetScanCheckpoint(t *testing.T) {
	// Scenario: totals and their checkpoint are written together, read back, listed in pages, and survive a reopen.
	path := t.TempDir()
	s, err := Open(path, zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Checkpoint(); ok || err != nil {
		t.Fatalf("new store has a checkpoint: %v %v", ok, err)
	}
	var ups []Update
	for i := 0; i < 25; i++ {
		ups = append(ups, Update{Product: fmt.Sprintf("p%02d", i), Entry: Entry{Total: int64(i * 10), Offsets: sales.Offsets{TopicID: inputID, Parts: []sales.PartitionOffset{{Partition: 1, Offset: int64(i)}}}}})
	}
	cp := Checkpoint{ChangelogOffset: 25, InputOffset: 40, ChangelogTopicID: [16]byte{1, 2, 3}}
	if err := s.Apply(ups, cp); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]Update{{Product: "p03", Delete: true}}, Checkpoint{ChangelogOffset: 26, InputOffset: 40, ChangelogTopicID: cp.ChangelogTopicID}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path, zap.NewNop(), OpenOptions{ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, ok, err := s.Checkpoint()
	if err != nil || !ok || got.ChangelogOffset != 26 || got.InputOffset != 40 || got.ChangelogTopicID != cp.ChangelogTopicID {
		t.Fatalf("checkpoint %+v %v %v", got, ok, err)
	}
	e, ok, err := s.Get("p07")
	if err != nil || !ok || e.Total != 70 || !e.Offsets.Reflects(inputID, 1, 7) || e.Offsets.Reflects(inputID, 1, 8) || e.Offsets.TopicID != inputID {
		t.Fatalf("p07 = %+v %v %v", e, ok, err)
	}
	if _, ok, _ := s.Get("p03"); ok {
		t.Fatal("deleted product still there")
	}
	var all []Total
	for after := ""; ; {
		page, err := s.Scan(after, 10)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 10 {
			break
		}
		after = page[len(page)-1].Product
	}
	if len(all) != 24 || all[0].Product != "p00" || all[23].Product != "p24" {
		t.Fatalf("scan got %d products: %v", len(all), all)
	}
	n, sum, err := s.Count()
	if err != nil || n != 24 || sum != 3000-30 {
		t.Fatalf("count %d sum %d err %v", n, sum, err)
	}
}

func TestDirLockAndProcessID(t *testing.T) {
	// Scenario: a second opener of a state dir fails naming the lock file and holder; the process id is stable.
	root := t.TempDir()
	d, err := OpenDir(root, "app")
	if err != nil {
		t.Fatal(err)
	}
	id := d.ProcessID()
	if len(id) != 36 {
		t.Fatalf("process id %q", id)
	}
	_, err = OpenDir(root, "app")
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	for _, want := range []string{root + "/app/.lock", fmt.Sprintf("pid=%d", os.Getpid()), "host="} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("lock error lacks %q: %v", want, err)
		}
	}
	if err := os.MkdirAll(d.TaskPath(2), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.TaskPath(0), 0o755); err != nil {
		t.Fatal(err)
	}
	if ps, err := d.Tasks(); err != nil || len(ps) != 2 || ps[0] != 0 || ps[1] != 2 {
		t.Fatalf("tasks %v %v", ps, err)
	}
	if err := d.Wipe(2); err != nil {
		t.Fatal(err)
	}
	if ps, _ := d.Tasks(); len(ps) != 1 {
		t.Fatalf("after wipe: %v", ps)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := OpenDir(root, "app")
	if err != nil {
		t.Fatalf("reopen after close: %v", err)
	}
	defer d2.Close()
	if d2.ProcessID() != id {
		t.Fatalf("process id changed: %s -> %s", id, d2.ProcessID())
	}
}

func TestEntryEncodings(t *testing.T) {
	// Scenario: an entry keeps its total and offsets with the input topic's id; an entry written
	// before offsets carried an id (legacy bytes) still reads, with a zero id.
	for _, tc := range []struct {
		name    string
		e       Entry
		wantLen int
	}{
		{"no offsets", Entry{Total: -5}, 8},
		{"legacy offsets", Entry{Total: 70, Offsets: sales.Offsets{Parts: []sales.PartitionOffset{{Partition: 1, Offset: 7}}}}, 8 + 12},
		{"offsets with topic id", Entry{Total: 70, Offsets: sales.Offsets{TopicID: inputID, Parts: []sales.PartitionOffset{{Partition: 1, Offset: 7}, {Partition: 2, Offset: 3}}}}, 8 + 17 + 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeEntry(tc.e)
			if len(b) != tc.wantLen {
				t.Fatalf("encoded %d bytes, want %d: %x", len(b), tc.wantLen, b)
			}
			got, err := decodeEntry(b)
			if err != nil || got.Total != tc.e.Total || got.Offsets.TopicID != tc.e.Offsets.TopicID || !slices.Equal(got.Offsets.Parts, tc.e.Offsets.Parts) {
				t.Fatalf("decodeEntry = %+v, %v; want %+v", got, err, tc.e)
			}
		})
	}
	legacy := []byte{0, 0, 0, 0, 0, 0, 0, 70, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7}
	e, err := decodeEntry(legacy)
	if err != nil || e.Total != 70 || e.Offsets.TopicID != ([16]byte{}) || !e.Offsets.Reflects(inputID, 1, 7) || e.Offsets.Reflects(inputID, 1, 8) {
		t.Fatalf("legacy entry = %+v, %v", e, err)
	}
	if _, err := decodeEntry(append(legacy, 0, 0, 0)); !errors.Is(err, sales.ErrBadOffsets) {
		t.Fatalf("entry with a torn offsets tail: %v", err)
	}
}

func TestReadsRacingClose(t *testing.T) {
	// Scenario: HTTP reads race the store's Close (a revoked task); none reaches the closed
	// database or panics, and every call after Close returns ErrClosed.
	s, err := Open(t.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ups []Update
	for i := 0; i < 50; i++ {
		ups = append(ups, Update{Product: fmt.Sprintf("p%02d", i), Entry: Entry{Total: int64(i)}})
	}
	if err := s.Apply(ups, Checkpoint{ChangelogOffset: 50}); err != nil {
		t.Fatal(err)
	}

	// Each reader loops until it has made a few calls after Close returned,
	// bounded so that a hang cannot outlast the test's timeout. Close comes
	// once every reader is busy, so it overlaps their calls.
	const readers, maxRounds, afterClose = 6, 20000, 5
	var closed atomic.Bool
	var calls atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, readers)
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := 0
			for i := 0; i < maxRounds && seen < afterClose; i++ {
				wasClosed := closed.Load() // read before the call: Close had returned
				var err error
				switch i % 4 {
				case 0, 1:
					_, _, err = s.Get(fmt.Sprintf("p%02d", i%50))
				case 2:
					_, err = s.Scan("", 10)
				case 3:
					_, _, err = s.Checkpoint()
				}
				calls.Add(1)
				switch {
				case err == nil && wasClosed:
					errc <- fmt.Errorf("call %d after Close succeeded", i)
					return
				case err != nil && !errors.Is(err, ErrClosed):
					errc <- fmt.Errorf("call %d: %w", i, err)
					return
				}
				if wasClosed {
					seen++
				}
			}
		}()
	}
	harness.WaitFor(t, 10*time.Second, "the readers to be busy", harness.Holds(func() bool { return calls.Load() >= readers*20 }))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}

	_, _, err = s.Get("p01")
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), s.Path()) {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := s.Scan("", 10); !errors.Is(err, ErrClosed) {
		t.Errorf("Scan after Close: %v", err)
	}
	if _, _, err := s.Count(); !errors.Is(err, ErrClosed) {
		t.Errorf("Count after Close: %v", err)
	}
	if _, _, err := s.Checkpoint(); !errors.Is(err, ErrClosed) {
		t.Errorf("Checkpoint after Close: %v", err)
	}
	if err := s.Apply(ups[:1], Checkpoint{ChangelogOffset: 51}); !errors.Is(err, ErrClosed) {
		t.Errorf("Apply after Close: %v", err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

func TestLookupSeesEveryWrite(t *testing.T) {
	// Scenario: the owner's Lookup agrees with Get for products the store holds and does not
	// hold, sees each write as soon as Apply returns (its iterator is dropped by writes), works
	// on a shared block cache, and returns ErrClosed after Close.
	bc := NewBlockCache(4 << 20)
	defer bc.Close()
	s, err := Open(t.TempDir(), zap.NewNop(), OpenOptions{BlockCache: bc})
	if err != nil {
		t.Fatal(err)
	}
	check := func(product string, wantTotal int64, wantOK bool) {
		t.Helper()
		e, ok, err := s.Lookup([]byte(product))
		g, gok, gerr := s.Get(product)
		if err != nil || gerr != nil || ok != wantOK || gok != wantOK || e.Total != wantTotal || g.Total != wantTotal {
			t.Fatalf("%s: Lookup = %d, %v, %v; Get = %d, %v, %v; want %d, %v", product, e.Total, ok, err, g.Total, gok, gerr, wantTotal, wantOK)
		}
	}
	check("p1", 0, false)
	for round := int64(1); round <= 3; round++ {
		ups := make([]Update, 0, 1000)
		for i := range 1000 {
			ups = append(ups, Update{Product: fmt.Sprintf("p%d", i), Entry: Entry{Total: round * int64(i)}})
		}
		if err := s.Apply(ups, Checkpoint{ChangelogOffset: round}); err != nil {
			t.Fatal(err)
		}
		check("p1", round, true)
		check("p999", round*999, true)
		check("p1000", 0, false)
	}
	if err := s.Apply([]Update{{Product: "p1", Delete: true}}, Checkpoint{ChangelogOffset: 4}); err != nil {
		t.Fatal(err)
	}
	check("p1", 0, false)
	if err := s.ReleaseLookup(); err != nil {
		t.Fatal(err)
	}
	check("p2", 6, true) // a new iterator after the release
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Lookup([]byte("p2")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lookup after Close: %v, want ErrClosed", err)
	}
}

func TestWipeInterruptedLeavesNoHalfStore(t *testing.T) {
	// Scenario: a process dies in the middle of wiping a task's store (the directory already
	// moved aside, half of its files deleted). The task's directory is gone from where the task
	// looks, so the next start finds no checkpoint and no leftover key (it restores from the
	// changelog), and the next OpenDir deletes what was left aside.
	root := t.TempDir()
	d, err := OpenDir(root, "app")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(d.TaskPath(1), zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]Update{{Product: "voided", Entry: Entry{Total: 7}}}, Checkpoint{ChangelogOffset: 5, InputOffset: 3}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	aside, err := d.moveToTrash(1)
	if err != nil || aside == "" {
		t.Fatalf("moving aside: %q, %v", aside, err)
	}
	// The crash: some of the store's files deleted, the rest left.
	ents, err := os.ReadDir(aside)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range ents {
		if i%2 == 0 {
			_ = os.RemoveAll(filepath.Join(aside, e.Name()))
		}
	}
	_ = d.Close()

	d, err = OpenDir(root, "app")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := os.Stat(filepath.Join(root, "app", trashDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the trash survived the next OpenDir: %v", err)
	}
	if ps, err := d.Tasks(); err != nil || len(ps) != 0 {
		t.Fatalf("tasks after the interrupted wipe: %v, %v", ps, err)
	}
	s, err = Open(d.TaskPath(1), zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, found, err := s.Checkpoint(); err != nil || found {
		t.Fatalf("checkpoint after the interrupted wipe: found %v, %v", found, err)
	}
	if _, ok, err := s.Get("voided"); err != nil || ok {
		t.Fatalf("a product of the wiped store survived: %v, %v", ok, err)
	}
}

func TestStateDirIsPrivateAndFollowsNoLink(t *testing.T) {
	// Scenario: the state dir is the process user's alone (0700, the lock and metadata 0600);
	// a symbolic link planted as the lock file, the metadata's temporary file or a task's store
	// is refused with an error naming it, and nothing is written where it points; an
	// application.id that is not one path segment is refused.
	root := t.TempDir()
	d, err := OpenDir(root, "app")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		filepath.Join(root, "app"):                   0o700,
		filepath.Join(root, "app", lockFileName):     0o600,
		filepath.Join(root, "app", metadataFileName): 0o600,
	} {
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	_ = d.Close()

	target := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(target, []byte("do not touch"), 0o644); err != nil {
		t.Fatal(err)
	}
	untouched := func() {
		t.Helper()
		if b, _ := os.ReadFile(target); string(b) != "do not touch" {
			t.Fatalf("the link's target was written: %q", b)
		}
	}
	plant := func(dir, name string) {
		t.Helper()
		p := filepath.Join(dir, name)
		_ = os.RemoveAll(p)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}

	// The lock file.
	plant(filepath.Join(root, "app"), lockFileName)
	if _, err := OpenDir(root, "app"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("OpenDir with the lock file a link: %v, want ErrSymlink", err)
	}
	untouched()
	_ = os.Remove(filepath.Join(root, "app", lockFileName))

	// The process metadata's temporary file (written when the metadata is new).
	_ = os.Remove(filepath.Join(root, "app", metadataFileName))
	plant(filepath.Join(root, "app"), metadataFileName+".tmp")
	d, err = OpenDir(root, "app")
	if err != nil {
		t.Fatalf("OpenDir with a link as the metadata's temporary file: %v", err)
	}
	untouched()

	// A task's store.
	plant(d.path, "0_1")
	if _, err := Open(d.TaskPath(1), zap.NewNop(), OpenOptions{}); !errors.Is(err, ErrSymlink) {
		t.Fatalf("opening a store that is a link: %v, want ErrSymlink", err)
	}
	if _, err := Open(d.TaskPath(1), zap.NewNop(), OpenOptions{ReadOnly: true}); !errors.Is(err, ErrSymlink) {
		t.Fatalf("opening a store that is a link read-only: %v, want ErrSymlink", err)
	}
	untouched()
	_ = d.Close()

	// A state dir that is a link below state.dir.
	_ = os.RemoveAll(filepath.Join(root, "linked"))
	if err := os.Symlink(t.TempDir(), filepath.Join(root, "linked")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenDir(root, "linked"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("OpenDir on a linked application dir: %v, want ErrSymlink", err)
	}
	for _, id := range []string{"", ".", "..", "a/b", "../up"} {
		if _, err := OpenDir(root, id); err == nil {
			t.Errorf("OpenDir accepted application.id %q", id)
		}
	}
}
