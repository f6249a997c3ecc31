package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/ownership"
)

// What the multi-instance tests hold the runtime to. The group runs with the
// default session timeout (45 s), so each bound below is one that only the
// intended membership behaviour can meet.
const (
	// staticRejoinBound: a member SIGKILLed and restarted on the same state
	// dir comes back under the same group.instance.id (derived from the state
	// dir's process id) and replaces its dead self at once, with its tasks.
	// 30 s is below the 45 s a dynamic member would wait for the dead
	// member's session to expire, with room for a loaded 2-core machine.
	staticRejoinBound = 30 * time.Second
	// killRestartBound: the same, seen from the restore log of a single
	// instance: its first "Finished restoring changelog" line comes well
	// before the 45 s session timeout (a dynamic member is assigned nothing
	// until the killed member's session expires).
	killRestartBound = 30 * time.Second
	// handoverBound: a member stopped with SIGTERM sends LeaveGroup
	// (leave.group.on.close, default true), so the others take its task at
	// once; a static member that just went away would hold it for the 45 s
	// session timeout.
	handoverBound = 30 * time.Second
	// spreadBound: a rebalance onto a new member (two cooperative rounds,
	// the moved task restoring a small changelog) on 2 loaded cores.
	spreadBound = 60 * time.Second
	// scaleProducts is how many products the scale tests' events cover.
	scaleProducts = 60
	// inputPartitions is the input topic's partition count: tasks 0_0..0_2.
	inputPartitions = 3
)

// statusClient is the HTTP client of the multi-instance tests: a request to
// an instance being killed must not hang a sampling round.
var statusClient = &http.Client{Timeout: 2 * time.Second}

// taskInfo is the part of a GET /v1/tasks entry these tests read.
type taskInfo struct {
	Task      string `json:"task"`
	Partition int32  `json:"partition"`
	State     string `json:"state"`
	Processed int64  `json:"processed"`
}

// fetchServed is fetch that also returns the X-Served-By header.
func (p *proc) fetchServed(path string) (int, []byte, string, error) {
	resp, err := statusClient.Get(p.http + path)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Get("X-Served-By"), err
}

// fetch is get with statusClient's timeout.
func (p *proc) fetch(path string) (int, []byte, error) {
	resp, err := statusClient.Get(p.http + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// taskList reads GET /v1/tasks.
func (p *proc) taskList() ([]taskInfo, error) {
	code, body, err := p.fetch("/v1/tasks")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/tasks: HTTP %d: %s", code, strings.TrimSpace(string(body)))
	}
	var v struct {
		Tasks []taskInfo `json:"tasks"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("GET /v1/tasks: decoding %q: %w", body, err)
	}
	return v.Tasks, nil
}

// running returns the tasks GET /v1/tasks lists as "running" (nil when it
// cannot be read: a process starting or gone runs nothing we can see).
func (p *proc) running() map[string]bool {
	ts, err := p.taskList()
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, t := range ts {
		if t.State == "running" {
			out[t.Task] = true
		}
	}
	return out
}

// processed sums the "processed" counters of GET /v1/tasks.
func (p *proc) processed() int64 {
	ts, err := p.taskList()
	if err != nil {
		return 0
	}
	var n int64
	for _, t := range ts {
		n += t.Processed
	}
	return n
}

// eventually is waitFor reporting a timeout with t.Errorf instead of
// t.Fatalf, so that the scenario goes on and one run shows every property
// that fails. cond returns whether it holds and what it saw, for the message.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, saw := cond()
		if ok {
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("timed out after %s waiting for %s; last seen: %s", timeout, what, saw)
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// taskName is the name of the task owning partition p.
func taskName(p int32) string { return fmt.Sprintf("0_%d", p) }

// ownerTask is the task owning product: that of its murmur2 partition.
func ownerTask(product string) string {
	return taskName(sales.Partition([]byte(product), inputPartitions))
}

// member is one instance of the group.
type member struct {
	name string
	dir  string
	*proc
}

// fleet starts the instances of one group and lists the live ones for the
// sampler.
type fleet struct {
	t      *testing.T
	broker string
	args   []string

	mu      sync.Mutex
	members []*member
}

// start runs an instance on its own state dir and HTTP port.
func (f *fleet) start(name, dir string) *member {
	f.t.Helper()
	m := &member{name: name, dir: dir, proc: startService(f.t, f.broker, dir, nil, f.args...)}
	f.mu.Lock()
	f.members = append(f.members, m)
	f.mu.Unlock()
	return m
}

// alive returns the members whose process runs.
func (f *fleet) alive() []*member {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*member
	for _, m := range f.members {
		if m.alive() {
			out = append(out, m)
		}
	}
	return out
}

// runAll reports whether ms together run each task exactly once, and with
// onePerMember each of them exactly one, with what each lists as running.
func runAll(ms []*member, onePerMember bool) (bool, string) {
	ok := true
	owner := map[string]string{}
	var saw []string
	for _, m := range ms {
		ts, err := m.taskList()
		if err != nil {
			ok = false
			saw = append(saw, fmt.Sprintf("%s=? (%v)", m.name, err))
			continue
		}
		var run []string
		for _, t := range ts {
			if t.State == "running" {
				run = append(run, t.Task)
			}
		}
		sort.Strings(run)
		saw = append(saw, fmt.Sprintf("%s=%v", m.name, run))
		if onePerMember && len(run) != 1 {
			ok = false
		}
		for _, task := range run {
			if _, dup := owner[task]; dup {
				ok = false
			}
			owner[task] = m.name
		}
	}
	return ok && len(owner) == inputPartitions, strings.Join(saw, " ")
}

// salesProducer sends events for scaleProducts products, 10 every 100 ms,
// until stopped or max events are sent; want holds the totals of the events
// the broker acknowledged. About 20% have an empty key and 10% go to a
// partition that does not own their product, so that the repartition topic
// carries traffic.
type salesProducer struct {
	cl   *kgo.Client
	rng  *rand.Rand
	max  int
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	want map[string]int64
	sent int
	err  error
}

func startSalesProducer(t *testing.T, cl *kgo.Client, seed uint64, max int) *salesProducer {
	sp := &salesProducer{cl: cl, rng: rand.New(rand.NewPCG(seed, 11)), max: max,
		stop: make(chan struct{}), done: make(chan struct{}), want: map[string]int64{}}
	go sp.run()
	t.Cleanup(func() { sp.halt() })
	return sp
}

func (sp *salesProducer) run() {
	defer close(sp.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for sent := 0; sent < sp.max; {
		batch := map[string]int64{}
		var recs []*kgo.Record
		for range min(10, sp.max-sent) {
			product := fmt.Sprintf("scale-%02d", sp.rng.IntN(scaleProducts))
			v := int64(1 + sp.rng.IntN(500))
			batch[product] += v
			r := &kgo.Record{Topic: "sales-events-v1", Key: []byte(product), Value: []byte(fmt.Sprintf(`{"product":%q,"value":%d}`, product, v))}
			switch n := sp.rng.IntN(10); {
			case n < 2:
				r.Key = nil // grouped by the value's product
			case n == 2:
				owner := sales.Partition([]byte(product), inputPartitions)
				to := (owner + 1 + int32(sp.rng.IntN(inputPartitions-1))) % inputPartitions
				r.Headers = []kgo.RecordHeader{{Key: "to", Value: []byte{byte(to)}}}
			}
			recs = append(recs, r)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := sp.cl.ProduceSync(ctx, recs...).FirstErr()
		cancel()
		sp.mu.Lock()
		if err != nil {
			sp.err = fmt.Errorf("producing events %d..%d: %w", sent, sent+len(recs), err)
			sp.mu.Unlock()
			return
		}
		for p, v := range batch {
			sp.want[p] += v
		}
		sent += len(recs)
		sp.sent = sent
		sp.mu.Unlock()
		select {
		case <-sp.stop:
			return
		case <-tick.C:
		}
	}
}

// halt stops the producer after the batch in flight and waits for it.
func (sp *salesProducer) halt() {
	select {
	case <-sp.stop:
	default:
		close(sp.stop)
	}
	<-sp.done
}

// count returns the number of events acknowledged so far.
func (sp *salesProducer) count() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.sent
}

// totals halts the producer and returns the totals of what it sent.
func (sp *salesProducer) totals(t *testing.T) map[string]int64 {
	t.Helper()
	sp.halt()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.err != nil {
		t.Fatal(sp.err)
	}
	return sp.want
}

// startOwnershipSampler samples, every 100 ms until report or the end of
// the test, which of f's live instances runs which task.
func startOwnershipSampler(t *testing.T, f *fleet) *ownership.Sampler {
	s := ownership.Start(100*time.Millisecond, func() []ownership.Instance {
		var out []ownership.Instance
		for _, m := range f.alive() {
			out = append(out, ownership.Instance{Name: m.name, Running: m.running})
		}
		return out
	})
	t.Cleanup(s.Stop)
	return s
}

// reportOwnership stops s, logs its timeline and fails the test listing its
// violations.
func reportOwnership(t *testing.T, s *ownership.Sampler) {
	t.Helper()
	r := s.Report()
	t.Logf("running tasks as sampled (%d rounds):\n  %s", r.Rounds, strings.Join(r.Timeline, "\n  "))
	if r.Paired == 0 {
		t.Errorf("the ownership sampler never read two live instances in one round")
	}
	if len(r.Violations) == 0 {
		return
	}
	t.Errorf("%d samples saw two instances running the same task at once:\n  %s", r.Samples, strings.Join(r.Violations, "\n  "))
}

// servedByOwner reports whether every product of want is answered by every
// one of ms with its exact total, from the instance running its task (see
// ownership.CheckServed).
func servedByOwner(ms []*member, want map[string]int64) (bool, string) {
	qs := make([]ownership.Queried, 0, len(ms))
	for _, m := range ms {
		qs = append(qs, ownership.Queried{Name: m.name, Running: m.running(), Ask: func(product string) ownership.Answer {
			code, body, served, err := m.fetchServed("/v1/products/" + product)
			return ownership.Answer{Code: code, Body: body, ServedBy: served, Err: err}
		}})
	}
	problems := ownership.CheckServed(qs, want, ownerTask)
	return problems == "", problems
}

func sortedProducts(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// scaleCluster starts an in-process broker with the input topic created,
// and returns its address and a client producing with wrongPartitioner.
func scaleCluster(t *testing.T) (string, *kgo.Client) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close) // registered first: runs after the processes and the client are gone
	broker := cluster.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RecordPartitioner(wrongPartitioner{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), inputPartitions, 1, nil, "sales-events-v1"); err != nil {
		t.Fatal(err)
	}
	return broker, cl
}

func TestSeveralInstancesOneGroup(t *testing.T) {
	// Scenario: with the default group config, one group scales 1 → 3 → 2 → 3 (SIGTERM one, add one, SIGKILL and restart one) while events flow; no two instances ever run one task, every instance answers every product with its exact total, served by the instance running its task, and the changelog holds the same totals.
	for _, g := range []string{"exactly_once_v2", "at_least_once"} {
		t.Run(g, func(t *testing.T) { scaleTest(t, g) })
	}
}

func scaleTest(t *testing.T, guarantee string) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	broker, cl := scaleCluster(t)
	work := t.TempDir()
	// Default group config: no group.instance.id, no session.timeout.ms.
	f := &fleet{t: t, broker: broker, args: []string{"--processing.guarantee", guarantee}}
	sp := startSalesProducer(t, cl, seed, 8000)
	step := func(format string, args ...any) {
		t.Logf("%s (producer at %d events)", fmt.Sprintf(format, args...), sp.count())
	}

	a := f.start("A", filepath.Join(work, "a"))
	a.waitReady()
	step("A ready")
	sampler := startOwnershipSampler(t, f)

	b := f.start("B", filepath.Join(work, "b"))
	c := f.start("C", filepath.Join(work, "c"))
	if eventually(t, spreadBound, "the 3 tasks spread over A, B, C (one running task each)", func() (bool, string) {
		return runAll([]*member{a, b, c}, true)
	}) {
		step("tasks spread over A, B, C")
	}

	stopAt := time.Now()
	c.stop() // fails the test unless the exit is clean
	if eventually(t, handoverBound, "A and B to run all 3 tasks after C's SIGTERM", func() (bool, string) {
		return runAll([]*member{a, b}, false)
	}) {
		step("C stopped cleanly; A and B run all 3 tasks %s after the SIGTERM", time.Since(stopAt).Round(time.Millisecond))
	}

	d := f.start("D", filepath.Join(work, "d"))
	if eventually(t, spreadBound, "the 3 tasks spread over A, B, D (one running task each)", func() (bool, string) {
		return runAll([]*member{a, b, d}, true)
	}) {
		step("tasks spread over A, B, D")
	}

	eventually(t, 30*time.Second, "B to fold at least one event before its SIGKILL", func() (bool, string) {
		n := b.processed()
		return n > 0, fmt.Sprintf("B processed %d", n)
	})
	b.kill()
	restartAt := time.Now()
	b2 := f.start("B2", b.dir) // the same state dir, so the same group.instance.id
	if eventually(t, staticRejoinBound, "B, restarted on its state dir after SIGKILL, to run a task again", func() (bool, string) {
		r := b2.running()
		return len(r) > 0, fmt.Sprintf("B2 runs %v", r)
	}) {
		step("B SIGKILLed and restarted: runs a task again %s after its restart", time.Since(restartAt).Round(time.Millisecond))
	}

	want := sp.totals(t)
	step("producer done")
	live := []*member{a, b2, d}
	eventually(t, 60*time.Second, "every product answered by every instance with its exact total, from its owner", func() (bool, string) {
		return servedByOwner(live, want)
	})
	eventually(t, 30*time.Second, "the changelog's last committed totals to be exact", func() (bool, string) {
		got, n := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
		var diffs []string
		for _, p := range sortedProducts(want) {
			if got[p] != want[p] {
				diffs = append(diffs, fmt.Sprintf("%s=%d want %d", p, got[p], want[p]))
			}
		}
		if len(got) != len(want) {
			diffs = append(diffs, fmt.Sprintf("%d products, want %d", len(got), len(want)))
		}
		return len(diffs) == 0, fmt.Sprintf("%d records; %d differences, e.g. %v", n, len(diffs), diffs[:min(5, len(diffs))])
	})
	reportOwnership(t, sampler)
	for _, m := range live {
		m.stop()
	}
}

func TestRestartAfterKillNineRejoinsAtOnce(t *testing.T) {
	// Scenario: one instance with the default group config (45 s session timeout, no group.instance.id flag) is SIGKILLed while events flow and restarted on its state dir: it is assigned its tasks at once (static membership by default), not after the session timeout, and totals are exact.
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	broker, cl := scaleCluster(t)
	stateDir := t.TempDir()
	sp := startSalesProducer(t, cl, seed, 3000)

	p := startService(t, broker, stateDir, nil)
	p.waitReady()
	waitFor(t, 30*time.Second, "the instance to fold at least one event", func() bool {
		if !p.alive() {
			t.Fatalf("salesagg exited: %v; logs:\n%s", p.err, p.output())
		}
		return p.processed() > 0
	})
	p.kill()

	restartAt := time.Now()
	p = startService(t, broker, stateDir, nil)
	// Wait past the session timeout, so that a late assignment is measured, not only reported.
	waitFor(t, 60*time.Second, `the restarted instance's first "Finished restoring changelog" line`, func() bool {
		if !p.alive() {
			t.Fatalf("salesagg exited: %v; logs:\n%s", p.err, p.output())
		}
		_, tasks := p.restored()
		return tasks > 0
	})
	firstRestore := time.Since(restartAt)
	p.waitReady()
	d := time.Since(restartAt)
	t.Logf("restart after SIGKILL: first task restored in %s", firstRestore.Round(time.Millisecond))
	t.Logf("restart after SIGKILL: ready in %s", d.Round(time.Millisecond))
	if firstRestore > killRestartBound {
		t.Errorf(`restart after SIGKILL: first "Finished restoring changelog" line %s after the restart, want within %s: the restarted process waited for the killed member's session (45 s) instead of replacing it`,
			firstRestore.Round(time.Millisecond), killRestartBound)
	}

	want := sp.totals(t)
	t.Logf("producer done: %d events", sp.count())
	p.waitTotals(want, 60*time.Second)
	got, _ := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
	for _, product := range sortedProducts(want) {
		if got[product] != want[product] {
			t.Errorf("changelog %s = %d, want %d", product, got[product], want[product])
		}
	}
	p.stop()
}
