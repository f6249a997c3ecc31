package stream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

// copies returns the instance's standby copies by task: role and
// changelog lag (-1 unknown).
func (in *instance) copies() map[string]status.Task {
	out := map[string]status.Task{}
	for _, ts := range in.rt.Tasks() {
		if ts.Role != "active" {
			out[ts.Task] = ts
		}
	}
	return out
}

// caughtUpCopies returns the tasks of the standby copies that are tailing
// with no lag.
func (in *instance) caughtUpCopies() []string {
	var out []string
	for task, ts := range in.copies() {
		if ts.State == "running" && ts.ChangelogLag != nil && *ts.ChangelogLag == 0 {
			out = append(out, task)
		}
	}
	return out
}

// spread produces n events for each of products products per partition
// (of 3) and returns the totals.
func spread(h *harness, prefix string, products, n int) map[string]int64 {
	want := map[string]int64{}
	var recs []*kgo.Record
	for p := range int32(3) {
		for i := range products {
			name := productOn(fmt.Sprintf("%s%d-%d-", prefix, p, i), p, 3)
			for v := range n {
				recs = append(recs, event(name, name, int64(v+1)))
				want[name] += int64(v + 1)
			}
		}
	}
	h.produce(recs...)
	return want
}

// promotions returns the "standby was N records behind; restored M
// records" lines logged: task -> records restored.
func (in *instance) promotions() map[string]int64 {
	out := map[string]int64{}
	for _, e := range in.logs.FilterMessageSnippet("standby was").All() {
		out[e.ContextMap()["task"].(string)] = e.ContextMap()["records"].(int64)
	}
	return out
}

func TestStandbyTailsServesAndIsPromoted(t *testing.T) {
	// Scenario: two instances with num.standby.replicas=1 share the three tasks, each task with a
	// standby copy on the other instance (never on its own). The copies tail the changelog to its
	// end, /v1/tasks lists them with their lag; when an owner's HTTP server is down, the other
	// instance answers its products from the standby copy, marked stale; when the owner stops,
	// the other takes its tasks over from the copies: it logs "standby was N records behind" and
	// restores a small tail instead of the whole changelog, with exact totals.
	h := newHarness(t)
	_, _, a, b := h.startPairWithStandbys()
	waitSpread(t, a, b)
	want := spread(h, "s", 40, 5) // 600 events, 120 products
	th.WaitFor(t, 30*time.Second, "a standby copy of every task, caught up, on the instance not running it", th.Holds(func() bool {
		got := map[string]bool{}
		for _, in := range []*instance{a, b} {
			running := strings.Join(in.runningTasks(), ",")
			for _, task := range in.caughtUpCopies() {
				if strings.Contains(running, task) {
					return false
				}
				got[task] = true
			}
		}
		return len(got) == 3
	}))
	a.waitTotals(want)
	// "Caught up" above was against the end each copy last saw; wait for
	// the end the owners committed since.
	h.waitCopiesAtEnd(a, b)
	for task, ts := range b.copies() {
		if ts.Checkpoint <= 0 || ts.Role != "standby" {
			t.Fatalf("B's copy of %s = %+v, want a standby at a checkpoint > 0", task, ts)
		}
	}

	// A's HTTP server goes away while A runs its tasks: B answers A's
	// products from its copies, marked stale by the copy's lag.
	a.http.Close()
	aTasks := a.runningTasks()
	checked := 0
	for p, w := range want {
		task := a.rt.TaskOf(p)
		if !strings.Contains(strings.Join(aTasks, ","), task) {
			continue
		}
		resp, body := getProduct(t, b, p)
		served, lag := resp.Header.Get("X-Served-By"), resp.Header.Get("X-Salesagg-Standby-Lag")
		if resp.StatusCode != http.StatusOK || body.Total != w || !body.Stale ||
			served != b.rt.InstanceID()+"; task="+task+"; standby" || lag != "0" {
			t.Fatalf("%s asked to B while its owner's server is down: %d total %d stale %v, X-Served-By %q, lag %q; want 200 %d from B's standby, lag 0",
				p, resp.StatusCode, body.Total, body.Stale, served, lag, w)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no product of A's tasks was checked")
	}
	// The lists too: B answers A's tasks from its copies, listed stale,
	// none unavailable.
	staleWant := slices.Clone(aTasks)
	sort.Strings(staleWant)
	var page struct {
		Products    []state.Total `json:"products"`
		Stale       []string      `json:"stale_tasks"`
		Unavailable []string      `json:"unavailable_tasks"`
	}
	code, raw := get(t, b.http.URL+"/v1/products?limit=1000")
	if err := json.Unmarshal([]byte(raw), &page); code != http.StatusOK || err != nil {
		t.Fatalf("/v1/products on B while A's server is down = %d %s (%v)", code, raw, err)
	}
	listed := map[string]int64{}
	for _, e := range page.Products {
		listed[e.Product] = e.Total
	}
	if !maps.Equal(listed, want) || !slices.Equal(page.Stale, staleWant) || len(page.Unavailable) > 0 {
		t.Fatalf("/v1/products on B while A's server is down: %d products (want %d, equal %v), stale %v (want %v), unavailable %v",
			len(listed), len(want), maps.Equal(listed, want), page.Stale, staleWant, page.Unavailable)
	}
	page.Products, page.Stale, page.Unavailable = nil, nil, nil
	code, raw = get(t, b.http.URL+"/v1/products?sort=total&limit=5")
	if err := json.Unmarshal([]byte(raw), &page); code != http.StatusOK || err != nil {
		t.Fatalf("/v1/products?sort=total on B while A's server is down = %d %s (%v)", code, raw, err)
	}
	if top := topOf(want, 5); !slices.Equal(page.Products, top) || !slices.Equal(page.Stale, staleWant) || len(page.Unavailable) > 0 {
		t.Fatalf("/v1/products?sort=total&limit=5 on B while A's server is down = %+v stale %v unavailable %v, want %+v stale %v",
			page.Products, page.Stale, page.Unavailable, top, staleWant)
	}

	// More events, then A stops: B takes A's tasks over from its copies.
	more := spread(h, "s", 40, 2)
	for p, v := range more {
		want[p] += v
	}
	b.waitTotals(onlyOn(b, want))
	// A's HTTP server is closed: ask its runtime.
	th.WaitFor(t, 30*time.Second, "A's totals of its tasks", th.Holds(func() bool {
		for p, w := range onlyOn(a, want) {
			if got, ok, err := a.rt.Total(p); err != nil || !ok || got != w {
				return false
			}
		}
		return true
	}))
	h.waitCopiesAtEnd(a, b)
	_, changelogRecords, _ := h.changelog(h.cfg)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	th.WaitFor(t, 30*time.Second, "B to run all three tasks", th.Holds(func() bool { return len(b.runningTasks()) == 3 }))
	b.waitTotals(want)
	promoted := b.promotions()
	var restored int64
	for _, task := range aTasks {
		n, ok := promoted[task]
		if !ok {
			t.Fatalf("B took %s over without a standby promotion line; promotions %v", task, promoted)
		}
		restored += n
	}
	// A full restore of A's tasks would replay about len(aTasks)/3 of the
	// changelog; the copies leave only what A wrote after they last read.
	if full := int64(changelogRecords) * int64(len(aTasks)) / 3; restored*4 > full {
		t.Fatalf("B restored %d records taking %v over from its copies; a full restore is about %d", restored, aTasks, full)
	}
	if c := b.copies(); len(c) != 0 {
		t.Fatalf("B alone keeps standby copies %v; a standby never runs beside its active task", c)
	}
}

// waitCopiesAtEnd waits until every standby copy on ins has applied its
// changelog partition up to the committed end (the last stable offset).
func (h *harness) waitCopiesAtEnd(ins ...*instance) {
	h.t.Helper()
	adm := kadm.NewClient(h.client())
	cl := h.cfg.ChangelogTopic()
	th.WaitFor(h.t, 30*time.Second, "the standby copies at the changelog's committed end", th.Holds(func() bool {
		ends, err := adm.ListCommittedOffsets(context.Background(), cl)
		if err != nil || ends.Error() != nil {
			return false
		}
		for _, in := range ins {
			for _, ts := range in.copies() {
				end, ok := ends.Lookup(cl, ts.Partition)
				if !ok || ts.State != "running" || ts.Checkpoint != end.Offset {
					return false
				}
			}
		}
		return true
	}))
}

// onlyOn returns the products of want whose task runs on in.
func onlyOn(in *instance, want map[string]int64) map[string]int64 {
	running := strings.Join(in.runningTasks(), ",")
	out := map[string]int64{}
	for p, w := range want {
		if strings.Contains(running, in.rt.TaskOf(p)) {
			out[p] = w
		}
	}
	return out
}

func TestWarmupTakesOverOnceCaughtUp(t *testing.T) {
	// Scenario: A runs the three tasks with a changelog well past acceptable.recovery.lag; B joins
	// with no state. Caught-up first: B is given no active task at once but a warm-up copy of the
	// task it should run; once the copy caught up, B asks for a rebalance itself, and the task
	// moves to B, which restores only the small tail the copy lacked (never the whole task). The
	// totals are exact on both.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.AcceptableRecoveryLag = 100
	h.cfg.ProbingRebalanceInterval = time.Hour // only the warm-up's own rejoin can move the task
	cfgA, cfgB := h.instanceCfg("a"), h.instanceCfg("b")
	a := h.start(cfgA)
	a.waitReady()
	want := spread(h, "w", 200, 2) // 1,200 events: ~400 changelog records per task
	a.waitTotals(want)

	b := h.start(cfgB)
	th.WaitFor(t, 30*time.Second, "B to build a warm-up copy", th.Holds(func() bool {
		for _, ts := range b.copies() {
			if ts.Role == "warmup" {
				return true
			}
		}
		return len(b.promotions()) > 0
	}))
	if r := b.runningTasks(); len(r) != 0 && len(b.promotions()) == 0 {
		t.Fatalf("B runs %v before any warm-up caught up", r)
	}
	th.WaitFor(t, 30*time.Second, "a task to move to B", th.Holds(func() bool { return len(b.runningTasks()) == 1 && len(a.runningTasks()) == 2 }))
	if _, ok := logTime(b.logs, "Rejoining the group so that the balancer can move tasks"); !ok {
		t.Fatal("B did not ask for the rebalance that moved the task")
	}
	task := b.runningTasks()[0]
	n, ok := b.promotions()[task]
	if !ok {
		t.Fatalf("B took %s over without a standby promotion line", task)
	}
	if n > 100 {
		t.Fatalf("B restored %d records of %s from its warm-up; acceptable.recovery.lag is 100", n, task)
	}
	for _, e := range b.logs.FilterMessageSnippet("Finished restoring changelog").All() {
		if r := e.ContextMap()["records"].(int64); r > 200 {
			t.Fatalf("B restored %d records at once (%s): a cold restore, not a warm-up hand-over", r, e.Message)
		}
	}
	more := spread(h, "w", 200, 1)
	for p, v := range more {
		want[p] += v
	}
	for _, in := range []*instance{a, b} {
		in.waitTotals(want)
	}
}

func TestStandbyAnswersWhileTheOwnerRestores(t *testing.T) {
	// Scenario: A and B with num.standby.replicas=1; A stops and B runs every task; A starts again
	// on its state dir, gets its tasks back (caught up) but its restore is held. A query to B for
	// a product of A's tasks is forwarded to A, which answers 503 (restoring), so B answers from
	// the standby copy it kept when it gave the task back, marked stale; A itself answers the same
	// way by forwarding to B. Once A's restore is let go, A answers from its own task.
	h := newHarness(t)
	cfgA, _, a, b := h.startPairWithStandbys()
	waitSpread(t, a, b)
	want := spread(h, "r", 20, 3)
	a.waitTotals(want)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	th.WaitFor(t, 30*time.Second, "B to run all three tasks", th.Holds(func() bool { return len(b.runningTasks()) == 3 }))

	hold := make(chan struct{})
	a2 := h.startWith(cfgA, stream.Knobs{BeforeRestore: func(ctx context.Context, _ int32) {
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}})
	var aTask, product string
	th.WaitFor(t, 30*time.Second, "A to get a task back and hold its restore, B to keep a copy of it", th.Holds(func() bool {
		for _, ts := range a2.rt.Tasks() {
			if ts.Role == "active" && ts.State == "restoring" {
				if c, ok := b.copies()[ts.Task]; ok && c.State == "running" && c.ChangelogLag != nil && *c.ChangelogLag == 0 {
					aTask = ts.Task
					return true
				}
			}
		}
		return false
	}))
	for p := range want {
		if a2.rt.TaskOf(p) == aTask {
			product = p
			break
		}
	}
	for _, in := range []*instance{b, a2} {
		resp, body := getProduct(t, in, product)
		served := resp.Header.Get("X-Served-By")
		if resp.StatusCode != http.StatusOK || body.Total != want[product] || !body.Stale || served != b.rt.InstanceID()+"; task="+aTask+"; standby" {
			t.Fatalf("%s (task %s restoring on A) asked to %s: %d total %d stale %v X-Served-By %q; want 200 %d from B's standby",
				product, aTask, in.rt.InstanceID(), resp.StatusCode, body.Total, body.Stale, served, want[product])
		}
	}
	close(hold)
	a2.waitReady()
	th.WaitFor(t, 30*time.Second, "A to answer from its own task", th.Holds(func() bool {
		code, total, served := a2.query(t, product)
		return code == http.StatusOK && total == want[product] && served == a2.rt.InstanceID()+"; task="+aTask
	}))
}

func TestExactlyOnceBoundsItsChangedProducts(t *testing.T) {
	// Scenario: exactly-once with a commit interval of five minutes, 110,000 distinct products
	// arrive on one partition: past 100,000 changed products the task asks for the transaction
	// cycle early, so their totals are committed and answered well before the interval ends
	// (without the bound they would all wait in memory for the minute).
	h := newHarness(t)
	h.createInput(3)
	// An interval no slow machine reaches within the test: a commit before
	// it can only be the bound's.
	h.cfg.CommitInterval = 5 * time.Minute
	h.cfg.CommitIdle = 0
	h.cfg.TransactionTimeoutSet = 10 * time.Minute
	in := h.start(h.cfg)
	in.waitReady()
	const n = 110_000
	var recs []*kgo.Record
	first := ""
	for i := 0; len(recs) < n; i++ {
		name := fmt.Sprintf("d%d", i)
		if a := in.rt.TaskOf(name); a != "0_0" {
			continue
		}
		if first == "" {
			first = name
		}
		recs = append(recs, event(name, name, 1))
	}
	began := time.Now()
	h.produce(recs...)
	th.WaitFor(t, 3*time.Minute, "the first products committed before the commit interval", th.Holds(func() bool {
		got, _ := in.total(first)
		return got == 1
	}))
	if d := time.Since(began); d >= h.cfg.CommitInterval {
		t.Fatalf("committed after %s: the commit interval, not the bound", d)
	}
}

func TestAbortedTransactionKeepsCachedEntries(t *testing.T) {
	// Scenario: exactly-once, A runs the three tasks with their products' entries in its cache;
	// events for the same products keep flowing while B and then C join: the rebalances abort
	// A's open transactions, so the tasks A keeps fold the rewound input again. Every event is
	// counted once: an aborted fold must leave no trace in the cached entries (a redelivery that
	// looked already reflected would be lost).
	h := newHarness(t)
	h.createInput(3)
	cfgA, cfgB, cfgC := h.instanceCfg("a"), h.instanceCfg("b"), h.instanceCfg("c")
	a := h.start(cfgA)
	a.waitReady()
	want := spread(h, "c", 10, 1)
	a.waitTotals(want)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for round := 0; ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			for p, v := range spread(h, "c", 10, 1) {
				want[p] += v
			}
		}
	}()
	b := h.start(cfgB)
	th.WaitFor(t, 30*time.Second, "B to run a task", th.Holds(func() bool { return len(b.runningTasks()) > 0 }))
	c := h.start(cfgC)
	th.WaitFor(t, 30*time.Second, "C to run a task", th.Holds(func() bool { return len(c.runningTasks()) > 0 }))
	close(stop)
	<-done
	if a.logs.FilterMessageSnippet("Transaction aborted").Len() == 0 {
		t.Fatal("no transaction of A aborted: the scenario did not exercise a rewound fold")
	}
	for _, in := range []*instance{a, b, c} {
		in.waitTotals(want)
	}
}

// productAnswer is the body of GET /v1/products/{product}.
type productAnswer struct {
	Total int64 `json:"total"`
	Stale bool  `json:"stale"`
}

// getProduct asks in for a product; the body is decoded when it is JSON
// (zero otherwise) and closed.
func getProduct(t *testing.T, in *instance, product string) (*http.Response, productAnswer) {
	t.Helper()
	resp, err := http.Get(in.http.URL + "/v1/products/" + product)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body productAnswer
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp, body
}
