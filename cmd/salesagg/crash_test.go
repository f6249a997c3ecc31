package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// crashPoints are the commit-cycle points the service can be made to die at,
// per guarantee.
var crashPoints = map[string][]string{
	"at_least_once":   {"flush-start", "changelog-produced", "changelog-flushed", "store-written", "offsets-committed"},
	"exactly_once_v2": {"changelog-produced", "transaction-committed", "store-written"},
}

// wrongPartitioner sends a record marked with a "to" header to the
// partition it names, others by murmur2 of the key.
type wrongPartitioner struct{}

func (wrongPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return wrongTopicPartitioner{kgo.StickyKeyPartitioner(nil).ForTopic(topic)}
}

type wrongTopicPartitioner struct{ byKey kgo.TopicPartitioner }

func (wrongTopicPartitioner) OnNewBatch()                          {}
func (wrongTopicPartitioner) RequiresConsistency(*kgo.Record) bool { return true }
func (p wrongTopicPartitioner) Partition(r *kgo.Record, n int) int {
	for _, h := range r.Headers {
		if h.Key == "to" {
			return int(h.Value[0]) % n
		}
	}
	return p.byKey.Partition(r, n)
}

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

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]
	stateDir := t.TempDir()
	groupArgs := []string{"--group.instance.id", "crash-test", "--session.timeout.ms", "6000", "--processing.guarantee", guarantee}

	// Events: 40 products; some with an empty key, some sent to a partition that does not own them.
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RecordPartitioner(wrongPartitioner{}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, "sales-events-v1"); err != nil {
		t.Fatal(err)
	}
	// Exactly-once, values are positive so that committed notifications of a product must rise
	// strictly: a repeated or lower value would come from a cycle counted twice.
	events := 4000 + 100*randomKills
	want := map[string]int64{}
	var recs []*kgo.Record
	for i := 0; i < events; i++ {
		product := fmt.Sprintf("sku-%02d", rng.IntN(40))
		v := int64(rng.IntN(550) - 50)
		if eos {
			v = int64(1 + rng.IntN(500))
		}
		want[product] += v
		r := &kgo.Record{Topic: "sales-events-v1", Key: []byte(product), Value: []byte(fmt.Sprintf(`{"product":%q,"value":%d}`, product, v))}
		switch rng.IntN(10) {
		case 0:
			r.Key = nil
		case 1:
			r.Headers = []kgo.RecordHeader{{Key: "to", Value: []byte{byte(rng.IntN(3))}}}
		}
		recs = append(recs, r)
	}
	var produceErr error
	produced := make(chan struct{}) // closed when the producer is done; produceErr is set before
	go func() {
		defer close(produced)
		for i := 0; i < len(recs); i += 20 {
			if err := cl.ProduceSync(context.Background(), recs[i:min(i+20, len(recs))]...).FirstErr(); err != nil {
				produceErr = err
				return
			}
			time.Sleep(40 * time.Millisecond)
		}
	}()
	// topUp sends 5 more events when the producer is done, so that a started
	// process always has something to fold.
	toppedUp := 0
	topUp := func() {
		t.Helper()
		select {
		case <-produced:
		default:
			return
		}
		var more []*kgo.Record
		toppedUp += 5
		for range 5 {
			product := fmt.Sprintf("sku-%02d", rng.IntN(40))
			v := int64(1 + rng.IntN(500))
			want[product] += v
			more = append(more, &kgo.Record{Topic: "sales-events-v1", Key: []byte(product), Value: []byte(fmt.Sprintf(`{"product":%q,"value":%d}`, product, v))})
		}
		if err := cl.ProduceSync(context.Background(), more...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	killedBySignal := func(p *proc) bool {
		var ee *exec.ExitError
		if !errors.As(p.err, &ee) {
			return false
		}
		ws, ok := ee.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	}
	points := crashPoints[guarantee]
	for round, point := range append(points, points...) {
		nth := 1 + rng.IntN(4)
		p := startService(t, broker, stateDir, []string{fmt.Sprintf("SALESAGGTEST_CRASH_POINT=%s:%d", point, nth)}, groupArgs...)
		// A crash point needs commit cycles with something to commit: once
		// the paced producer is done (a slow start can outlast it), top up
		// until the process reaches its point.
		deadline := time.After(90 * time.Second)
	reached:
		for {
			select {
			case <-p.exited:
				break reached
			case <-deadline:
				t.Fatalf("round %d: crash point %s:%d never reached; logs:\n%s", round, point, nth, p.output())
			case <-time.After(200 * time.Millisecond):
				topUp()
			}
		}
		if !killedBySignal(p) {
			t.Fatalf("round %d: crash point %s: process ended with %v, not SIGKILL; logs:\n%s", round, point, p.err, p.output())
		}
	}
	var toFirstFold time.Duration
	for round := 0; round < randomKills; round++ {
		p := startService(t, broker, stateDir, nil, groupArgs...)
		started := time.Now()
		// Kill only once processing has begun: a kill before the first fold
		// would only test a start-up.
		lastTopUp := time.Time{}
		waitFor(t, 30*time.Second, fmt.Sprintf("random kill round %d: a processed event in /v1/tasks", round), func() bool {
			if !p.alive() {
				t.Fatalf("random kill round %d: salesagg exited on its own: %v; logs:\n%s", round, p.err, p.output())
			}
			if time.Since(lastTopUp) >= 200*time.Millisecond {
				topUp()
				lastTopUp = time.Now()
			}
			return p.processed() > 0
		})
		toFirstFold += time.Since(started)
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		p.kill()
	}
	if randomKills > 0 {
		t.Logf("%d random kills, each after the first fold (%s from the start on average); %d events topped up", randomKills,
			(toFirstFold / time.Duration(randomKills)).Round(time.Millisecond), toppedUp)
	}
	<-produced
	if produceErr != nil {
		t.Fatal(produceErr)
	}

	p := startService(t, broker, stateDir, nil, groupArgs...)
	p.waitReady()
	p.waitTotals(want, 60*time.Second)
	got, records := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
	if restored := p.restoredAll(3); eos && restored*4 > int64(records) {
		// After a SIGKILL only the tail past the local checkpoint is restored, never the whole changelog.
		t.Errorf("restart after SIGKILL restored %d records of a changelog of %d", restored, records)
	}
	if eos {
		notes := notifications(t, broker, "notifications-events-v1")
		for product, values := range notes {
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
	p.stop()

	// After a clean stop, nothing is restored.
	p = startService(t, broker, stateDir, nil, groupArgs...)
	p.waitReady()
	// The restore lines reach the test through the process's log pipe:
	// wait for all three rather than take readiness for their arrival.
	if n, tasks := p.restoredAll(3), len(p.logLines("Finished restoring changelog")); n != 0 || tasks != 3 {
		t.Fatalf("restart after clean stop restored %d records over %d tasks, want 0 over 3", n, tasks)
	}
	p.waitTotals(want, 30*time.Second)
	p.stop()
}
