package stream_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/status"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestCutOffFromTheCoordinatorDropsItsTasksBeforeTheyMove(t *testing.T) {
	// Scenario: instance A runs all three tasks; then the group coordinator stops answering A's
	// heartbeats (A is cut off from it, as when the coordinator's broker is paused or A's
	// network to it is down), and instance B joins. The coordinator expires A a session timeout
	// after its last heartbeat and gives B every task. A must have dropped its tasks before that:
	// at no sample does a task run on both, A says why it dropped them, and once A reaches the
	// coordinator again the group spreads the tasks and every total is exact.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		h.cfg.SessionTimeout = 6 * time.Second // the broker's group.min.session.timeout.ms
		cfgA, cfgB := h.instanceCfg("a"), h.instanceCfg("b")
		cfgA.GroupInstanceID, cfgB.GroupInstanceID = "lease-a", "lease-b"

		a := h.start(cfgA)
		a.waitReady()
		want := map[string]int64{}
		for i := range 30 {
			p := fmt.Sprintf("product%d", i)
			h.produce(event(p, p, int64(10+i)))
			want[p] += int64(10 + i)
		}
		a.waitTotals(want)
		if got := a.runningTasks(); len(got) != 3 {
			t.Fatalf("A runs %v before the cut, want all three tasks", got)
		}

		// Cut A off: its heartbeats (the group client's and its own) get no answer.
		var cut atomic.Bool
		released := make(chan struct{})
		var releaseOnce sync.Once
		release := func() { releaseOnce.Do(func() { cut.Store(false); close(released) }) }
		h.cluster.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			h.cluster.KeepControl()
			hb := req.(*kmsg.HeartbeatRequest)
			if cut.Load() && hb.InstanceID != nil && *hb.InstanceID == "lease-a" {
				h.cluster.SleepControl(func() { <-released })
			}
			return nil, nil, false
		})
		t.Cleanup(release) // before the instances stop: A's requests wait behind its heartbeat
		cut.Store(true)
		cutAt := time.Now()

		// Sample B before A: a task B runs at its sample that A still runs at the later sample
		// was active on both at once.
		var mu sync.Mutex
		var overlaps []string
		b := h.start(cfgB)
		samplerDone := make(chan struct{})
		stopSampling := make(chan struct{})
		go func() {
			defer close(samplerDone)
			for {
				select {
				case <-stopSampling:
					return
				case <-time.After(10 * time.Millisecond):
				}
				onB := b.runningTasks()
				onA := map[string]bool{}
				for _, task := range a.runningTasks() {
					onA[task] = true
				}
				for _, task := range onB {
					if onA[task] {
						mu.Lock()
						overlaps = append(overlaps, fmt.Sprintf("%s at %s after the cut", task, time.Since(cutAt).Round(time.Millisecond)))
						mu.Unlock()
					}
				}
			}
		}()
		th.WaitFor(t, 60*time.Second, "B to run all three tasks", th.Holds(func() bool { return len(b.runningTasks()) == 3 }))
		close(stopSampling)
		<-samplerDone
		mu.Lock()
		if len(overlaps) > 0 {
			t.Errorf("tasks active on A and B at once (%d samples): %s", len(overlaps), strings.Join(overlaps[:min(5, len(overlaps))], "; "))
		}
		mu.Unlock()
		lapsedAt, ok := logTime(a.logs, "No heartbeat answered by the group coordinator")
		if !ok {
			t.Fatal("A did not log that it dropped its tasks for want of a heartbeat answer")
		}
		movedAt, _ := logTime(b.logs, "Assigned partitions")
		t.Logf("A dropped its tasks %s after the cut; B was assigned %s after it", lapsedAt.Sub(cutAt).Round(time.Millisecond), movedAt.Sub(lapsedAt).Round(time.Millisecond))

		// A reaches the coordinator again: the tasks spread, nothing lost, nothing doubled.
		release()
		waitSpread(t, a, b)
		for i := range 30 {
			p := fmt.Sprintf("product%d", i)
			h.produce(event(p, p, 1000))
			want[p] += 1000
		}
		a.waitTotals(want)
		b.waitTotals(want)
		got, _, _ := h.changelog(h.cfg)
		equalTotals(t, "changelog", got, want)
	})
}

func TestACoordinatorThatStopsAnsweringIsLoggedOnceAndShownUntilItAnswers(t *testing.T) {
	// Scenario: A runs every task; the group coordinator stops answering A's heartbeats for less
	// than the session (its broker is failing over). A keeps its tasks and keeps serving; it
	// logs once what it waits for however many heartbeats go unanswered, /readyz and /v1/tasks
	// say so meanwhile, and once the coordinator answers A logs that, and both clear.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.SessionTimeout = 12 * time.Second // heartbeats every 3 s, the lease lapses 10.5 s after the last answer
	cfg := h.instanceCfg("a")
	cfg.GroupInstanceID = "waits-a"
	a := h.start(cfg)
	a.waitReady()
	h.produce(event("p1", "p1", 10))
	a.waitTotals(map[string]int64{"p1": 10})

	var cut atomic.Bool
	released := make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { cut.Store(false); close(released) }) }
	h.cluster.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		if cut.Load() {
			h.cluster.SleepControl(func() { <-released })
		}
		return nil, nil, false
	})
	t.Cleanup(release)
	cut.Store(true)

	th.WaitFor(t, 20*time.Second, "A to say it waits for the group coordinator, in /readyz and /v1/tasks", func() error {
		code, reason := a.readyz()
		if code != 200 || !strings.Contains(reason, "waiting for Kafka: the group coordinator") {
			return fmt.Errorf("/readyz %d %q", code, reason)
		}
		tasks := a.tasks()
		for _, tk := range tasks {
			if tk.Role == "active" && !strings.Contains(tk.Waiting, "Kafka: the group coordinator") {
				return fmt.Errorf("task %s waiting %q", tk.Task, tk.Waiting)
			}
		}
		if len(tasks) == 0 {
			return fmt.Errorf("no tasks")
		}
		return nil
	})
	// Held past a second unanswered heartbeat: still one line.
	unansweredSince, ok := logTime(a.logs, "Waiting for Kafka: the group coordinator")
	if !ok {
		t.Fatal("A did not log that it waits for the group coordinator")
	}
	th.WaitFor(t, 10*time.Second, "a second heartbeat interval to pass", th.Holds(func() bool {
		return time.Since(unansweredSince) > 3500*time.Millisecond
	}))
	if got := len(a.runningTasks()); got != 3 {
		t.Errorf("A runs %d tasks while the coordinator is silent for less than the session, want 3", got)
	}
	release()
	th.WaitFor(t, 20*time.Second, "A to log that the coordinator answers again", th.Holds(func() bool {
		return a.logs.FilterMessageSnippet("Kafka answered again: the group coordinator").Len() > 0
	}))
	if n := a.logs.FilterMessageSnippet("Waiting for Kafka: the group coordinator").Len(); n != 1 {
		t.Errorf("the wait for the group coordinator was logged %d times, want once", n)
	}
	th.WaitFor(t, 20*time.Second, "/readyz to say all tasks running, and nothing more", func() error {
		if code, reason := a.readyz(); code != 200 || reason != "all tasks running" {
			return fmt.Errorf("/readyz %d %q", code, reason)
		}
		return nil
	})
	h.produce(event("p1", "p1", 5))
	a.waitTotals(map[string]int64{"p1": 15})
}

// readyz reads GET /readyz: its status code and reason.
func (in *instance) readyz() (int, string) {
	var body struct {
		Reason string `json:"reason"`
	}
	code := in.getJSON("/readyz", &body)
	return code, body.Reason
}

// tasks reads GET /v1/tasks.
func (in *instance) tasks() []status.Task {
	var body struct {
		Tasks []status.Task `json:"tasks"`
	}
	in.getJSON("/v1/tasks", &body)
	return body.Tasks
}

// getJSON reads path's answer into v and returns its status code (0 when
// none came).
func (in *instance) getJSON(path string, v any) int {
	resp, err := http.Get(in.http.URL + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return 0
	}
	return resp.StatusCode
}

func TestRecordsPolledPastTheLeaseAreReadAgain(t *testing.T) {
	// Scenario: A runs every task; the group coordinator holds A's heartbeats past A's lease
	// deadline but answers them before it would expire A's session, so A keeps its tasks and the
	// group never rebalances. The lease lapses only 2 s past its deadline here (a test knob; the
	// lease loop checks every 50 ms), and events arrive in that window: A polls them for tasks
	// that are overdue. It must not hand them to the tasks (they could be another member's), and
	// it must read them again once the lease holds: every total is exact afterwards. Before,
	// at-least-once dropped them and the position moved on past them: the next commit skipped
	// events that were never folded (a loss with lag 0, seen once in the torture).
	eachGuarantee(t, func(t *testing.T, h *harness) {
		h.cfg.SessionTimeout = 6 * time.Second // the broker's group.min.session.timeout.ms
		cfg := h.instanceCfg("a")
		cfg.GroupInstanceID = "overdue-a"
		a := h.startWith(cfg, stream.Knobs{LeaseLapseDelay: 2 * time.Second})
		a.waitReady()
		want := map[string]int64{}
		for i := range 30 {
			p := fmt.Sprintf("product%d", i)
			h.produce(event(p, p, int64(10+i)))
			want[p] += int64(10 + i)
		}
		// Folded and flushed: no task checks its membership (a heartbeat,
		// held below too) while the window is open.
		a.waitTotals(want)

		// Hold A's heartbeats once one has passed: the coordinator then
		// last heard of A at passed, and expires it 6 s after that; A's
		// lease deadline is at most 5.25 s after it (the session less its
		// margin).
		var holding atomic.Bool
		passedCh := make(chan time.Time, 1)
		released := make(chan struct{})
		var releaseOnce sync.Once
		release := func() { releaseOnce.Do(func() { close(released) }) }
		t.Cleanup(release)
		h.cluster.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			h.cluster.KeepControl()
			hb := req.(*kmsg.HeartbeatRequest)
			if hb.InstanceID == nil || *hb.InstanceID != "overdue-a" {
				return nil, nil, false
			}
			if holding.Load() {
				h.cluster.SleepControl(func() { <-released })
				return nil, nil, false
			}
			select {
			case passedCh <- time.Now():
			default:
			}
			return nil, nil, false
		})
		for len(passedCh) > 0 {
			<-passedCh
		}
		var passed time.Time
		select {
		case passed = <-passedCh:
			holding.Store(true)
		case <-time.After(30 * time.Second):
			t.Fatal("no heartbeat of A passed")
		}
		time.Sleep(time.Until(passed.Add(5350 * time.Millisecond)))
		for i := range 30 {
			p := fmt.Sprintf("product%d", i)
			h.produce(event(p, p, 1000))
			want[p] += 1000
		}
		time.Sleep(time.Until(passed.Add(5700 * time.Millisecond)))
		release()

		if len(a.logs.FilterMessageSnippet("Records polled while the lease is past its deadline").All()) == 0 {
			t.Fatal("A polled no record while its lease was past its deadline: the scenario did not happen")
		}
		a.waitTotals(want)
		if n := len(a.logs.FilterMessageSnippet("No heartbeat answered by the group coordinator").All()); n > 0 {
			t.Fatalf("A's lease lapsed (%d times): the scenario did not happen", n)
		}
		if got := a.runningTasks(); len(got) != 3 {
			t.Fatalf("A runs %v, want all three tasks (no rebalance)", got)
		}
		got, _, _ := h.changelog(h.cfg)
		equalTotals(t, "changelog", got, want)
	})
}
