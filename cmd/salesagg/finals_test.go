package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

func TestSIGKILLWhileWindowsCloseWritesEachFinalOnce(t *testing.T) {
	// Scenario: exactly-once with 10s windows, no grace and windows.notify final, while paced
	// events flow (their record timestamps the produce time: each partition's stream time
	// follows the clock, so windows close all along). The service is SIGKILLed at each step of
	// the commit cycle and at random moments; at the end every window closed by its task's
	// stream time has exactly one committed final notification, with its exact total, and no
	// open window has one.
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	broker := kfakeCluster(t, 3)
	stateDir := t.TempDir()
	args := []string{"--group.instance.id", "finals-test", "--session.timeout.ms", "6000", "--processing.guarantee", "exactly_once_v2",
		"--windows.sizes", "10s", "--windows.notify", "final", "--notification.threshold", "1"}
	cl := harness.NewClient(t, broker)
	events := make([]harness.Event, 3000)
	for i := range events {
		// Keyed, on their owner's partition: no event is forwarded, so none
		// arrives after its task's stream time moved past its window.
		events[i] = harness.Event{Product: fmt.Sprintf("fin-%02d", rng.IntN(20)), Value: int64(1 + rng.IntN(500))}
	}
	// 50 events a second for a minute: six 10 s windows close per task.
	prod := harness.NewProducer(cl, "sales-events-v1", events).Start(t, 2, 40*time.Millisecond)
	topUp := func() {
		if prod.Finished() {
			harness.Produce(t, cl, harness.Records("sales-events-v1", []harness.Event{{Product: fmt.Sprintf("fin-%02d", rng.IntN(20)), Value: 1}})...)
		}
	}
	for round, point := range append(harness.CrashPoints["exactly_once_v2"], harness.CrashPoints["exactly_once_v2"]...) {
		p := startService(t, broker, stateDir, []string{fmt.Sprintf("SALESAGGTEST_CRASH_POINT=%s:%d", point, 1+rng.IntN(4))}, args...)
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("round %d: crash point %s to be reached", round, point), func() error {
			if !p.Alive() {
				return nil
			}
			topUp()
			return errors.New("still running")
		})
		if !p.KilledBy(syscall.SIGKILL) {
			t.Fatalf("round %d: crash point %s: process ended with %s, not SIGKILL", round, point, p.DescribeExit())
		}
	}
	for round := range 12 {
		p := startService(t, broker, stateDir, nil, args...)
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("random kill round %d: a processed event", round), func() error {
			topUp()
			return p.Folded()
		})
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond)
		p.Kill()
	}
	prod.Wait(t, 5*time.Minute)
	p := startService(t, broker, stateDir, nil, args...)
	p.WaitReady(t, 60*time.Second)
	in, err := harness.ReadTopic(broker, "sales-events-v1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p.WaitTotals(t, harness.InputTotals(in.Records), 60*time.Second)
	p.Terminate(t)

	const size = int64(10_000)
	truth := harness.WindowTruth(in.Records, 10*time.Second)
	streamTime := map[int32]int64{}
	for _, r := range in.Records {
		streamTime[r.Partition] = max(streamTime[r.Partition], r.Timestamp.UnixMilli())
	}
	notes, err := harness.ReadTopic(broker, "notifications-events-v1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	finals := map[string]int64{}
	for _, r := range notes.Records {
		var n sales.WindowNotification
		if !isWindowed(r) {
			continue
		}
		if err := json.Unmarshal(r.Value, &n); err != nil || !n.Final || n.End-n.Start != size {
			t.Fatalf("windowed notification %q: %v (want final, 10s)", r.Value, err)
		}
		k := fmt.Sprintf("%s@%d", n.SKU, n.Start)
		if _, dup := finals[k]; dup {
			t.Fatalf("window %s has a second final notification (%d after %d)", k, n.Value, finals[k])
		}
		finals[k] = n.Value
	}
	closed := 0
	for k, total := range truth {
		product, start := splitWindowKey(t, k)
		owner := sales.Partition([]byte(product), 3)
		got, emitted := finals[k]
		isClosed := start+size <= streamTime[owner]
		switch {
		case isClosed && !emitted:
			t.Errorf("window %s closed (stream time %d) without a final notification", k, streamTime[owner])
		case isClosed && got != total:
			t.Errorf("window %s: final %d, want %d", k, got, total)
		case !isClosed && emitted:
			t.Errorf("window %s is open (stream time %d) but has a final notification", k, streamTime[owner])
		}
		if isClosed {
			closed++
		}
	}
	if len(finals) != closed {
		t.Errorf("%d final notifications for %d closed windows", len(finals), closed)
	}
	if closed < 20 {
		t.Fatalf("only %d windows closed: the run did not cross enough window boundaries", closed)
	}
	t.Logf("%d closed windows, each with one exact final notification", closed)
}

// isWindowed reports whether a notification is a window's.
func isWindowed(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == sales.WindowHeader {
			return true
		}
	}
	return false
}

// splitWindowKey reads "product@start".
func splitWindowKey(t *testing.T, k string) (string, int64) {
	t.Helper()
	for i := len(k) - 1; i >= 0; i-- {
		if k[i] == '@' {
			var start int64
			if _, err := fmt.Sscan(k[i+1:], &start); err != nil {
				t.Fatal(err)
			}
			return k[:i], start
		}
	}
	t.Fatalf("window key %q", k)
	return "", 0
}
