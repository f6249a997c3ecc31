package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

func TestSIGKILLAtEveryCommitStepKeepsTotalsExact(t *testing.T) {
	// Scenario: while events flow, the service is SIGKILLed at each step of the commit cycle and at
	// random moments, and restarted each time; at the end every total is exact (nothing lost, nothing
	// counted twice), over HTTP and in the changelog, under both guarantees.
	t.Run("exactly_once_v2", func(t *testing.T) { crashTest(t, "exactly_once_v2", 50) })
	t.Run("at_least_once", func(t *testing.T) { crashTest(t, "at_least_once", 8) })
}

func crashTest(t *testing.T, guarantee string, randomKills int) {
	eos := guarantee == "exactly_once_v2"
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))

	broker := kfakeCluster(t, 3)
	stateDir := t.TempDir()
	groupArgs := []string{"--group.instance.id", "crash-test", "--session.timeout.ms", "6000", "--processing.guarantee", guarantee}

	// Events: 40 products; some with an empty key, some sent to a partition that does not own them.
	// Exactly-once, values are positive so that committed notifications of a product must rise
	// strictly: a repeated or lower value would come from a cycle counted twice.
	cl := harness.NewClient(t, broker, kgo.RecordPartitioner(harness.HeaderPartitioner{}))
	events := make([]harness.Event, 4000+100*randomKills)
	for i := range events {
		e := harness.Event{Product: fmt.Sprintf("sku-%02d", rng.IntN(40)), Value: int64(rng.IntN(550) - 50)}
		if eos {
			e.Value = int64(1 + rng.IntN(500))
		}
		switch rng.IntN(10) {
		case 0:
			e.NoKey = true
		case 1:
			e.Misroute, e.To = true, int32(rng.IntN(3))
		}
		events[i] = e
	}
	want := harness.TotalsOf(events)
	prod := harness.NewProducer(cl, "sales-events-v1", events).Start(t, 20, 40*time.Millisecond)
	// topUp sends 5 more events when the producer is done, so that a started
	// process always has something to fold.
	toppedUp := 0
	topUp := func() {
		t.Helper()
		if !prod.Finished() {
			return
		}
		more := make([]harness.Event, 5)
		for i := range more {
			more[i] = harness.Event{Product: fmt.Sprintf("sku-%02d", rng.IntN(40)), Value: int64(1 + rng.IntN(500))}
			want[more[i].Product] += more[i].Value
		}
		toppedUp += len(more)
		harness.Produce(t, cl, harness.Records("sales-events-v1", more)...)
	}

	points := harness.CrashPoints[guarantee]
	for round, point := range append(points, points...) {
		nth := 1 + rng.IntN(4)
		p := startService(t, broker, stateDir, []string{fmt.Sprintf("SALESAGGTEST_CRASH_POINT=%s:%d", point, nth)}, groupArgs...)
		// A crash point needs commit cycles with something to commit: once
		// the paced producer is done (a slow start can outlast it), top up
		// until the process reaches its point.
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("round %d: crash point %s:%d to be reached", round, point, nth), func() error {
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
	var toFirstFold time.Duration
	for round := 0; round < randomKills; round++ {
		p := startService(t, broker, stateDir, nil, groupArgs...)
		started := time.Now()
		// Kill only once processing has begun: a kill before the first fold
		// would only test a start-up.
		lastTopUp := time.Time{}
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("random kill round %d: a processed event in /v1/tasks", round), func() error {
			if time.Since(lastTopUp) >= 200*time.Millisecond {
				topUp()
				lastTopUp = time.Now()
			}
			return p.Folded()
		})
		toFirstFold += time.Since(started)
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		p.Kill()
	}
	if randomKills > 0 {
		t.Logf("%d random kills, each after the first fold (%s from the start on average); %d events topped up", randomKills,
			(toFirstFold / time.Duration(randomKills)).Round(time.Millisecond), toppedUp)
	}
	prod.Wait(t, 5*time.Minute)

	p := startService(t, broker, stateDir, nil, groupArgs...)
	p.WaitReady(t, 60*time.Second)
	p.WaitTotals(t, want, 60*time.Second)
	got, records := changelogTotals(t, broker)
	if restored := p.RestoredTasks(t, 3).Total; eos && restored*4 > int64(records) {
		// After a SIGKILL only the tail past the local checkpoint is restored, never the whole changelog.
		t.Errorf("restart after SIGKILL restored %d records of a changelog of %d", restored, records)
	}
	if eos {
		for product, values := range notifications(t, broker) {
			for i := 1; i < len(values); i++ {
				if values[i] <= values[i-1] {
					t.Fatalf("committed notifications of %s do not rise: %v", product, values)
				}
			}
			if w := want[product]; w >= 2000 && values[len(values)-1] != w {
				t.Errorf("last notification of %s = %d, want %d", product, values[len(values)-1], w)
			}
		}
	}
	for product, w := range want {
		if got[product] != w {
			t.Errorf("changelog %s = %d, want %d", product, got[product], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("changelog has %d products, want %d", len(got), len(want))
	}
	p.Terminate(t)

	// After a clean stop, nothing is restored.
	p = startService(t, broker, stateDir, nil, groupArgs...)
	p.WaitReady(t, 60*time.Second)
	// The restore lines reach the test through the process's log pipe:
	// wait for all three rather than take readiness for their arrival.
	if sum := p.RestoredTasks(t, 3); sum.Total != 0 || sum.Lines != 3 {
		t.Fatalf("restart after clean stop restored %d records over %d tasks, want 0 over 3", sum.Total, sum.Lines)
	}
	p.WaitTotals(t, want, 30*time.Second)
	p.Terminate(t)
}
