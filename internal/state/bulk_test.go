package state

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
)

// bulkModel is what a store must hold after a stream of updates: the last
// update of each product, none for a deleted one.
type bulkModel map[string]Entry

func (m bulkModel) apply(ups []Update) {
	for _, u := range ups {
		if u.Delete {
			delete(m, u.Product)
		} else {
			m[u.Product] = u.Entry
		}
	}
}

// checkStore asserts that s holds exactly model and the checkpoint cp.
func checkStore(t *testing.T, s *Store, model bulkModel, cp Checkpoint) {
	t.Helper()
	got, ok, err := s.Checkpoint()
	if err != nil || !ok || got != cp {
		t.Fatalf("checkpoint %+v %v %v, want %+v", got, ok, err, cp)
	}
	var sum int64
	for p, want := range model {
		e, ok, err := s.Get(p)
		if err != nil || !ok || e.Total != want.Total || e.Offsets.TopicID != want.Offsets.TopicID || !slices.Equal(e.Offsets.Parts, want.Offsets.Parts) {
			t.Fatalf("%s = %+v %v %v, want %+v", p, e, ok, err, want)
		}
		sum += want.Total
	}
	n, gotSum, err := s.Count()
	if err != nil || n != int64(len(model)) || gotSum != sum {
		t.Fatalf("store holds %d products summing to %d (%v), want %d summing to %d", n, gotSum, err, len(model), sum)
	}
}

// randomUpdates are n updates over products products, each a new total
// or, one in ten, a deletion.
func randomUpdates(rng *rand.Rand, n, products int) []Update {
	ups := make([]Update, n)
	for i := range ups {
		p := "p" + strconv.Itoa(rng.IntN(products))
		if rng.IntN(10) == 0 {
			ups[i] = Update{Product: p, Delete: true}
			continue
		}
		ups[i] = Update{Product: p, Entry: Entry{Total: int64(rng.IntN(1000)), Offsets: sales.Offsets{TopicID: inputID,
			Parts: []sales.PartitionOffset{{Partition: int32(rng.IntN(3)), Offset: int64(i)}}}}}
	}
	return ups
}

func TestBulkLoadKeepsTheLastUpdateOfEachProduct(t *testing.T) {
	// Scenario: an empty store is bulk loaded with 200,000 updates over 30,000 products (several per
	// product, one in ten a deletion) in fetches of 1,000 (or all in one), under budgets that spill many sorted runs or
	// none, merged as one key range or several at once; it then holds the last update of each product and the checkpoint, across a reopen, and takes
	// writes as any store does.
	for _, tc := range []struct {
		name     string
		budget   int64
		manyRuns bool
		procs    int  // GOMAXPROCS: the key ranges Finish writes at once
		fetch    int  // updates per Add; 0: 1,000
		encoded  bool // one AddEncoded per update, as a restore adds
	}{
		{name: "many runs", budget: 256 << 10, manyRuns: true, procs: 2},
		{name: "many runs in four ranges", budget: 256 << 10, manyRuns: true, procs: 4},
		{name: "many runs, added encoded", budget: 256 << 10, manyRuns: true, procs: 2, encoded: true},
		// One fetch bringing every update (a fast broker, a large fetch)
		// spills as many runs: the budget holds within an Add too.
		{name: "many runs from one fetch", budget: 256 << 10, manyRuns: true, procs: 2, fetch: 200_000},
		{name: "one budget", budget: 64 << 20, procs: 1},
		{name: "one budget in two ranges", budget: 64 << 20, procs: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(tc.procs))
			path := t.TempDir()
			s, err := Open(path, zap.NewNop(), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			l, err := s.BulkLoad(BulkOptions{Budget: NewBulkBudget(tc.budget)})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			rng := rand.New(rand.NewPCG(3, 4))
			ups := randomUpdates(rng, 200_000, 30_000)
			model := bulkModel{}
			fetch := cmp.Or(tc.fetch, 1000)
			for i := 0; i < len(ups); i += fetch {
				if tc.encoded {
					for _, u := range ups[i : i+fetch] {
						if err := l.AddEncoded([]byte(u.Product), u.Entry.Total, u.Entry.Offsets.AppendEncode(nil), u.Delete); err != nil {
							t.Fatal(err)
						}
					}
				} else if err := l.Add(ups[i : i+fetch]); err != nil {
					t.Fatal(err)
				}
				model.apply(ups[i : i+fetch])
			}
			cp := Checkpoint{ChangelogOffset: 200_000, InputOffset: -1, ChangelogTopicID: [16]byte{7}}
			st, err := l.Finish(context.Background(), cp)
			if err != nil {
				t.Fatal(err)
			}
			if st.Updates != 200_000 || st.Products != int64(len(model)) || st.Tables < tc.procs {
				t.Fatalf("stats %+v, want 200000 updates, %d products", st, len(model))
			}
			if tc.manyRuns && st.Runs < 10 || !tc.manyRuns && st.Runs != 0 {
				t.Fatalf("%d runs spilled under a budget of %d bytes", st.Runs, tc.budget)
			}
			if _, err := os.Stat(filepath.Join(path, bulkDirName)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the load's runs are left in the store: %v", err)
			}
			// Every key written once, straight into the last level.
			m := s.mu.db.Metrics()
			for level, lm := range m.Levels {
				if want := int64(0); level == len(m.Levels)-1 && lm.TablesCount != int64(st.Tables) || level < len(m.Levels)-1 && lm.TablesCount != want {
					t.Fatalf("L%d holds %d tables after a load of %d tables", level, lm.TablesCount, st.Tables)
				}
			}
			checkStore(t, s, model, cp)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if s, err = Open(path, zap.NewNop(), OpenOptions{}); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			checkStore(t, s, model, cp)
			more := randomUpdates(rng, 5000, 40_000)
			model.apply(more)
			cp.ChangelogOffset += 5000
			if err := s.Apply(more, cp); err != nil {
				t.Fatal(err)
			}
			checkStore(t, s, model, cp)
		})
	}
}

func TestBulkLoadOfNothingWritesTheCheckpoint(t *testing.T) {
	// Scenario: a bulk load of a changelog holding only deletions, and one of nothing at all, leave an
	// empty store with the checkpoint.
	for _, ups := range [][]Update{nil, {{Product: "a", Delete: true}, {Product: "b", Delete: true}}} {
		s, err := Open(t.TempDir(), zap.NewNop(), OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.BulkLoad(BulkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Add(ups); err != nil {
			t.Fatal(err)
		}
		cp := Checkpoint{ChangelogOffset: 2, InputOffset: -1}
		if _, err := l.Finish(context.Background(), cp); err != nil {
			t.Fatal(err)
		}
		checkStore(t, s, bulkModel{}, cp)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBulkLoadNeedsAnEmptyStore(t *testing.T) {
	// Scenario: a store holding a product refuses a bulk load (its tables would overlap the data).
	s, err := Open(t.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Apply([]Update{{Product: "a", Entry: Entry{Total: 1}}}, Checkpoint{ChangelogOffset: 1}); err != nil {
		t.Fatal(err)
	}
	if l, err := s.BulkLoad(BulkOptions{}); err == nil {
		l.Close()
		t.Fatal("bulk load of a store holding data began")
	}
}

func TestBulkLoadCutShortLeavesAnEmptyStore(t *testing.T) {
	// Scenario: a bulk load stops (the process dies) after spilling runs, or with its tables written
	// just before their ingestion: the store, reopened, holds no product and no checkpoint (it is
	// restored from the start again), the load's files are gone, and a new bulk load completes.
	for _, point := range []string{"after a spill", "before the ingestion"} {
		t.Run(point, func(t *testing.T) {
			path := t.TempDir()
			s, err := Open(path, zap.NewNop(), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// The crash: at the hook, the store's files are copied as they
			// are (the image a SIGKILL leaves), and the load is abandoned.
			crashed := filepath.Join(t.TempDir(), "crashed")
			cut := errors.New("cut")
			crash := func() {
				if err := os.CopyFS(crashed, os.DirFS(path)); err != nil {
					t.Error(err)
				}
				_ = os.Remove(filepath.Join(crashed, cleanMarker))
				panic(cut)
			}
			o := BulkOptions{Budget: NewBulkBudget(128 << 10)}
			if point == "after a spill" {
				o.AfterSpill = func(runs int) {
					if runs == 3 {
						crash()
					}
				}
			} else {
				o.BeforeIngest = crash
			}
			l, err := s.BulkLoad(o)
			if err != nil {
				t.Fatal(err)
			}
			ups := randomUpdates(rand.New(rand.NewPCG(5, 6)), 50_000, 10_000)
			func() {
				defer func() {
					if r := recover(); r != cut {
						t.Fatalf("the load was not cut: %v", r)
					}
				}()
				for i := 0; i < len(ups); i += 1000 {
					if err := l.Add(ups[i : i+1000]); err != nil {
						t.Fatal(err)
					}
				}
				_, _ = l.Finish(context.Background(), Checkpoint{ChangelogOffset: 50_000})
			}()
			l.Close()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if entries, _ := os.ReadDir(filepath.Join(crashed, bulkDirName)); len(entries) == 0 {
				t.Fatal("the cut load left no files to clean up")
			}
			path = crashed
			s, err = Open(path, zap.NewNop(), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, ok, err := s.Checkpoint(); ok || err != nil {
				t.Fatalf("the cut load left a checkpoint (%v)", err)
			}
			if n, _, err := s.Count(); n != 0 || err != nil {
				t.Fatalf("the cut load left %d products (%v)", n, err)
			}
			if _, err := os.Stat(filepath.Join(path, bulkDirName)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the cut load's files are left in the store: %v", err)
			}
			l, err = s.BulkLoad(BulkOptions{Budget: NewBulkBudget(128 << 10)})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			model := bulkModel{}
			model.apply(ups)
			if err := l.Add(ups); err != nil {
				t.Fatal(err)
			}
			cp := Checkpoint{ChangelogOffset: 50_000, InputOffset: -1}
			if _, err := l.Finish(context.Background(), cp); err != nil {
				t.Fatal(err)
			}
			checkStore(t, s, model, cp)
		})
	}
}

func TestBulkLoadsShareTheBudget(t *testing.T) {
	// Scenario: loads under way together each take an equal share of one budget, and a load that ends
	// gives its share back.
	b := NewBulkBudget(64 << 20)
	var ls []*BulkLoad
	for range 4 {
		s, err := Open(t.TempDir(), zap.NewNop(), OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l, err := s.BulkLoad(BulkOptions{Budget: b})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	if got := b.share(); got != 16<<20 {
		t.Fatalf("share of 4 loads = %d, want %d", got, 16<<20)
	}
	ls[0].Close()
	ls[1].Close()
	if got := b.share(); got != 32<<20 {
		t.Fatalf("share of 2 loads = %d, want %d", got, 32<<20)
	}
	ls[2].Close()
	ls[3].Close()
}

func TestBulkLoadOfWindowsBesideTheTotals(t *testing.T) {
	// Scenario: a store holding totals (and 24h windows) is bulk loaded with 100,000 1h window
	// updates over 2,000 products and 48 windows (one in ten a deletion), in fetches of 1,000,
	// under a budget that spills many runs: the 1h key space then holds the last update of each
	// window, read back by Fetch and Scan, the totals and the 24h windows are untouched, and the
	// load writes no checkpoint of the size (the caller does). A second load of the now non-empty
	// 1h key space is refused; one of the empty key space of another size is not.
	s, err := Open(t.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cp := Checkpoint{ChangelogOffset: 3, InputOffset: -1}
	if err := s.Apply([]Update{{Product: "p1", Entry: Entry{Total: 9}}}, cp); err != nil {
		t.Fatal(err)
	}
	day := s.Windows(24 * time.Hour)
	if err := s.ApplyWindows([]WindowWrite{{Windows: day, Updates: []WindowUpdate{{Product: "p1", Start: 0, Entry: Entry{Total: 9}}},
		Checkpoint: Checkpoint{ChangelogOffset: 1, InputOffset: -1}, StreamTime: 5}}, false); err != nil {
		t.Fatal(err)
	}
	hour := s.Windows(time.Hour)
	l, err := hour.BulkLoad(BulkOptions{Budget: NewBulkBudget(256 << 10)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	type key struct {
		product string
		start   int64
	}
	model := map[key]int64{}
	for range 100 {
		ups := make([]WindowUpdate, 1000)
		for i := range ups {
			u := WindowUpdate{Product: "p" + strconv.Itoa(rng.IntN(2000)), Start: int64(rng.IntN(48)) * 3_600_000}
			if rng.IntN(10) == 0 {
				u.Delete = true
				delete(model, key{u.Product, u.Start})
			} else {
				u.Entry.Total = int64(rng.IntN(1000))
				model[key{u.Product, u.Start}] = u.Entry.Total
			}
			ups[i] = u
		}
		if err := l.AddWindows(ups); err != nil {
			t.Fatal(err)
		}
	}
	st, err := l.FinishWindows(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Runs < 5 || st.Products != int64(len(model)) {
		t.Fatalf("stats %+v, want several runs and %d windows", st, len(model))
	}
	got := map[key]int64{}
	if err := hour.Each(func(wt WindowTotal) error { got[key{wt.Product, wt.Start}] = wt.Total; return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, model) {
		t.Fatalf("the 1h key space holds %d windows, want %d (equal: %v)", len(got), len(model), reflect.DeepEqual(got, model))
	}
	checked := 0
	for k, want := range model {
		if checked++; checked > 200 {
			break
		}
		ws, err := hour.Fetch(k.product, k.start, k.start)
		if err != nil || len(ws) != 1 || ws[0].Total != want {
			t.Fatalf("Fetch(%s, %d) = %v, %v; want %d", k.product, k.start, ws, err, want)
		}
	}
	if _, found, err := hour.Checkpoint(); err != nil || found {
		t.Fatalf("the load wrote a checkpoint of the size (%v, %v)", found, err)
	}
	if e, ok, err := s.Get("p1"); err != nil || !ok || e.Total != 9 {
		t.Fatalf("the totals after the load: p1 = %+v %v %v", e, ok, err)
	}
	if ws, err := day.Fetch("p1", 0, 0); err != nil || len(ws) != 1 || ws[0].Total != 9 {
		t.Fatalf("the 24h windows after the load: %v, %v", ws, err)
	}
	if again, err := hour.BulkLoad(BulkOptions{}); err == nil {
		again.Close()
		t.Fatal("a bulk load of the non-empty 1h key space began")
	}
	other, err := s.Windows(15 * time.Minute).BulkLoad(BulkOptions{})
	if err != nil {
		t.Fatalf("a bulk load of the empty 15m key space: %v", err)
	}
	other.Close()
}
