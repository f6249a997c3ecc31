package stream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest/observer"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

// productOn returns a product name owned by partition p of n.
func productOn(prefix string, p, n int32) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s%d", prefix, i)
		if sales.Partition([]byte(name), n) == p {
			return name
		}
	}
}

// runningTasks returns the tasks the instance lists as running.
func (in *instance) runningTasks() []string {
	var out []string
	for _, ts := range in.rt.Tasks() {
		if ts.Role == "active" && ts.State == "running" {
			out = append(out, ts.Task)
		}
	}
	return out
}

// logTime returns the time of the first log entry whose message contains
// snippet, and whether there is one.
func logTime(logs *observer.ObservedLogs, snippet string) (time.Time, bool) {
	es := logs.FilterMessageSnippet(snippet).All()
	if len(es) == 0 {
		return time.Time{}, false
	}
	return es[0].Time, true
}

func TestRevokeDuringLongRestore(t *testing.T) {
	// Scenario: instance A owns all three tasks, and task 0_2's restore is held (a restore that
	// never ends); instance B joins, the balancer moves 0_2 to B: A abandons the restore within a
	// second of the revoke, its other tasks keep processing meanwhile, and B runs 0_2.
	h := newHarness(t)
	h.createInput(3)
	cfgA, cfgB := h.instanceCfg("a"), h.instanceCfg("b")
	var held atomic.Bool
	a := h.startWith(cfgA, stream.Knobs{BeforeRestore: func(ctx context.Context, p int32) {
		if p == 2 && held.CompareAndSwap(false, true) {
			<-ctx.Done() // the first restore of 0_2 is held until the task is stopped
		}
	}})
	p0, p1, p2 := productOn("r", 0, 3), productOn("r", 1, 3), productOn("r", 2, 3)
	th.WaitFor(t, 30*time.Second, "A to run 0_0 and 0_1", th.Holds(func() bool { return len(a.runningTasks()) == 2 }))
	h.produce(event(p0, p0, 5), event(p1, p1, 7))
	a.waitTotals(map[string]int64{p0: 5, p1: 7})

	b := h.start(cfgB)
	th.WaitFor(t, 30*time.Second, "B to run 0_2", th.Holds(func() bool {
		r := b.runningTasks()
		return len(r) == 1 && r[0] == "0_2"
	}))
	// The instance that takes a task says where it came from and what it restored.
	if got := b.logs.FilterMessageSnippet("task [0_2] Took over from " + a.rt.InstanceID() + ": restored 0 records").Len(); got != 1 {
		t.Fatalf("B logged %d 'Took over from A' lines for 0_2, want 1", got)
	}
	revokedAt, ok := logTime(a.logs, "Revoking tasks")
	if !ok {
		t.Fatal("A logged no revoke")
	}
	canceledAt, ok := logTime(a.logs, "task [0_2] Restore canceled")
	if !ok {
		t.Fatal("A did not cancel the restore of 0_2")
	}
	// The held restore never ends on its own: any bounded delay shows it
	// was abandoned; the bound leaves room for a loaded machine.
	if d := canceledAt.Sub(revokedAt); d > 5*time.Second {
		t.Fatalf("A took %s to abandon the restore of the revoked task, want under 5s", d)
	}
	if r := a.runningTasks(); strings.Join(r, ",") != "0_0,0_1" {
		t.Fatalf("A runs %v, want 0_0 and 0_1", r)
	}
	h.produce(event(p0, p0, 1), event(p1, p1, 1), event(p2, p2, 3))
	a.waitTotals(map[string]int64{p0: 6, p1: 8})
	b.waitTotals(map[string]int64{p2: 3})
	// A product of a task another member runs names the task and its owner.
	if _, _, err := a.rt.Total(p2); err == nil || !strings.Contains(err.Error(), "task 0_2") || !strings.Contains(err.Error(), b.rt.InstanceID()) {
		t.Fatalf("A's answer for %s = %v, want it to name task 0_2 and member %s", p2, err, b.rt.InstanceID())
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	// B left the group on close: A takes 0_2 back without waiting out B's session.
	th.WaitFor(t, 15*time.Second, "A to run all three tasks after B left", th.Holds(func() bool { return len(a.runningTasks()) == 3 }))
	a.waitTotals(map[string]int64{p0: 6, p1: 8, p2: 3})
}

func TestInputTopicRecreatedWhileRunning(t *testing.T) {
	// Scenario: the input topic is deleted and recreated while the service runs; the new
	// topic's offsets start at 0 again, below the offsets the totals reflect: new events are
	// counted (not taken for redeliveries), on top of the totals from before.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		in := h.startWith(h.cfg, stream.Knobs{TopologyCheckEvery: 200 * time.Millisecond})
		in.waitReady()
		var recs []*kgo.Record
		want := map[string]int64{}
		for i := 0; i < 60; i++ {
			p := fmt.Sprintf("re%d", i%6)
			recs = append(recs, event(p, p, 10))
			want[p] += 10
		}
		h.produce(recs...)
		in.waitTotals(want)

		adm := kadm.NewClient(h.client())
		ctx := context.Background()
		if _, err := adm.DeleteTopic(ctx, h.cfg.InputTopic); err != nil {
			t.Fatal(err)
		}
		th.WaitFor(t, 20*time.Second, "the service to see the input topic missing", th.Holds(func() bool {
			return in.logs.FilterMessageSnippet("Input topic is missing").Len() > 0
		}))
		th.WaitFor(t, 20*time.Second, "the input topic to be recreated", th.Holds(func() bool {
			resp, err := adm.CreateTopic(ctx, 3, 1, nil, h.cfg.InputTopic)
			return err == nil && resp.Err == nil
		}))
		// Fewer events than before, so every new offset is below the reflected ones.
		recs = recs[:0]
		for i := 0; i < 12; i++ {
			p := fmt.Sprintf("re%d", i%6)
			recs = append(recs, event(p, p, 1))
			want[p]++
		}
		h.produce(recs...)
		th.WaitFor(t, 30*time.Second, "the service to rejoin on the new topic", th.Holds(func() bool {
			return in.logs.FilterMessageSnippet("Input topic changed while running").Len() > 0
		}))
		in.waitTotals(want)
	})
}

func TestShutdownRightAfterAPollKeepsItsRecords(t *testing.T) {
	// Scenario: the shutdown begins just after a poll returned records (SIGTERM at that moment):
	// those records are folded and committed with the last cycle, or not committed at all, never
	// committed unfolded; after a restart every total is exact.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		var armed atomic.Bool
		var stopNow context.CancelFunc
		var stoppedAt atomic.Int64
		in := h.startWith(h.cfg, stream.Knobs{AfterPoll: func(records int) {
			if records > 0 && armed.CompareAndSwap(true, false) {
				stoppedAt.Store(int64(records))
				stopNow()
			}
		}})
		in.waitReady()
		want := map[string]int64{}
		batch := func(value int64) {
			var recs []*kgo.Record
			for i := 0; i < 30; i++ {
				p := fmt.Sprintf("sd%d", i%5)
				recs = append(recs, event(p, p, value))
				want[p] += value
			}
			h.produce(recs...)
		}
		batch(2)
		in.waitTotals(want)
		stopNow = in.cancel
		armed.Store(true)
		batch(3)
		select {
		case err := <-in.done:
			if err != nil {
				t.Fatal(err)
			}
			in.done <- nil // for in.stop
		case <-time.After(30 * time.Second):
			t.Fatal("the runtime did not stop after the poll")
		}
		if stoppedAt.Load() == 0 {
			t.Fatal("the shutdown did not begin after a poll that returned records")
		}
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		again := h.start(h.cfg)
		again.waitReady()
		again.waitTotals(want)
	})
}

// query reads GET /v1/products/{product} from in: status, total and X-Served-By.
func (in *instance) query(t *testing.T, product string) (int, int64, string) {
	t.Helper()
	resp, err := http.Get(in.http.URL + "/v1/products/" + product)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Total int64 `json:"total"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Total, resp.Header.Get("X-Served-By")
}

func TestQueriesFromAnyInstance(t *testing.T) {
	// Scenario: two instances share the three tasks; every product asked to either instance is
	// answered 200 with its exact total by the instance running its task (one forwarding hop,
	// X-Served-By names it); /v1/instances lists both with their tasks; /v1/products gathers
	// every owner's page; when an owner's HTTP server is down, the other answers 503 naming it
	// and lists its tasks as unavailable.
	h := newHarness(t)
	h.createInput(3)
	cfgA, cfgB := h.instanceCfg("a"), h.instanceCfg("b")
	a := h.start(cfgA)
	a.waitReady()
	b := h.start(cfgB)
	th.WaitFor(t, 30*time.Second, "the tasks to spread over A and B", th.Holds(func() bool {
		return len(a.runningTasks()) == 2 && len(b.runningTasks()) == 1
	}))
	want := map[string]int64{}
	var recs []*kgo.Record
	for i := 0; i < 30; i++ {
		p := fmt.Sprintf("q%d", i%10)
		recs = append(recs, event(p, p, int64(i+1)))
		want[p] += int64(i + 1)
	}
	h.produce(recs...)
	runsOn := func(product string) *instance {
		task := a.rt.TaskOf(product)
		for _, r := range b.runningTasks() {
			if r == task {
				return b
			}
		}
		return a
	}
	th.WaitFor(t, 30*time.Second, "every product answered by both instances", th.Holds(func() bool {
		for p, w := range want {
			for _, in := range []*instance{a, b} {
				code, total, served := in.query(t, p)
				owner := runsOn(p)
				if code != http.StatusOK || total != w || served != owner.rt.InstanceID()+"; task="+a.rt.TaskOf(p) {
					return false
				}
			}
		}
		return true
	}))
	for _, in := range []*instance{a, b} {
		code, body := get(t, in.http.URL+"/v1/instances")
		if code != http.StatusOK || !strings.Contains(body, a.rt.InstanceID()) || !strings.Contains(body, b.rt.InstanceID()) ||
			!strings.Contains(body, `"tasks":["0_2"]`) || !strings.Contains(body, `"tasks":["0_0","0_1"]`) {
			t.Fatalf("/v1/instances = %d %s", code, body)
		}
		code, body = get(t, in.http.URL+"/v1/products?limit=1000")
		for p := range want {
			if code != http.StatusOK || !strings.Contains(body, fmt.Sprintf(`{"product":%q,"total":%d}`, p, want[p])) {
				t.Fatalf("/v1/products on one instance lacks %s: %d %s", p, code, body)
			}
		}
		// The top three by total, gathered from both instances' stores.
		code, body = get(t, in.http.URL+"/v1/products?sort=total&limit=3")
		var top struct {
			Products []state.Total `json:"products"`
			Sort     string        `json:"sort"`
		}
		if err := json.Unmarshal([]byte(body), &top); code != http.StatusOK || err != nil {
			t.Fatalf("/v1/products?sort=total&limit=3 = %d %s (%v)", code, body, err)
		}
		if got, want := top.Products, topOf(want, 3); top.Sort != "total" || !slices.Equal(got, want) {
			t.Fatalf("/v1/products?sort=total&limit=3 on %s = %+v (sort %q), want %+v", in.rt.InstanceID(), got, top.Sort, want)
		}
	}

	// B's HTTP server goes away while B keeps its task.
	b.http.Close()
	var onB string
	for p := range want {
		if runsOn(p) == b {
			onB = p
			break
		}
	}
	code, body := get(t, a.http.URL+"/v1/products/"+onB)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, b.rt.InstanceID()) || !strings.Contains(body, `"task":"0_2"`) {
		t.Fatalf("query for %s while its owner's server is down = %d %s", onB, code, body)
	}
	if code, body := get(t, a.http.URL+"/v1/products"); code != http.StatusOK || !strings.Contains(body, `"unavailable_tasks":["0_2"]`) {
		t.Fatalf("/v1/products while B's server is down = %d %s", code, body)
	}
}

// topOf returns the n largest of totals, equal totals by product.
func topOf(totals map[string]int64, n int) []state.Total {
	var all []state.Total
	for p, v := range totals {
		all = append(all, state.Total{Product: p, Total: v})
	}
	state.SortByTotal(all)
	return all[:min(n, len(all))]
}
