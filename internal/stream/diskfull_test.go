package stream_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestUnwritableStoreStallsAndRecovers(t *testing.T) {
	// Scenario: the state dir stops taking writes (as a full or read-only disk; the failure is
	// injected into the check made before each store write): the tasks stop, /readyz says so, no
	// input offset is committed past what the stores hold, and once writes work again the tasks
	// resume with exact totals.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		g := h.cfg.ProcessingGuarantee
		var full atomic.Bool
		in := h.startWith(h.cfg, stream.Knobs{StoreWritable: func(p int32) error {
			if full.Load() {
				return fmt.Errorf("%w: no space left on device (injected)", state.ErrUnwritable)
			}
			return nil
		}})
		in.waitReady()
		// Ten products, spread over all three partitions.
		var products []string
		owners := map[int32]bool{}
		for i := 0; len(products) < 10 || len(owners) < 3; i++ {
			p := fmt.Sprintf("disk-%d", i)
			products = append(products, p)
			owners[sales.Partition([]byte(p), 3)] = true
		}
		want := map[string]int64{}
		send := func(n int) {
			var recs []*kgo.Record
			for i := 0; i < n; i++ {
				p := products[i%len(products)]
				want[p] += 10
				recs = append(recs, event(p, p, 10))
			}
			h.produce(recs...)
		}
		send(50)
		in.waitTotals(want)

		adm := kadm.NewClient(h.client())
		committed := func() int64 {
			offs, err := adm.FetchOffsets(context.Background(), h.cfg.ApplicationID)
			if err != nil {
				t.Fatal(err)
			}
			var n int64
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Topic == h.cfg.InputTopic {
					n += o.At
				}
			})
			return n
		}
		th.WaitFor(t, 10*time.Second, "the first events' offsets to be committed", th.Holds(func() bool { return committed() == 50 }))

		full.Store(true)
		send(50)
		th.WaitFor(t, 20*time.Second, "every task to stall", th.Holds(func() bool {
			n := 0
			for _, ts := range in.rt.Tasks() {
				if ts.State == "stalled" {
					n++
				}
			}
			return n == 3
		}))
		if code, body := get(t, in.http.URL+"/readyz"); code != 503 || !strings.Contains(body, "stalled") {
			t.Fatalf("/readyz while stalled = %d %s", code, body)
		}
		if in.logs.FilterMessageSnippet("Cannot write its store; stopped processing until it can").Len() == 0 {
			t.Fatal("no log line about the store that cannot be written")
		}
		// Exactly-once, the transaction that the stores could not take is committed in Kafka
		// (its totals are in the changelog, and are written to the stores on recovery); no
		// later one is. At-least-once, nothing past the first events is committed.
		atStall := committed()
		if g == config.AtLeastOnce && atStall != 50 {
			t.Fatalf("at-least-once committed %d input offsets while the stores could not be written, want 50", atStall)
		}
		send(20)
		time.Sleep(1500 * time.Millisecond) // stalled and checking every second: nothing may move
		if got := committed(); got != atStall {
			t.Fatalf("input offsets committed while stalled: %d -> %d", atStall, got)
		}

		full.Store(false)
		in.waitReady()
		in.waitTotals(want)
		if in.logs.FilterMessageSnippet("Store writable again; processing resumes").Len() != 3 {
			t.Fatal("not every task logged its recovery")
		}
		th.WaitFor(t, 10*time.Second, "every input offset committed", th.Holds(func() bool { return committed() == 120 }))
		th.WaitFor(t, 10*time.Second, "the changelog to agree", th.Holds(func() bool {
			got, _, _ := h.changelog(h.cfg)
			for p, w := range want {
				if got[p] != w {
					return false
				}
			}
			return true
		}))
	})
}

func TestFullDiskStallsAndRecovers(t *testing.T) {
	// Scenario: the state dir is on a small tmpfs that another file fills up: the tasks stall
	// before Pebble runs out of space, and resume with exact totals once the file is deleted.
	// Needs root and mount(8); skipped elsewhere.
	dir := t.TempDir()
	// Room for three stores (each preallocates its log at 1.1 times its
	// 16 MiB memtable) and state.MinFreeBytes.
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	h := newHarness(t)
	h.createInput(3)
	cfg := h.cfg
	cfg.StateDir = dir
	in := h.start(cfg)
	t.Cleanup(func() { _ = in.stop() }) // before the unmount
	in.waitReady()
	var recs []*kgo.Record
	want := map[string]int64{}
	for i := 0; i < 60; i++ {
		p := fmt.Sprintf("full-%d", i%12)
		want[p] += 7
		recs = append(recs, event(p, p, 7))
	}
	h.produce(recs...)
	in.waitTotals(want)

	// Leave less than state.MinFreeBytes free.
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	size := int64(st.Bavail*uint64(st.Bsize)) - state.MinFreeBytes/2
	if err := os.WriteFile(filler, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	for p := range want {
		want[p] += 3
		h.produce(event(p, p, 3))
	}
	th.WaitFor(t, 20*time.Second, "a task to stall", th.Holds(func() bool {
		code, body := get(t, in.http.URL+"/readyz")
		return code == 503 && strings.Contains(body, "stalled")
	}))
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	in.waitReady()
	in.waitTotals(want)
}

func TestStalledTaskDoesNotHoldBackOthers(t *testing.T) {
	// Scenario: only task 0_1's store stops taking writes; events keep arriving for every
	// partition, in many small batches: 0_1 stalls, the other tasks keep folding and serving
	// exact totals meanwhile, and once 0_1's store takes writes again its totals are exact too.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		var full atomic.Bool
		in := h.startWith(h.cfg, stream.Knobs{StoreWritable: func(p int32) error {
			if p == 1 && full.Load() {
				return fmt.Errorf("%w: no space left on device (injected)", state.ErrUnwritable)
			}
			return nil
		}})
		in.waitReady()
		prods := map[int32]string{0: productOn("st", 0, 3), 1: productOn("st", 1, 3), 2: productOn("st", 2, 3)}
		want := map[string]int64{}
		send := func(p int32, n int) {
			var recs []*kgo.Record
			for i := 0; i < n; i++ {
				want[prods[p]] += 3
				recs = append(recs, event(prods[p], prods[p], 3))
			}
			h.produce(recs...)
		}
		for p := int32(0); p < 3; p++ {
			send(p, 5)
		}
		in.waitTotals(want)

		full.Store(true)
		send(1, 5)
		th.WaitFor(t, 20*time.Second, "task 0_1 to stall", th.Holds(func() bool {
			for _, ts := range in.rt.Tasks() {
				if ts.Task == "0_1" {
					return ts.State == "stalled"
				}
			}
			return false
		}))
		// Many small batches for every partition, the stalled one included.
		for i := 0; i < 40; i++ {
			for p := int32(0); p < 3; p++ {
				send(p, 2)
			}
		}
		others := map[string]int64{prods[0]: want[prods[0]], prods[2]: want[prods[2]]}
		in.waitTotals(others)
		if code, body := get(t, in.http.URL+"/readyz"); code != 503 || !strings.Contains(body, "task 0_1 is stalled") {
			t.Fatalf("/readyz while 0_1 is stalled = %d %s", code, body)
		}
		if got, _ := in.total(prods[1]); got == want[prods[1]] {
			t.Fatalf("the stalled task's total moved on to %d while its store could not be written", got)
		}
		full.Store(false)
		in.waitReady()
		in.waitTotals(want)
	})
}
