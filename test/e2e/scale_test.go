//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/ownership"
)

// What the multi-instance test holds the runtime to. The group runs with the
// default session timeout (45 s), so each bound is one that only the intended
// membership behaviour meets.
const (
	// scaleStaticRejoin: a member SIGKILLed and restarted on the same state
	// dir comes back under the same group.instance.id (derived from the state
	// dir's process id) and replaces its dead self at once; a dynamic member
	// would wait for the dead one's 45 s session to expire.
	scaleStaticRejoin = 30 * time.Second
	// scaleHandover: a member stopped with SIGTERM sends LeaveGroup
	// (leave.group.on.close, default true), so the others take its task at
	// once instead of after the 45 s session timeout.
	scaleHandover = 30 * time.Second
	// scaleSpread: a rebalance onto a new member: heartbeats (3 s) tell the
	// others, two cooperative rounds, the moved task restores.
	scaleSpread = 60 * time.Second
	// scalePartitions is the input topic's partition count: tasks 0_0..0_2.
	scalePartitions = 3
)

// TestSeveralInstancesOneGroup: on Apache Kafka, with the default group config, one group scales 1 → 3 → 2 → 3 (SIGTERM one for good, add one, SIGKILL one and restart it on its state dir) while events flow, some with an empty key or on a partition that does not own them; no two instances ever run one task, every instance answers every product with its exact total, served by the one running its task (one forwarding hop), and the changelog holds the same totals, under each guarantee.
func TestSeveralInstancesOneGroup(t *testing.T) {
	for _, g := range []string{"exactly_once_v2", "at_least_once"} {
		t.Run(g, func(t *testing.T) { severalInstances(t, g) })
	}
}

func severalInstances(t *testing.T, guarantee string) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x7363616c))
	appID, input, notif := testNames("scale-" + map[string]string{"exactly_once_v2": "eos", "at_least_once": "alos"}[guarantee])
	createTopic(t, input, scalePartitions, nil)

	// About 20% with an empty key, 10% on a partition that does not own
	// their product: the repartition topic carries traffic.
	events := genEvents(rng, "sc", 60, 6000)
	for i := range events {
		switch n := rng.IntN(10); {
		case n < 2:
			events[i].noKey = true
		case n == 2:
			owner := keyPartition(events[i].product, scalePartitions)
			events[i].misroute = true
			events[i].to = (owner + 1 + int32(rng.IntN(scalePartitions-1))) % scalePartitions
		}
	}
	want := totalsOf(events)

	// Default group config: no group.instance.id, no session.timeout.ms.
	work := t.TempDir()
	cfg := func(dir string) serviceConfig {
		return serviceConfig{appID: appID, stateDir: filepath.Join(work, dir), input: input, notif: notif, commitMs: 200,
			extra: []string{"--processing.guarantee", guarantee}}
	}
	var fl scaleFleet
	start := func(name, dir string) *scaleMember {
		t.Helper()
		m := &scaleMember{name: name, service: startService(t, cfg(dir))}
		fl.add(m)
		return m
	}
	pp := startPacedProducer(t, newClient(t, kgo.RecordPartitioner(headerPartitioner{})), input, events, 30, 200*time.Millisecond)
	step := func(format string, args ...any) {
		t.Logf("%s (producer at %d/%d events)", fmt.Sprintf(format, args...), pp.sent.Load(), len(events))
	}

	a := start("A", "a")
	a.waitReady(t, 90*time.Second)
	step("A ready")
	sampler := startScaleSampler(t, &fl)

	b := start("B", "b")
	c := start("C", "c")
	if expect(t, scaleSpread, "the 3 tasks spread over A, B, C (one running task each)", func() error {
		return runEach([]*scaleMember{a, b, c}, true)
	}) {
		step("tasks spread over A, B, C")
	}

	stopAt := time.Now()
	c.terminate(t) // fails the test unless the exit is clean
	if expect(t, scaleHandover, "A and B to run all 3 tasks after C's SIGTERM", func() error {
		return runEach([]*scaleMember{a, b}, false)
	}) {
		step("C stopped; A and B run all 3 tasks %s after the SIGTERM", time.Since(stopAt).Round(time.Millisecond))
	}

	d := start("D", "d")
	if expect(t, scaleSpread, "the 3 tasks spread over A, B, D (one running task each)", func() error {
		return runEach([]*scaleMember{a, b, d}, true)
	}) {
		step("tasks spread over A, B, D")
	}

	expect(t, 30*time.Second, "B to fold at least one event before its SIGKILL", func() error {
		tc, err := b.tasks()
		if err == nil && tc.Processed == 0 {
			err = fmt.Errorf("B processed 0 events; tasks %v", tc.States)
		}
		return err
	})
	b.kill()
	restartAt := time.Now()
	b2 := start("B2", "b") // the same state dir, so the same group.instance.id
	if expect(t, scaleStaticRejoin, "B, restarted on its state dir after SIGKILL, to run a task again", func() error {
		if r := b2.running(); len(r) == 0 {
			return fmt.Errorf("B2 runs no task")
		}
		return nil
	}) {
		step("B SIGKILLed and restarted: runs a task again %s after its restart", time.Since(restartAt).Round(time.Millisecond))
	}

	pp.wait(t, 2*time.Minute)
	step("producer done")
	live := []*scaleMember{a, b2, d}
	expect(t, 60*time.Second, "every product answered by every instance with its exact total, from its owner", func() error {
		return servedByOwner(live, want)
	})
	expect(t, 30*time.Second, "the changelog's latest committed totals to be exact", func() error {
		return checkChangelog(changelogTopic(appID), want)
	})
	reportScale(t, sampler)
	for _, m := range live {
		m.terminate(t)
	}
}

// expect is waitFor reporting a timeout with t.Errorf, so that the scenario
// goes on and one run shows every property that fails. It reports whether
// cond held in time.
func expect(t *testing.T, timeout time.Duration, what string, cond func() error) bool {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Errorf("timed out after %s waiting for %s: %v", timeout, what, err)
		return false
	}
	return true
}

// scaleMember is one instance of the group.
type scaleMember struct {
	name string
	*service
}

// taskStates reads GET /v1/tasks: active task → state (standby copies are
// left out).
func (m *scaleMember) taskStates() (map[string]string, error) {
	var body struct {
		Tasks []struct {
			Task  string `json:"task"`
			Role  string `json:"role"`
			State string `json:"state"`
		} `json:"tasks"`
	}
	if _, err := m.get("/v1/tasks", &body); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, t := range body.Tasks {
		if t.Role == "active" || t.Role == "" {
			out[t.Task] = t.State
		}
	}
	return out, nil
}

// copies reads GET /v1/tasks: standby copy → changelog lag (-1 unknown).
func (m *scaleMember) copies() (map[string]int64, error) {
	var body struct {
		Tasks []struct {
			Task  string `json:"task"`
			Role  string `json:"role"`
			State string `json:"state"`
			Lag   *int64 `json:"changelog_lag"`
		} `json:"tasks"`
	}
	if _, err := m.get("/v1/tasks", &body); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, t := range body.Tasks {
		if t.Role == "standby" || t.Role == "warmup" {
			out[t.Task] = -1
			if t.Lag != nil && t.State == "running" {
				out[t.Task] = *t.Lag
			}
		}
	}
	return out, nil
}

// running returns the tasks GET /v1/tasks lists as "running" (nil when it
// cannot be read).
func (m *scaleMember) running() map[string]bool {
	states, err := m.taskStates()
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for task, st := range states {
		if st == "running" {
			out[task] = true
		}
	}
	return out
}

// answer fetches GET /v1/products/{product}: status, body.
func (m *scaleMember) answer(product string) (int, []byte, string, error) {
	resp, err := m.http.Get("http://" + m.httpAddr + "/v1/products/" + product)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	body, err := readAllLimited(resp)
	return resp.StatusCode, body, resp.Header.Get("X-Served-By"), err
}

// scaleFleet lists the instances started, for the sampler.
type scaleFleet struct {
	mu      sync.Mutex
	members []*scaleMember
}

func (f *scaleFleet) add(m *scaleMember) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.members = append(f.members, m)
}

func (f *scaleFleet) alive() []*scaleMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*scaleMember
	for _, m := range f.members {
		if m.alive() {
			out = append(out, m)
		}
	}
	return out
}

// runEach returns nil when ms together run each task exactly once, and with
// onePerMember each of them exactly one; else what each runs.
func runEach(ms []*scaleMember, onePerMember bool) error {
	ok := true
	owner := map[string]bool{}
	var saw []string
	for _, m := range ms {
		states, err := m.taskStates()
		if err != nil {
			ok = false
			saw = append(saw, fmt.Sprintf("%s=? (%v)", m.name, err))
			continue
		}
		var run []string
		for task, st := range states {
			if st == "running" {
				run = append(run, task)
			}
		}
		sort.Strings(run)
		saw = append(saw, fmt.Sprintf("%s=%v", m.name, run))
		if onePerMember && len(run) != 1 {
			ok = false
		}
		for _, task := range run {
			if owner[task] {
				ok = false
			}
			owner[task] = true
		}
	}
	if ok && len(owner) == scalePartitions {
		return nil
	}
	return fmt.Errorf("running: %s", strings.Join(saw, " "))
}

// servedByOwner returns nil when every product of want is answered by
// every one of ms with its exact total, from the instance running its task
// (see ownership.CheckServed).
func servedByOwner(ms []*scaleMember, want map[string]int64) error {
	qs := make([]ownership.Queried, 0, len(ms))
	for _, m := range ms {
		qs = append(qs, ownership.Queried{Name: m.name, Running: m.running(), Ask: func(product string) ownership.Answer {
			code, body, served, err := m.answer(product)
			return ownership.Answer{Code: code, Body: body, ServedBy: served, Err: err}
		}})
	}
	taskOf := func(product string) string { return fmt.Sprintf("0_%d", keyPartition(product, scalePartitions)) }
	if problems := ownership.CheckServed(qs, want, taskOf); problems != "" {
		return errors.New(problems)
	}
	return nil
}

// startScaleSampler samples, every 100 ms until report or the end of the
// test, which of f's live instances runs which task.
func startScaleSampler(t *testing.T, f *scaleFleet) *ownership.Sampler {
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

// reportScale stops s, logs its timeline and fails the test listing its
// violations.
func reportScale(t *testing.T, s *ownership.Sampler) {
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
