package harness

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/ownership"
)

// Member is one instance of a group.
type Member struct {
	Name string
	// Dir is its state dir: a member restarted on it comes back under the
	// same group.instance.id (derived from the dir's process id).
	Dir string
	*Service
}

// Fleet starts the instances of one group and lists the live ones, for the
// ownership sampler.
type Fleet struct {
	start func(stateDir string) *Service

	mu      sync.Mutex
	members []*Member // guarded by mu
}

// NewFleet returns a fleet whose members start runs, each on its state dir.
func NewFleet(start func(stateDir string) *Service) *Fleet { return &Fleet{start: start} }

// Start starts a member named name on state dir dir.
func (f *Fleet) Start(name, dir string) *Member {
	m := &Member{Name: name, Dir: dir, Service: f.start(dir)}
	f.mu.Lock()
	f.members = append(f.members, m)
	f.mu.Unlock()
	return m
}

// Forget leaves m out of the fleet (the sampler no longer reads it).
func (f *Fleet) Forget(m *Member) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.members = slices.DeleteFunc(f.members, func(x *Member) bool { return x == m })
}

// Alive returns the members whose process runs.
func (f *Fleet) Alive() []*Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Member
	for _, m := range f.members {
		if m.Alive() {
			out = append(out, m)
		}
	}
	return out
}

// Sample samples, every 100 ms until ReportOwnership or the end of the
// test, which of f's live members runs which task (test/ownership).
func (f *Fleet) Sample(t testing.TB) *ownership.Sampler {
	s := ownership.Start(100*time.Millisecond, func() []ownership.Instance {
		var out []ownership.Instance
		for _, m := range f.Alive() {
			out = append(out, ownership.Instance{Name: m.Name, Running: m.Running})
		}
		return out
	})
	t.Cleanup(s.Stop)
	return s
}

// ReportOwnership stops s, logs its timeline and fails the test listing
// its violations (two members running one task at once), or when it never
// read two members in one round.
func ReportOwnership(t testing.TB, s *ownership.Sampler) {
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

// RunEach returns nil when ms together run each of tasks tasks exactly
// once, and with onePerMember each of them exactly one; else what each
// runs.
func RunEach(ms []*Member, onePerMember bool, tasks int) error {
	ok := true
	owner := map[string]bool{}
	var saw []string
	for _, m := range ms {
		ts, err := m.Tasks()
		if err != nil {
			ok = false
			saw = append(saw, fmt.Sprintf("%s=? (%v)", m.Name, err))
			continue
		}
		var run []string
		for _, t := range ts {
			if t.Active() && t.State == "running" {
				run = append(run, t.Task)
			}
		}
		slices.Sort(run)
		saw = append(saw, fmt.Sprintf("%s=%v", m.Name, run))
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
	if ok && len(owner) == tasks {
		return nil
	}
	return fmt.Errorf("running: %s", strings.Join(saw, " "))
}

// TaskOf is the task owning product among partitions input partitions: the
// one of its murmur2 partition.
func TaskOf(product string, partitions int32) string {
	return fmt.Sprintf("0_%d", sales.Partition([]byte(product), partitions))
}

// ServedByOwner returns nil when every product of want is answered by every
// one of ms with its exact total, from the member running its task (see
// ownership.CheckServed).
func ServedByOwner(ms []*Member, want map[string]int64, partitions int32) error {
	qs := make([]ownership.Queried, 0, len(ms))
	for _, m := range ms {
		qs = append(qs, ownership.Queried{Name: m.Name, Running: m.Running(), Ask: func(product string) ownership.Answer {
			code, body, h, err := m.Get("/v1/products/" + product)
			return ownership.Answer{Code: code, Body: body, ServedBy: h.Get("X-Served-By"), Err: err}
		}})
	}
	if problems := ownership.CheckServed(qs, want, func(p string) string { return TaskOf(p, partitions) }); problems != "" {
		return errors.New(problems)
	}
	return nil
}
