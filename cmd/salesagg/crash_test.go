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

// crashPoints are the commit-cycle points the service can be made to die at.
var crashPoints = []string{"flush-start", "changelog-produced", "changelog-flushed", "store-written", "offsets-committed"}

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
	// counted twice), over HTTP and in the changelog.
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
	groupArgs := []string{"--group.instance.id", "crash-test", "--session.timeout.ms", "6000"}

	// Events: 40 products; some with an empty key, some sent to a partition that does not own them.
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RecordPartitioner(wrongPartitioner{}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, "sales-events-v1"); err != nil {
		t.Fatal(err)
	}
	const events = 4000
	want := map[string]int64{}
	var recs []*kgo.Record
	for i := 0; i < events; i++ {
		product := fmt.Sprintf("sku-%02d", rng.IntN(40))
		v := int64(rng.IntN(550) - 50)
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
	produced := make(chan error, 1)
	go func() {
		for i := 0; i < len(recs); i += 20 {
			if err := cl.ProduceSync(context.Background(), recs[i:min(i+20, len(recs))]...).FirstErr(); err != nil {
				produced <- err
				return
			}
			time.Sleep(40 * time.Millisecond)
		}
		produced <- nil
	}()

	killedBySignal := func(p *proc) bool {
		var ee *exec.ExitError
		if !errors.As(p.err, &ee) {
			return false
		}
		ws, ok := ee.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	}
	for round, point := range append(crashPoints, crashPoints...) {
		nth := 1 + rng.IntN(4)
		p := startService(t, broker, stateDir, []string{fmt.Sprintf("SALESAGGTEST_CRASH_POINT=%s:%d", point, nth)}, groupArgs...)
		select {
		case <-p.exited:
		case <-time.After(60 * time.Second):
			t.Fatalf("round %d: crash point %s:%d never reached; logs:\n%s", round, point, nth, p.output())
		}
		if !killedBySignal(p) {
			t.Fatalf("round %d: crash point %s: process ended with %v, not SIGKILL; logs:\n%s", round, point, p.err, p.output())
		}
	}
	for round := 0; round < 4; round++ {
		p := startService(t, broker, stateDir, nil, groupArgs...)
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		p.kill()
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}

	p := startService(t, broker, stateDir, nil, groupArgs...)
	p.waitReady()
	p.waitTotals(want, 60*time.Second)
	got := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
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
	if n, tasks := p.restored(); n != 0 || tasks != 3 {
		t.Fatalf("restart after clean stop restored %d records over %d tasks, want 0 over 3", n, tasks)
	}
	p.waitTotals(want, 30*time.Second)
	p.stop()
}
