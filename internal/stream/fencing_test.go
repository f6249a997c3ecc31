package stream_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestFencedByTransactionTimeoutStartsANewSession(t *testing.T) {
	// Scenario: exactly-once with transaction.timeout.ms 1.5 s; four commit cycles in a row hang
	// for 4 s after producing their changelog records (as when Kafka is unreachable that long),
	// so the broker aborts each transaction and fences the producer. Each fencing is the
	// broker's timeout, this process's own: the runtime does not exit (four fencings in a
	// minute would end it if they came sooner than the timeout: another process). Each time it
	// drops the cycle, starts a new producer session (rejoining the group at once), folds the
	// input again from the committed offsets, and the totals are exact.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.TransactionTimeoutSet = 1500 * time.Millisecond
	const hangs = 4
	var hung atomic.Int32
	var folded atomic.Bool
	// A cycle that hangs must have folded events since the last one (so
	// that its transaction holds records the broker aborts): a cycle with
	// nothing in it begins no transaction on the broker, and nothing fences.
	// A new session's tasks count from zero: any change is a fold.
	var rt atomic.Pointer[stream.Runtime]
	lastProcessed := int64(0) // owned by the cycle's crash point
	processed := func() int64 {
		var n int64
		if r := rt.Load(); r != nil {
			for _, ts := range r.Tasks() {
				n += ts.Processed
			}
		}
		return n
	}
	in := h.startWith(h.cfg, stream.Knobs{CrashPoint: func(point string) {
		if point != "changelog-produced" {
			return
		}
		cur := processed()
		if folded.Load() && cur != lastProcessed && hung.Load() < hangs {
			hung.Add(1)
			time.Sleep(4 * time.Second) // the hang under test, not a wait for a condition
		}
		lastProcessed = cur
	}})
	rt.Store(in.rt)
	in.waitReady()
	want := spread(h, "f", 10, 3)
	folded.Store(true)
	// Events keep coming until every hang happened: each fenced session
	// folds them again, and a hang needs events folded since the last cycle.
	for i := 0; hung.Load() < hangs; i++ {
		if i == 2*hangs {
			t.Fatalf("%d of %d cycles hung", hung.Load(), hangs)
		}
		before := hung.Load()
		more := spread(h, fmt.Sprintf("g%d-", i), 5, 1)
		for p, v := range more {
			want[p] += v
		}
		th.WaitFor(t, 30*time.Second, "the next cycle hung", th.Holds(func() bool { return hung.Load() > before }))
	}
	in.waitTotals(want)
	fencings := in.logs.FilterMessageSnippet("its transaction was open past transaction.timeout.ms").Len()
	if fencings < hangs {
		t.Fatalf("%d fencings by the broker's timeout reported, want %d", fencings, hangs)
	}
	if n := in.logs.FilterMessageSnippet("sooner than transaction.timeout.ms").Len(); n != 0 {
		t.Fatalf("%d fencings taken for another process's", n)
	}
	select {
	case err := <-in.done:
		t.Fatalf("the runtime stopped after the fencings: %v", err)
	default:
	}
	equalTotals(t, "changelog", func() map[string]int64 { got, _, _ := h.changelog(h.cfg); return got }(), want)
}

func TestAnotherProcessWithTheSameTransactionalIDEndsOne(t *testing.T) {
	// Scenario: exactly-once; A runs, and B starts on a state dir whose process id was copied
	// from A's (a cloned volume): both use the same transactional id, under their own group
	// instance ids. Each new producer session fences the other's at once, far sooner than the
	// transaction timeout. One of them must give up with an error that says why, instead of
	// the two fencing each other for ever; the one left folds every event exactly.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.ProcessingGuarantee = config.ExactlyOnceV2
	h.cfg.SessionTimeout = 6 * time.Second
	cfgA, cfgB := h.instanceCfg("a"), h.instanceCfg("b")
	cfgA.GroupInstanceID, cfgB.GroupInstanceID = "dup-a", "dup-b"
	a := h.start(cfgA)
	a.waitReady()
	want := spread(h, "d", 5, 2)
	a.waitTotals(want)
	appB := filepath.Join(cfgB.StateDir, cfgB.ApplicationID)
	if err := os.MkdirAll(appB, 0o700); err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(cfgA.StateDir, cfgA.ApplicationID, "process-metadata"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(appB, "process-metadata"), meta, 0o600); err != nil {
		t.Fatal(err)
	}
	b := h.start(cfgB)
	if a.dir.ProcessID() != b.dir.ProcessID() {
		t.Fatalf("process ids %s and %s: the copy did not take", a.dir.ProcessID(), b.dir.ProcessID())
	}
	// Events keep coming: a fenced producer finds out at its next cycle.
	var ended *instance
	var endErr error
	for i := 0; ended == nil; i++ {
		if i == 120 {
			t.Fatal("neither instance gave up after a minute of fencing each other")
		}
		for p, v := range spread(h, fmt.Sprintf("e%d-", i), 2, 1) {
			want[p] += v
		}
		select {
		case endErr = <-a.done:
			ended = a
		case endErr = <-b.done:
			ended = b
		case <-time.After(500 * time.Millisecond):
		}
	}
	ended.done <- endErr // for its stop at cleanup
	if endErr == nil || !strings.Contains(endErr.Error(), "another process with this transactional id") {
		t.Fatalf("the instance ended with %v, want the fencings named", endErr)
	}
	if n := ended.logs.FilterMessageSnippet("sooner than transaction.timeout.ms").Len(); n < 3 {
		t.Fatalf("%d fencings by another producer logged before giving up", n)
	}
	left := a
	if ended == a {
		left = b
	}
	t.Logf("%s ended: %v", map[*instance]string{a: "A", b: "B"}[ended], endErr)
	left.waitTotals(want)
	equalTotals(t, "changelog", func() map[string]int64 { got, _, _ := h.changelog(h.cfg); return got }(), want)
	select {
	case err := <-left.done:
		t.Fatalf("the instance left ended too: %v", err)
	default:
	}
}
