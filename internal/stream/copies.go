package stream

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/assign"
	"github.com/salesagg/salesagg/internal/state"
)

// The standby copies a session runs, the local stores it reports to the
// balancer, and the rebalances it asks for (probes).

// copyDeps are what the session gives a copy.
func (s *session) copyDeps() copyDeps {
	return copyDeps{env: s.env, topo: s.topo, local: s.local, probe: s.probe, spawn: s.goroutine}
}

// reconcileStandbys makes the copies running here those the latest
// assignment gives this member, minus the tasks active here: it stops the
// others (their stores stay on disk) and starts the missing ones. A copy of
// a task or copy still closing the store here opens it once that one is
// done with it. It is called after every assignment and revoke. The copies
// it stops are taken out under the registry's lock (kept as closing until
// they are done) and stopped after.
func (s *session) reconcileStandbys() {
	info := s.asg.assignment()
	want := info.standbys[s.env.instanceID]
	r := s.reg
	r.mu.Lock()
	if r.mu.stopping {
		r.mu.Unlock()
		return
	}
	var stop []*standby
	for p, sb := range r.mu.standbys {
		if _, ok := want[p]; ok && r.mu.tasks[p] == nil {
			continue
		}
		if r.mu.tasks[p] == nil && info.owners[p] == s.env.instanceID {
			// The task comes here: its start takes the copy over
			// (takeStandbyLocked), which the revoke callback running
			// first must not stop.
			continue
		}
		r.takeCopyLocked(sb)
		stop = append(stop, sb)
	}
	ps := make([]int32, 0, len(want))
	for p := range want {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	for _, p := range ps {
		kind := want[p]
		if p < 0 || p >= s.topo.partitions || r.mu.tasks[p] != nil {
			continue
		}
		if sb := r.mu.standbys[p]; sb != nil {
			if copyKind(sb.kind.Swap(uint32(kind))) != kind {
				sb.log.Info(fmt.Sprintf("task [%s] Copy is now a %s copy", sb.name, sb.role()))
			}
			sb.checkCaughtUp()
			continue
		}
		// A copy of a task or copy that was stopped here waits for it.
		after, _ := r.waitsLocked(p)
		sb := newStandby(s.copyDeps(), p, kind, after)
		r.mu.standbys[p] = sb
		s.goroutine(func() {
			ctx, cancel := untilClosed(s.workDone)
			defer cancel()
			sb.run(ctx)
		})
	}
	r.mu.Unlock()
	for _, sb := range stop {
		sb.stop()
	}
}

// takeStandbyLocked takes task p's copy, if one runs here, out of the
// copies and asks it to stop. It stays in the registry as closing the store
// until it is done: the task waits for it (handover.after) before it opens
// the store, and so does any task or copy of p started here before it is
// done. Called with reg.mu held, before the active task p starts.
func (s *session) takeStandbyLocked(p int32) {
	sb := s.reg.mu.standbys[p]
	if sb == nil {
		return
	}
	s.reg.takeCopyLocked(sb)
	sb.requestStop()
}

// standbyTotal returns product's total from the standby copy of task p
// here, when it runs and is within acceptable.recovery.lag; lag is how far
// behind it may be.
func standbyTotal(sb *standby, acceptable int64, product string) (total int64, ok bool, lag int64, err error) {
	st, lag, err := usableStandby(sb, acceptable)
	if err != nil {
		return 0, false, lag, err
	}
	e, ok, err := st.Get(product)
	return e.Total, ok, lag, err
}

// usableStandby returns the store of standby copy sb when it may answer
// queries: it tails its changelog within acceptable records; lag is how
// far behind it may be.
func usableStandby(sb *standby, acceptable int64) (st *state.Store, lag int64, err error) {
	if sb == nil {
		return nil, 0, ErrNotHosted
	}
	lag = sb.lag()
	st = sb.store.Load()
	if sb.State() != copyTailing || st == nil || lag < 0 {
		return nil, lag, fmt.Errorf("%w: the standby copy of task %s is not tailing yet", ErrNotReady, sb.name)
	}
	if lag > acceptable {
		return nil, lag, fmt.Errorf("%w: the standby copy of task %s is %d records behind (acceptable.recovery.lag %d)", ErrNotReady, sb.name, lag, acceptable)
	}
	return st, lag, nil
}

// localStores are the checkpoints the stores on disk were last closed
// with, for the offsets this member reports to the balancer. It outlives
// the sessions.
type localStores struct {
	mu  sync.Mutex                 // guards cps
	cps map[int32]state.Checkpoint // guarded by mu
}

func newLocalStores() *localStores { return &localStores{cps: map[int32]state.Checkpoint{}} }

// note records the checkpoint a store of task p was closed with.
func (l *localStores) note(p int32, cp state.Checkpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cps[p] = cp
}

// forget drops the checkpoint of task p's store: it was wiped.
func (l *localStores) forget(p int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.cps, p)
}

// scan reads the checkpoint of every store in the state dir (read only),
// for the offsets this member reports before it runs anything.
func (l *localStores) scan(dir *state.Dir, log *zap.Logger) {
	ps, err := dir.Tasks()
	if err != nil {
		log.Warn("Listing the stores in the state dir", zap.Error(err))
		return
	}
	for _, p := range ps {
		st, err := state.Open(dir.TaskPath(p), log, state.OpenOptions{ReadOnly: true})
		if err != nil {
			continue // unreadable: it counts as no state; its task deals with it
		}
		cp, found, err := st.Checkpoint()
		_ = st.Close()
		if err == nil && found {
			l.note(p, cp)
		}
	}
}

// offsets returns the checkpoints of the stores of changelog changelogID.
func (l *localStores) offsets(changelogID [16]byte) map[int32]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int32]int64{}
	for p, cp := range l.cps {
		if cp.ChangelogTopicID == changelogID && cp.ChangelogOffset >= 0 {
			out[p] = cp.ChangelogOffset
		}
	}
	return out
}

// storeOffsets are the checkpoints of this member's local stores, per task,
// as reported to the balancer: assign.Running for an active task that runs,
// the position of a copy or a restoring task, the checkpoint a store was
// last closed with otherwise; and for copies the changelog end their
// position was measured against. Stores of another changelog (recreated
// since) are left out.
func (s *session) storeOffsets() (map[int32]int64, map[int32]int64) {
	out, ends := s.local.offsets(s.topo.changelogID), map[int32]int64{}
	for _, sb := range s.reg.standbys() {
		if pos, end := sb.reported(); pos >= 0 {
			out[sb.partition] = pos
			if end >= 0 {
				ends[sb.partition] = end
			}
		}
	}
	for _, t := range s.reg.tasks() {
		switch st := t.State(); {
		case st == taskRunning || st == taskStalled:
			out[t.partition] = assign.Running
		case t.stats.checkpoint.Load() >= 0:
			out[t.partition] = t.stats.checkpoint.Load()
			delete(ends, t.partition)
		}
	}
	return out, ends
}

// prober is the rebalances this member asks for (it rejoins), at most one
// per probeGap.
type prober struct {
	interval time.Duration // probing.rebalance.interval.ms; set before the session runs
	mu       sync.Mutex    // guards last
	last     time.Time     // guarded by mu: when this member last asked
}

// probeGap is the least time between two rebalances this member asks for.
const probeGap = 5 * time.Second

// probe asks the group for a rebalance: a warm-up caught up, or the probing
// interval passed. It reports whether it asked.
func (s *session) probe(reason string) bool {
	if s.kc() == nil {
		return false
	}
	s.probes.mu.Lock()
	if time.Since(s.probes.last) < probeGap {
		s.probes.mu.Unlock()
		return false
	}
	s.probes.last = time.Now()
	s.probes.mu.Unlock()
	s.env.log.Info("Rejoining the group so that the balancer can move tasks to caught-up copies", zap.String("reason", reason))
	s.proto.rejoin(reason)
	return true
}

// probeLoop asks for a probing rebalance every probing.rebalance.interval.ms
// while this member builds warm-ups and the leader said tasks wait for them,
// and every probeGap checks the warm-ups again: one that caught up while its
// changelog was idle, or whose report the rate limit refused, reports now.
func (s *session) probeLoop(ctx context.Context) {
	check := time.NewTicker(probeGap)
	defer check.Stop()
	next := time.Now().Add(s.probes.interval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
		}
		var warm []*standby
		for _, sb := range s.reg.standbys() {
			if sb.isWarmup() {
				warm = append(warm, sb)
			}
		}
		if len(warm) == 0 {
			next = time.Now().Add(s.probes.interval)
			continue
		}
		for _, sb := range warm {
			sb.checkCaughtUp()
		}
		if time.Now().After(next) && s.asg.assignment().probe {
			// The leader said tasks wait for warm-ups (the assignment's
			// probe flag): rejoin so that it can move those caught up.
			next = time.Now().Add(s.probes.interval)
			names := make([]string, len(warm))
			for i, sb := range warm {
				names[i] = sb.name
			}
			sort.Strings(names)
			s.probe(fmt.Sprintf("probing rebalance for warm-ups %v", names))
		}
	}
}
