package stream_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
	th "github.com/salesagg/salesagg/test/harness"
	"github.com/salesagg/salesagg/test/ownership"
)

// steadyProducer sends events for a fixed set of products, a small batch at
// a time, until halted; it knows the totals it sent.
type steadyProducer struct {
	h        *harness
	products []string
	stop     chan struct{}
	done     chan struct{}

	mu   sync.Mutex       // guards sent, n and err
	sent map[string]int64 // guarded by mu
	n    int              // guarded by mu: the records sent
	err  error            // guarded by mu: the failure that stopped it
}

func startSteadyProducer(h *harness, products []string) *steadyProducer {
	sp := &steadyProducer{h: h, products: products, stop: make(chan struct{}), done: make(chan struct{}), sent: map[string]int64{}}
	cl := h.client(kgo.RecordPartitioner(manualOrKeyPartitioner{}))
	go func() {
		defer close(sp.done)
		for i := 0; ; i++ {
			select {
			case <-sp.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var recs []*kgo.Record
			batch := map[string]int64{}
			for j := range 10 {
				p := sp.products[(i*10+j)%len(sp.products)]
				v := int64(1 + (i+j)%7)
				r := event(p, p, v)
				r.Topic = h.cfg.InputTopic
				recs = append(recs, r)
				batch[p] += v
			}
			if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
				sp.mu.Lock()
				sp.err = err
				sp.mu.Unlock()
				return
			}
			sp.mu.Lock()
			for p, v := range batch {
				sp.sent[p] += v
			}
			sp.n += len(recs)
			sp.mu.Unlock()
		}
	}()
	return sp
}

// halt stops producing and returns the totals sent.
func (sp *steadyProducer) halt() map[string]int64 {
	sp.h.t.Helper()
	close(sp.stop)
	<-sp.done
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.err != nil {
		sp.h.t.Fatalf("producing: %v", sp.err)
	}
	out := make(map[string]int64, len(sp.sent))
	for p, v := range sp.sent {
		out[p] = v
	}
	return out
}

func (sp *steadyProducer) count() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.n
}

// fleet is the in-process instances of one group, by name, with a sampler
// of which runs what.
type fleet struct {
	h    *harness
	cfg  func(name string) config.Config
	mu   sync.Mutex           // guards live
	live map[string]*instance // guarded by mu
}

func newFleet(h *harness, cfg func(name string) config.Config) *fleet {
	return &fleet{h: h, cfg: cfg, live: map[string]*instance{}}
}

func (f *fleet) start(name string) *instance {
	in := f.h.start(f.cfg(name))
	f.mu.Lock()
	f.live[name] = in
	f.mu.Unlock()
	return in
}

func (f *fleet) stop(name string) {
	f.h.t.Helper()
	f.mu.Lock()
	in := f.live[name]
	delete(f.live, name)
	f.mu.Unlock()
	if err := in.stop(); err != nil {
		f.h.t.Fatalf("stopping %s: %v", name, err)
	}
}

// instances are the live instances as the ownership sampler reads them.
func (f *fleet) instances() []ownership.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ownership.Instance
	for name, in := range f.live {
		out = append(out, ownership.Instance{Name: name, Running: in.activeRunning})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// activeRunning returns the active tasks in state running.
func (in *instance) activeRunning() map[string]bool {
	out := map[string]bool{}
	for _, ts := range in.rt.Tasks() {
		if ts.Role == "active" && ts.State == "running" {
			out[ts.Task] = true
		}
	}
	return out
}

func TestJoinStormInsideOneTransaction(t *testing.T) {
	// Scenario: exactly-once with a 2 s commit interval; while events flow,
	// B joins and C joins the moment B runs a task, then both leave, three
	// times: several revokes land inside one open transaction of A. No task
	// is ever running on two instances, and every total is exact.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.CommitInterval = 2 * time.Second
	h.cfg.CommitIdle = 0 // revokes land inside one open transaction
	f := newFleet(h, h.instanceCfg)
	var products []string
	for p := range int32(3) {
		for i := range 4 {
			products = append(products, productOn(fmt.Sprintf("storm-%d-%d-", p, i), p, 3))
		}
	}
	a := f.start("a")
	a.waitReady()
	sampler := ownership.Start(10*time.Millisecond, f.instances)
	sp := startSteadyProducer(h, products)

	runsOne := func(in *instance) func() bool { return func() bool { return len(in.activeRunning()) > 0 } }
	for round := range 3 {
		b := f.start("b")
		th.WaitFor(t, 60*time.Second, fmt.Sprintf("round %d: b running a task", round), th.Holds(runsOne(b)))
		c := f.start("c")
		th.WaitFor(t, 60*time.Second, fmt.Sprintf("round %d: c running a task", round), th.Holds(runsOne(c)))
		f.stop("c")
		f.stop("b")
	}
	th.WaitFor(t, 60*time.Second, "a running every task again", th.Holds(func() bool { return len(a.activeRunning()) == 3 }))
	before := sp.count()
	want := sp.halt()
	if before == 0 {
		t.Fatal("no event was produced during the storm")
	}
	a.waitTotals(want)
	got, _, _ := h.changelog(h.cfg)
	equalTotals(t, "changelog", got, want)
	res := sampler.Report()
	if len(res.Violations) > 0 {
		t.Fatalf("tasks ran on two instances at once:\n%s\ntimeline:\n%s", strings.Join(res.Violations, "\n"), strings.Join(res.Timeline, "\n"))
	}
	if res.Paired == 0 {
		t.Fatal("the sampler never read two instances at once")
	}
}

func TestWarmupUnderSteadyWritesDoesNotStorm(t *testing.T) {
	// Scenario: acceptable.recovery.lag 0 while events flow steadily: B joins A's group with no
	// state and builds a warm-up. The warm-up asks for a rebalance only when it is caught up by
	// the rule the leader applies, on the offsets it then reports, so the leader moves the task
	// at that rebalance; and it asks at most once per probing interval (one hour here). The
	// group does not rebalance every few seconds, and the totals are exact.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.AcceptableRecoveryLag = 0
	h.cfg.ProbingRebalanceInterval = time.Hour
	a := h.start(h.instanceCfg("a"))
	a.waitReady()
	want := spread(h, "warm", 100, 2)
	a.waitTotals(want)
	var products []string
	for p := range int32(3) {
		for i := range 4 {
			products = append(products, productOn(fmt.Sprintf("steady-%d-%d-", p, i), p, 3))
		}
	}
	sp := startSteadyProducer(h, products)

	b := h.start(h.instanceCfg("b"))
	th.WaitFor(t, 30*time.Second, "B to build a warm-up copy or run a task", th.Holds(func() bool {
		for _, ts := range b.copies() {
			if ts.Role == "warmup" {
				return true
			}
		}
		return len(b.activeRunning()) > 0
	}))
	// Long enough for several of the old 5 s re-probes.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && len(b.activeRunning()) == 0 {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Until(deadline))
	probes := b.logs.FilterMessageSnippet("Rejoining the group so that the balancer can move tasks").Len()
	rounds := a.logs.FilterMessageSnippet("Assigned tasks").Len() + b.logs.FilterMessageSnippet("Assigned tasks").Len()
	t.Logf("B asked for %d rebalances; %d balance rounds; B runs %v", probes, rounds, b.activeRunning())
	if probes > 1 {
		t.Fatalf("B asked for %d rebalances within 20 s with a one-hour probing interval", probes)
	}
	if probes == 1 && len(b.activeRunning()) == 0 {
		t.Fatal("B's caught-up warm-up asked for a rebalance, and the leader did not move the task to it")
	}
	sent := sp.halt()
	for p, v := range sent {
		want[p] += v
	}
	th.WaitFor(t, 30*time.Second, "every total on A or B", th.Holds(func() bool {
		for p, w := range want {
			ga, _ := a.total(p)
			gb, _ := b.total(p)
			if ga != w && gb != w {
				return false
			}
		}
		return true
	}))
}
