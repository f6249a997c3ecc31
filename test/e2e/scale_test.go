//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// What the multi-instance test holds the runtime to. The group runs with the
// default session timeout (45 s), so each bound is one that only the intended
// membership behaviour meets.
const (
	// scaleStaticRejoin: a member SIGKILLed and restarted on the same state
	// dir comes back under the same group.instance.id (derived from the state
	// dir's process id) and replaces its dead self at once; a dynamic member
	// would wait for the dead one's 45 s session to expire.
	scaleStaticRejoin = 15 * time.Second
	// scaleHandover: a member stopped with SIGTERM sends LeaveGroup
	// (leave.group.on.close, default true), so the others take its task at
	// once instead of after the 45 s session timeout.
	scaleHandover = 20 * time.Second
	// scaleSpread: a rebalance onto a new member: heartbeats (3 s) tell the
	// others, two cooperative rounds, the moved task restores.
	scaleSpread = 45 * time.Second
	// scalePartitions is the input topic's partition count: tasks 0_0..0_2.
	scalePartitions = 3
)

// TestSeveralInstancesOneGroup: on Apache Kafka, with the default group config, one group scales 1 → 3 → 2 → 3 (SIGTERM one for good, add one, SIGKILL one and restart it on its state dir) while events flow, some with an empty key or on a partition that does not own them; no two instances ever run one task, each product is served by exactly one instance with its exact total, the others name its task, and the changelog holds the same totals, under each guarantee.
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
	expect(t, 60*time.Second, "every product served by exactly one instance with its exact total", func() error {
		return servedOnce(live, want)
	})
	expect(t, 30*time.Second, "the changelog's latest committed totals to be exact", func() error {
		return checkChangelog(changelogTopic(appID), want)
	})
	sampler.report(t)
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

// taskStates reads GET /v1/tasks: task → state.
func (m *scaleMember) taskStates() (map[string]string, error) {
	var body struct {
		Tasks []struct {
			Task  string `json:"task"`
			State string `json:"state"`
		} `json:"tasks"`
	}
	if _, err := m.get("/v1/tasks", &body); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, t := range body.Tasks {
		out[t.Task] = t.State
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
func (m *scaleMember) answer(product string) (int, []byte, error) {
	resp, err := m.http.Get("http://" + m.httpAddr + "/v1/products/" + product)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := readAllLimited(resp)
	return resp.StatusCode, body, err
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

// servedOnce returns nil when every product of want is answered 200 with
// its exact total by exactly one of ms, the one running its task, while each
// other answers 404 or 503 naming the owning task in the field "task".
func servedOnce(ms []*scaleMember, want map[string]int64) error {
	runs := map[string]map[string]bool{}
	for _, m := range ms {
		runs[m.name] = m.running()
	}
	var bad []string
	for _, product := range sortedKeys(want) {
		owner := fmt.Sprintf("0_%d", keyPartition(product, scalePartitions))
		var served, problems []string
		for _, m := range ms {
			code, body, err := m.answer(product)
			var ans struct {
				Total int64  `json:"total"`
				Task  string `json:"task"`
			}
			_ = json.Unmarshal(body, &ans)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("%s: %v", m.name, err))
			case code == http.StatusOK:
				served = append(served, m.name)
				if ans.Total != want[product] {
					problems = append(problems, fmt.Sprintf("%s answered total %d, want %d", m.name, ans.Total, want[product]))
				}
				if !runs[m.name][owner] {
					problems = append(problems, fmt.Sprintf("%s answered 200 but does not run %s", m.name, owner))
				}
			case code == http.StatusNotFound || code == http.StatusServiceUnavailable:
				if ans.Task != owner {
					problems = append(problems, fmt.Sprintf("%s answered %d %s, want it to name task %q", m.name, code, strings.TrimSpace(string(body)), owner))
				}
			default:
				problems = append(problems, fmt.Sprintf("%s answered %d %s", m.name, code, strings.TrimSpace(string(body))))
			}
		}
		if len(served) != 1 {
			problems = append(problems, fmt.Sprintf("served (200) by %d instances %v, want exactly 1", len(served), served))
		}
		if len(problems) > 0 {
			bad = append(bad, fmt.Sprintf("%s (task %s): %s", product, owner, strings.Join(problems, "; ")))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d products wrong, e.g.:\n  %s", len(bad), len(want), strings.Join(bad[:min(8, len(bad))], "\n  "))
}

// scaleSampler polls every live instance's GET /v1/tasks and records each
// time two instances ran the same task at once. HTTP reads are not atomic,
// so a violation is bracketed: in one round each instance is read twice, in
// the same order (X1 … Y1 … X2 …), and task t is a violation when it is
// running in X1, in Y1 and in X2. It also keeps a timeline of who runs what.
type scaleSampler struct {
	f    *scaleFleet
	stop chan struct{}
	done chan struct{}

	mu         sync.Mutex
	rounds     int
	paired     int // rounds that read two instances or more
	violations map[scaleViolation]*scaleSpan
	timeline   []string
	picture    string
}

type scaleViolation struct{ task, first, second string }

type scaleSpan struct {
	samples     int
	from, until time.Time
}

func startScaleSampler(t *testing.T, f *scaleFleet) *scaleSampler {
	s := &scaleSampler{f: f, stop: make(chan struct{}), done: make(chan struct{}), violations: map[scaleViolation]*scaleSpan{}}
	go s.run()
	t.Cleanup(s.halt)
	return s
}

func (s *scaleSampler) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		ms := s.f.alive()
		n := len(ms)
		reads := make([]map[string]bool, 2*n)
		for k := range reads {
			reads[k] = ms[k%n].running()
		}
		now := time.Now()
		s.mu.Lock()
		s.rounds++
		if n >= 2 {
			s.paired++
		}
		for i := 0; i < n; i++ {
			for j := i + 1; j < n; j++ {
				s.check(now, ms[i], ms[j], reads[i], reads[j], reads[n+i])   // i1 < j1 < i2
				s.check(now, ms[j], ms[i], reads[j], reads[n+i], reads[n+j]) // j1 < i2 < j2
			}
		}
		var pic []string
		for i, m := range ms {
			var run []string
			for task := range reads[n+i] {
				run = append(run, task)
			}
			sort.Strings(run)
			pic = append(pic, fmt.Sprintf("%s=%v", m.name, run))
		}
		if p := strings.Join(pic, " "); p != s.picture {
			s.picture = p
			s.timeline = append(s.timeline, now.Format("15:04:05.000")+" "+p)
		}
		s.mu.Unlock()
	}
}

// check records the tasks x ran in both its reads x1, x2 while y ran them in
// its read between them. Called with s.mu held.
func (s *scaleSampler) check(at time.Time, x, y *scaleMember, x1, y1, x2 map[string]bool) {
	for task := range x1 {
		if !x2[task] || !y1[task] {
			continue
		}
		v := scaleViolation{task, x.name, y.name}
		if v.second < v.first {
			v.first, v.second = v.second, v.first
		}
		span := s.violations[v]
		if span == nil {
			span = &scaleSpan{from: at}
			s.violations[v] = span
		}
		span.samples++
		span.until = at
	}
}

func (s *scaleSampler) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// report halts the sampler, logs its timeline and fails the test listing
// its violations.
func (s *scaleSampler) report(t *testing.T) {
	t.Helper()
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("running tasks as sampled (%d rounds):\n  %s", s.rounds, strings.Join(s.timeline, "\n  "))
	if s.paired == 0 {
		t.Errorf("the ownership sampler never read two live instances in one round")
	}
	if len(s.violations) == 0 {
		return
	}
	var lines []string
	total := 0
	for v, span := range s.violations {
		total += span.samples
		lines = append(lines, fmt.Sprintf("%s–%s task %s running on %s and %s at once (%d samples)",
			span.from.Format("15:04:05.000"), span.until.Format("15:04:05.000"), v.task, v.first, v.second, span.samples))
	}
	sort.Strings(lines)
	t.Errorf("%d samples saw two instances running the same task at once:\n  %s", total, strings.Join(lines, "\n  "))
}
