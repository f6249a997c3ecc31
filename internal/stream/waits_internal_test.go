package stream

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestKafkaLogRepeatsOneLinePerIntervalWithTheCountSuppressed(t *testing.T) {
	r := newLogRepeats()
	t0 := time.Unix(1000, 0)
	if ok, n := r.allow("group manage loop errored", t0); !ok || n != 0 {
		t.Fatalf("first line: allowed %v, suppressed %d; want true, 0", ok, n)
	}
	for i := range 5 {
		if ok, _ := r.allow("group manage loop errored", t0.Add(time.Duration(i)*time.Second)); ok {
			t.Fatalf("repeat %d within the interval let through", i)
		}
	}
	if ok, _ := r.allow("another message", t0.Add(time.Second)); !ok {
		t.Fatal("a different message was held back by the first one's interval")
	}
	if ok, n := r.allow("group manage loop errored", t0.Add(kafkaLogRepeatEvery)); !ok || n != 5 {
		t.Fatalf("after the interval: allowed %v, suppressed %d; want true, 5", ok, n)
	}
}

func TestKafkaWaitsOpenOnceCountAndCloseWithTheirDuration(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	w := newKafkaWaits(zap.New(core))
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	for range 4 {
		w.failed(fetchWait("in", 2), "the leader of in-2 to serve fetches", 2, errors.New("NOT_LEADER_OR_FOLLOWER"))
	}
	w.failed(groupWait, "the group coordinator of app (joining the group)", -1, errors.New("NOT_COORDINATOR"))
	if n := logs.FilterMessageSnippet("Waiting for Kafka").Len(); n != 2 {
		t.Fatalf("%d wait lines for two waits, want 2", n)
	}
	if got := w.forPartition(2); got == "" || !strings.Contains(got, "4 failed attempts") || !strings.Contains(got, "group coordinator") {
		t.Errorf("task 2 waits for %q, want its fetch (4 failed attempts) and the group coordinator", got)
	}
	if got := w.forPartition(1); !strings.Contains(got, "group coordinator") || strings.Contains(got, "in-2") {
		t.Errorf("task 1 waits for %q, want the group coordinator only", got)
	}
	now = now.Add(3 * time.Second)
	w.answeredPartitions("in", map[int32]bool{2: true})
	es := logs.FilterMessageSnippet("Kafka answered again: the leader of in-2").All()
	if len(es) != 1 || es[0].ContextMap()["failed_attempts"] != int64(4) || es[0].ContextMap()["waited"] != 3*time.Second {
		t.Fatalf("answered lines %v, want one with 4 failed attempts after 3s", es)
	}
	w.answered(fetchWait("in", 2)) // already closed: nothing more
	if n := logs.FilterMessageSnippet("Kafka answered again").Len(); n != 1 {
		t.Errorf("%d answered lines, want 1", n)
	}
	if got := w.summary(); !strings.Contains(got, "group coordinator") || strings.Contains(got, "in-2") {
		t.Errorf("summary %q, want only the group coordinator open", got)
	}
}

func TestTroubleWaitWithinAnotherShowsTheOuterAgain(t *testing.T) {
	// A wait for the changelog's transactions re-reads the changelog's
	// bounds; a failed read shows inside it, and once the read answers
	// the outer wait is shown again, with the start it had.
	var tr trouble
	tr.wait("the transactions ending", time.Minute)
	_, _, _, began, _ := tr.snapshot(time.Hour)
	outer := tr.waitWithin("the offsets (listing them failed)", 0)
	if outer != "the transactions ending" {
		t.Fatalf("outer = %q", outer)
	}
	if w, _, _, b, _ := tr.snapshot(time.Hour); w != "the transactions ending; meanwhile the offsets (listing them failed)" || !b.Equal(began) {
		t.Fatalf("inside: waiting %q since %v, want the outer's start %v", w, b, began)
	}
	tr.endWithin(outer)
	if w, _, _, b, _ := tr.snapshot(time.Hour); w != "the transactions ending" || !b.Equal(began) {
		t.Fatalf("after: waiting %q since %v, want the outer wait since %v", w, b, began)
	}

	// Without an outer wait, ending the inner one clears the trouble.
	var alone trouble
	outer = alone.waitWithin("the offsets (listing them failed)", 0)
	alone.endWithin(outer)
	if w, _, _, b, _ := alone.snapshot(time.Hour); w != "" || !b.IsZero() {
		t.Fatalf("alone: waiting %q since %v, want nothing", w, b)
	}

	// A failure recorded meanwhile is kept.
	var failing trouble
	failing.wait("the transactions ending", 0)
	outer = failing.waitWithin("the offsets", 0)
	failing.fail(errors.New("boom"))
	failing.endWithin(outer)
	if w, e, _, _, _ := failing.snapshot(time.Hour); w != "" || e != "boom" {
		t.Fatalf("failing: waiting %q, err %q; want the failure kept", w, e)
	}
}
