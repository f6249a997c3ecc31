// Package ownership samples which instance runs which task, for the
// multi-instance tests, and finds tasks running on two instances at once.
package ownership

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Instance is one live instance of the group, as the sampler reads it.
type Instance struct {
	Name string
	// Running reads the instance's GET /v1/tasks and returns the tasks in
	// state "running" (nil when it cannot be read: a process starting or
	// gone runs nothing we can see).
	Running func() map[string]bool
}

// Sampler polls every live instance's GET /v1/tasks and records each time
// two instances ran the same task at once. HTTP reads are not atomic, so a
// violation is bracketed: in one round each instance is read twice, in the
// same order (X1 … Y1 … X2 …), and task t is a violation when it is running
// in X1, in Y1 and in X2: X ran it all along while Y ran it. It also keeps a
// timeline of who runs what.
type Sampler struct {
	every     time.Duration
	instances func() []Instance
	stop      chan struct{}
	done      chan struct{}

	mu         sync.Mutex
	rounds     int
	paired     int // rounds that read two instances or more
	violations map[violation]*violationSpan
	timeline   []string
	picture    string
}

// violation is a task seen running on two instances at once.
type violation struct{ task, first, second string }

type violationSpan struct {
	samples     int
	from, until time.Time
}

// Start samples, every interval, the instances that instances returns (the
// live ones) until Stop or Report.
func Start(every time.Duration, instances func() []Instance) *Sampler {
	s := &Sampler{every: every, instances: instances, stop: make(chan struct{}), done: make(chan struct{}),
		violations: map[violation]*violationSpan{}}
	go s.run()
	return s
}

func (s *Sampler) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(s.every):
		}
		ms := s.instances()
		n := len(ms)
		reads := make([]map[string]bool, 2*n)
		for k := range reads {
			reads[k] = ms[k%n].Running()
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
			pic = append(pic, fmt.Sprintf("%s=%v", m.Name, sortedTasks(reads[n+i])))
		}
		if p := strings.Join(pic, " "); p != s.picture {
			s.picture = p
			s.timeline = append(s.timeline, now.Format("15:04:05.000")+" "+p)
		}
		s.mu.Unlock()
	}
}

// check records the tasks x ran in both its reads x1, x2 while y ran them
// in its read between them. Called with s.mu held.
func (s *Sampler) check(at time.Time, x, y Instance, x1, y1, x2 map[string]bool) {
	for task := range x1 {
		if !x2[task] || !y1[task] {
			continue
		}
		v := violation{task, x.Name, y.Name}
		if v.second < v.first {
			v.first, v.second = v.second, v.first
		}
		span := s.violations[v]
		if span == nil {
			span = &violationSpan{from: at}
			s.violations[v] = span
		}
		span.samples++
		span.until = at
	}
}

func sortedTasks(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for task := range set {
		out = append(out, task)
	}
	sort.Strings(out)
	return out
}

// Stop stops the sampling and waits for the round in flight. It may be
// called more than once.
func (s *Sampler) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// Result is what a Sampler saw.
type Result struct {
	// Timeline lists who ran what, a line each time it changed:
	// "15:04:05.000 A=[0_0] B=[0_1 0_2]".
	Timeline []string
	// Rounds counts the sampling rounds, Paired those that read two
	// instances or more.
	Rounds, Paired int
	// Violations describes, sorted, each task seen running on two instances
	// at once: when, which task, on which two, in how many samples; Samples
	// sums those samples.
	Violations []string
	Samples    int
}

// Report stops the sampler and returns what it saw.
func (s *Sampler) Report() Result {
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := Result{Timeline: append([]string(nil), s.timeline...), Rounds: s.rounds, Paired: s.paired}
	for v, span := range s.violations {
		r.Samples += span.samples
		r.Violations = append(r.Violations, fmt.Sprintf("%s–%s task %s running on %s and %s at once (%d samples)",
			span.from.Format("15:04:05.000"), span.until.Format("15:04:05.000"), v.task, v.first, v.second, span.samples))
	}
	sort.Strings(r.Violations)
	return r
}
