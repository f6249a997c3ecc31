package stream_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestARestartedTaskFiltersNewProductsAndLosesNoOldOne(t *testing.T) {
	// Scenario: an instance folds 30 products and stops. Restarted on its state dir (it
	// restores 0 records), each task starts on a store with data: while its listing of the
	// store's products is held, it learns the products it writes, and looks every other one
	// up. Events of the 30 old products and of 30 new ones fold exactly. Released, each task
	// logs that it listed its store's products (30 in all: the store as it was at the start,
	// not the new ones) and from then on skips the store for products it knows are not there.
	// Events of old products, of the products learned while held and of never seen ones
	// fold exactly, over HTTP and in the changelog: the filter never says "not there" for a
	// product the store holds. The entry cache is off, so that no product is found there.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		// No entry cache: every product not changed in the cycle is the
		// filter's to answer, or the store's.
		h.cfg.CacheMaxBytes = 0
		want := map[string]int64{}
		round := func(in *instance, prefix string, n int, value int64) {
			t.Helper()
			var recs []*kgo.Record
			for i := range n {
				p := fmt.Sprintf("%s%d", prefix, i)
				recs = append(recs, event(p, p, value))
				want[p] += value
			}
			h.produce(recs...)
			in.waitTotals(want)
		}
		in := h.start(h.cfg)
		in.waitReady()
		round(in, "old", 30, 10)
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		withData := map[int32]bool{}
		for i := range 30 {
			withData[sales.Partition([]byte(fmt.Sprintf("old%d", i)), 3)] = true
		}

		release := make(chan struct{})
		var held atomic.Int32
		in = h.startWith(h.cfg, stream.Knobs{BeforeProductListing: func(ctx context.Context, _ int32) {
			held.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}})
		in.waitReady()
		if n := in.waitRestored(3); n != 0 {
			t.Fatalf("restart on the same state dir restored %d records, want 0", n)
		}
		th.WaitFor(t, 30*time.Second, "each task with data to hold its listing", th.Holds(func() bool {
			return held.Load() == int32(len(withData))
		}))
		listed := func() (products int64, lines int) {
			for _, e := range in.logs.FilterMessageSnippet("The store's products are in the filter").All() {
				products += e.ContextMap()["products"].(int64)
				lines++
			}
			return products, lines
		}

		round(in, "old", 30, 5)
		round(in, "new", 30, 5)
		if _, lines := listed(); lines != 0 {
			t.Fatalf("%d tasks adopted a listing still held", lines)
		}

		close(release)
		th.WaitFor(t, 30*time.Second, "each task to adopt its listing", th.Holds(func() bool {
			_, lines := listed()
			return lines == len(withData)
		}))
		if products, _ := listed(); products != 30 {
			t.Fatalf("the tasks listed %d products, want the 30 their stores held at the start", products)
		}

		round(in, "old", 30, 1)
		round(in, "new", 30, 1)
		round(in, "fresh", 30, 7)
		totals, _, _ := h.changelog(h.cfg)
		equalTotals(t, "changelog", totals, want)
	})
}
