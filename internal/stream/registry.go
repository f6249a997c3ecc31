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
	// mu guards every field inside it.
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
		// closing are, by partition, the tasks and copies taken out here
		// that may still hold the partition's store: a new task or copy
		// of it opens the store once they are all done with it. A copy
		// stays here until its store is closed, whoever took it over: a
		// task stopped before the copy closed leaves it for the next one.
		// What is done is dropped when the partition's list is next read
		// or added to (see pendingLocked).
		closing map[int32][]closer
	}
}

// closer is a task or copy taken out of the registry, until it is done
// with its store: done is closed then; copy is the copy (nil: a task).
type closer struct {
	done <-chan struct{}
	copy *standby
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
	r.mu.closing = make(map[int32][]closer)
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
			r.addClosingLocked(p, closer{done: t.life.done})
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
		r.pendingLocked(t.partition)
	}
}

// addClosingLocked records c as holding partition p's store until it is
// done.
func (r *registry) addClosingLocked(p int32, c closer) {
	r.mu.closing[p] = append(r.pendingLocked(p), c)
}

// takeCopyLocked takes copy sb out of the copies running here and keeps it
// as closing its partition's store until it is done.
func (r *registry) takeCopyLocked(sb *standby) {
	delete(r.mu.standbys, sb.partition)
	r.addClosingLocked(sb.partition, closer{done: sb.life.done, copy: sb})
}

// pendingLocked returns the tasks and copies still closing partition p's
// store, dropping those that are done. The slice is the registry's: callers
// outside it get waitsLocked's copy.
func (r *registry) pendingLocked(p int32) []closer {
	old := r.mu.closing[p]
	cs := old[:0]
	for _, c := range old {
		select {
		case <-c.done:
		default:
			cs = append(cs, c)
		}
	}
	clear(old[len(cs):])
	if len(cs) == 0 {
		delete(r.mu.closing, p)
		return nil
	}
	r.mu.closing[p] = cs
	return cs
}

// waitsLocked returns what a new task or copy of partition p waits for
// before it opens the store: the done channels of the tasks and copies
// still closing it (nil: none), and the latest of those copies (nil: none),
// whose position a task taking the store over reports.
func (r *registry) waitsLocked(p int32) ([]<-chan struct{}, *standby) {
	var chs []<-chan struct{}
	var last *standby
	for _, c := range r.pendingLocked(p) {
		chs = append(chs, c.done)
		if c.copy != nil {
			last = c.copy
		}
	}
	return chs, last
}

// takeStandbys removes every copy and returns them (stopping them is the
// caller's); each is kept as closing until it is done.
func (r *registry) takeStandbys() []*standby {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*standby, 0, len(r.mu.standbys))
	for _, sb := range r.mu.standbys {
		out = append(out, sb)
		r.takeCopyLocked(sb)
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
