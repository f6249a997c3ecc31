package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	th "github.com/salesagg/salesagg/test/harness"
)

func TestProduceGateFailsWhatTheClientHeldPastTheLease(t *testing.T) {
	// Scenario (at-least-once has no fencing): records wait in the client's buffer while the
	// lease holds, behind a produce request in flight to a slow leader; the lease's deadline
	// passes before franz-go writes them, the lease loop not having run yet (the process was
	// paused, SIGSTOP, and just resumed). A record carrying the lease's produce gate then fails
	// and never reaches the broker; one whose gate still holds lands; one without a gate lands,
	// which is what a zombie's records did in the 30-minute torture run, seed 9.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "late"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	release := make(chan struct{})
	var mu sync.Mutex
	held := map[int32]bool{}
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		for _, rt := range kreq.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				held[rp.Partition] = true
			}
		}
		mu.Unlock()
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type outcome struct {
		name string
		err  error
	}
	results := make(chan outcome, 6)
	produce := func(p int32, name string, gate context.Context) {
		r := &kgo.Record{Topic: "late", Partition: p, Value: []byte(name), Context: gate}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) { results <- outcome{name, err} })
	}
	// A first record in each partition, held by the slow broker: until it is answered, franz-go
	// sends nothing more of its partition.
	for p := range int32(3) {
		produce(p, fmt.Sprintf("first-%d", p), nil)
	}
	if err := th.Poll(10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(held) < 3 {
			return fmt.Errorf("the broker holds requests of %d partitions, want 3", len(held))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	passed := newLease(6*time.Second, time.Minute)
	passed.assigned(time.Now())
	holding := newLease(6*time.Second, time.Minute)
	holding.assigned(time.Now())
	gate := passed.produceGate(time.Now())
	if gate.Err() != nil {
		t.Fatalf("the gate of a lease just held is done: %v", gate.Err())
	}
	produce(0, "past-the-lease", gate)
	produce(1, "within-the-lease", holding.produceGate(time.Now()))
	produce(2, "no-gate", nil)
	// The deadline passes with the records buffered; then the broker answers.
	passed.mu.Lock()
	passed.until = time.Now()
	passed.mu.Unlock()
	close(release)

	got := map[string]error{}
	for range 6 {
		select {
		case o := <-results:
			got[o.name] = o.err
		case <-ctx.Done():
			t.Fatalf("only %d of 6 records answered: %v", len(got), got)
		}
	}
	if !errors.Is(got["past-the-lease"], errLeasePassed) {
		t.Errorf("the record buffered past its lease: %v, want %v", got["past-the-lease"], errLeasePassed)
	}
	for _, name := range []string{"first-0", "first-1", "first-2", "within-the-lease", "no-gate"} {
		if got[name] != nil {
			t.Errorf("%s: %v, want produced", name, got[name])
		}
	}

	// What the topic holds: the records that were allowed, never the other.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("late"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	read := map[string]bool{}
	for len(read) < 5 && ctx.Err() == nil {
		consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) { read[string(r.Value)] = true })
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	ends.Each(func(o kadm.ListedOffset) { total += int(o.Offset) })
	if total != 5 || read["past-the-lease"] || !read["within-the-lease"] || !read["no-gate"] {
		t.Fatalf("the topic holds %d records, read %v: want the firsts, within-the-lease and no-gate", total, read)
	}
}

func TestProduceGateFollowsTheLease(t *testing.T) {
	// Scenario: a hold's gate is open while the lease holds before its deadline; it closes when
	// the lease lapses or is lost, or when its deadline is found passed; a gate asked for while
	// the lease does not hold is closed; a later hold (a new assignment, or a late heartbeat
	// answer extending the deadline) gives a new open gate, the old one staying closed.
	session := 6 * time.Second
	l := newLease(session, time.Minute)
	t0 := time.Now()
	if g := l.produceGate(t0); g.Err() == nil {
		t.Fatal("an idle lease gave an open gate")
	}
	l.assigned(t0)
	g1 := l.produceGate(t0)
	if g1.Err() != nil || l.produceGate(t0) != g1 {
		t.Fatal("a held lease gave a closed gate, or a new one per call")
	}
	if _, ok := l.expire(time.Now().Add(time.Hour), []int32{0}); !ok {
		t.Fatal("the lease did not lapse past its deadline")
	}
	if !errors.Is(g1.Err(), errLeasePassed) || l.produceGate(time.Now()).Err() == nil {
		t.Fatal("the lapse left a gate open")
	}

	l.assigned(time.Now())
	g2 := l.produceGate(time.Now())
	if g2 == g1 || g2.Err() != nil || g1.Err() == nil {
		t.Fatal("a new hold did not give a new open gate, closing none of the old")
	}
	// The deadline passes; a heartbeat sent just before it is answered late and extends it.
	l.mu.Lock()
	l.until = time.Now()
	l.mu.Unlock()
	if g2.Err() == nil {
		t.Fatal("the gate stayed open past the deadline")
	}
	l.answered(time.Now(), nil)
	g3 := l.produceGate(time.Now())
	if g3 == g2 || g3.Err() != nil || g2.Err() == nil {
		t.Fatal("the extended hold did not give a new open gate, or reopened the old")
	}
	l.lost()
	if g3.Err() == nil || l.produceGate(time.Now()).Err() == nil {
		t.Fatal("losing the session left a gate open")
	}
}
