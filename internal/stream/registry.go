package stream

import (
	"sort"
	"sync"
	"time"
)

// registry is what runs here: the tasks and standby copies by partition,
// the partitions the group gives this member, and the topology they are
// of. Status queries read it from any goroutine; the group session changes
// it. Nothing slow runs under mu: stopping a task or a copy happens after it
// was taken out.
type registry struct {
	mu struct {
		sync.Mutex
		// topo is the topology of the current group session (zero before
		// the topics are known).
		topo topology
		// tasks are the active tasks, by partition.
		tasks map[int32]*task
		// held are the partitions the latest assignment gives this member,
		// per task: heldInput and heldRepartition bits. A task runs only
		// while both are held.
		held map[int32]uint8
		// refused is why the latest assignment is not processed (partial
		// tasks, a partition count this process does not work with); ""
		// when it is.
		refused string
		// assigned: an assignment was received since the last revoke of
		// all.
		assigned bool
		// stopping: the session is shutting down; nothing new starts.
		stopping bool
		// restoring is the latest assignment's batch of tasks still
		// restoring, for the "Restoration took" line.
		restoring restoreBatch
		// standbys are the standby (and warm-up) copies running here.
		standbys map[int32]*standby
		// closing are the done channels of tasks stopping here: a copy of
		// the same task opens the store once they are closed.
		closing map[int32]<-chan struct{}
	}
}

// restoreBatch is the tasks of one assignment still restoring.
type restoreBatch struct {
	left  map[int32]bool
	names []string
	at    time.Time
}

// Bits of registry.mu.held.
const (
	heldInput uint8 = 1 << iota
	heldRepartition
	heldBoth = heldInput | heldRepartition
)

func newRegistry() *registry {
	r := &registry{}
	r.mu.tasks = make(map[int32]*task)
	r.mu.held = make(map[int32]uint8)
	r.mu.standbys = make(map[int32]*standby)
	r.mu.closing = make(map[int32]<-chan struct{})
	return r
}

// reset clears what one group session left, before the next.
func (r *registry) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.held = make(map[int32]uint8)
	r.mu.refused = ""
	r.mu.assigned = false
	r.mu.stopping = false
}

// setTopology records the topology of the session starting.
func (r *registry) setTopology(t topology) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.topo = t
}

// topology is the current session's topology.
func (r *registry) topology() topology {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.topo
}

// task returns the active task of partition p, nil when none runs here.
func (r *registry) task(p int32) *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.tasks[p]
}

// isCurrent reports whether t is still the task of its partition.
func (r *registry) isCurrent(t *task) bool { return r.task(t.partition) == t }

// tasks returns the active tasks sorted by partition.
func (r *registry) tasks() []*task {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := make([]*task, 0, len(r.mu.tasks))
	for _, t := range r.mu.tasks {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].partition < ts[j].partition })
	return ts
}

// partitions returns the partitions of the active tasks.
func (r *registry) partitions() []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := make([]int32, 0, len(r.mu.tasks))
	for p := range r.mu.tasks {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

// standby returns the copy of partition p running here, nil when none.
func (r *registry) standby(p int32) *standby {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.standbys[p]
}

// standbys returns the copies running here sorted by partition.
func (r *registry) standbys() []*standby {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*standby, 0, len(r.mu.standbys))
	for _, sb := range r.mu.standbys {
		out = append(out, sb)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].partition < out[j].partition })
	return out
}

// take removes the tasks of ps and returns them (stopping them is the
// caller's), marking each as closing until it is done.
func (r *registry) take(ps []int32) []*task {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ts []*task
	for _, p := range ps {
		if t, ok := r.mu.tasks[p]; ok {
			ts = append(ts, t)
			delete(r.mu.tasks, p)
			delete(r.mu.restoring.left, p)
			r.mu.closing[p] = t.life.done
		}
	}
	if len(r.mu.tasks) == 0 {
		r.mu.assigned = false
	}
	return ts
}

// closed records that the tasks taken are done with their stores.
func (r *registry) closed(ts []*task) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range ts {
		if r.mu.closing[t.partition] == (<-chan struct{})(t.life.done) {
			delete(r.mu.closing, t.partition)
		}
	}
}

// takeStandbys removes every copy and returns them (stopping them is the
// caller's).
func (r *registry) takeStandbys() []*standby {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*standby, 0, len(r.mu.standbys))
	for p, sb := range r.mu.standbys {
		out = append(out, sb)
		delete(r.mu.standbys, p)
	}
	return out
}

// beginStopping marks the session stopping: no task or copy starts any
// more. It returns the copies, taken out, for the caller to stop.
func (r *registry) beginStopping() []*standby {
	r.mu.Lock()
	r.mu.stopping = true
	r.mu.Unlock()
	return r.takeStandbys()
}

// release records that the group took parts back (the held bits) and
// clears the refusal once no partial task is left.
func (r *registry) release(parts map[string][]int32, bit func(topic string) uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for topic, tps := range parts {
		for _, p := range tps {
			r.mu.held[p] &^= bit(topic)
			if r.mu.held[p] == 0 {
				delete(r.mu.held, p)
			}
		}
	}
	for _, bits := range r.mu.held {
		if bits != heldBoth {
			return
		}
	}
	r.mu.refused = ""
}

// holds reports whether this member holds partition p of the topic with bit.
func (r *registry) holds(p int32, bit uint8) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.held[p]&bit != 0
}

// readiness is what Ready reads of the registry.
func (r *registry) readiness() (assigned, stopping bool, refused string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.assigned, r.mu.stopping, r.mu.refused
}
