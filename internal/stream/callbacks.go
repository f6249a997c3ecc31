package stream

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// The group's callbacks: what franz-go calls on a SyncGroup, a revoke and a
// loss, and the group-error hook.
//
// Nothing is inferred from the revoke and lost callbacks having fired:
// exactly-once, franz-go's transact session calls them only for the first
// revoke (or loss) of a transaction, so a second one before the transaction
// ends never reaches them. After every SyncGroup (assigned) the tasks are
// reconciled with the assignment just given, and a lost session is also
// taken from the group-error hook, which is not wrapped.

// assigned reconciles the tasks with the assignment of the latest
// SyncGroup, which franz-go calls it after, every time (also with nothing
// added), and starts a task for each task whose input and repartition
// partitions are now both held. Fetching for a new task stays paused until
// its restore is done. A partial task (one of its two partitions) or an
// assignment made for another partition count is refused: logged, paused,
// never processed, and the process is not ready.
//
// The reconciliation: a task whose partitions the latest assignment does
// not give this member is stopped (its part of the open transaction
// aborted); a task whose partition franz-go reports as newly added was lost
// meanwhile (another member may have run it): the old task object is
// stopped and a new one restores from its checkpoint.
func (s *session) assigned(_ context.Context, cl *kgo.Client, added map[string][]int32) {
	s.client.CompareAndSwap(nil, cl)
	defer s.reconcileStandbys()
	lapsed := s.lease.assigned(time.Now())
	s.env.waits.answered(groupWait)
	current := s.bal.synced()
	held := make(map[int32]uint8)
	for topic, ps := range current {
		for _, p := range ps {
			if bit := s.heldBit(topic); bit != 0 {
				held[p] |= bit
			}
		}
	}
	gone, reused, stopping := s.staleTasks(held, added)
	if stopping {
		return
	}
	if len(gone)+len(reused) > 0 {
		s.env.log.Warn("Stopping tasks the latest assignment does not leave running here (their revoke or loss was not signalled); their uncommitted work is dropped",
			zap.Strings("not_assigned", taskNames(gone)), zap.Strings("reassigned", taskNames(reused)), zap.Int32("generation", generation(cl)))
		stale := append(gone, reused...)
		s.g.dropped(stale)
		if err := s.stopTasks(stale, false, "dropped: the latest assignment moved it, nothing more committed"); err != nil {
			s.env.log.Warn("Stopping unassigned tasks", zap.Error(err))
		}
	}
	s.applyAssignment(cl, current, held)
	if len(reused) > 0 {
		s.g.replaced(reused)
	}
	s.rereadLapsed(lapsed)
}

// staleTasks returns the tasks to stop before an assignment is applied:
// those whose partitions held does not give both, and those franz-go reports
// as newly added while they run (or that ended on their own).
func (s *session) staleTasks(held map[int32]uint8, added map[string][]int32) (gone, reused []int32, stopping bool) {
	readded := map[int32]bool{}
	for _, ps := range added {
		for _, p := range ps {
			readded[p] = true
		}
	}
	r := s.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.stopping {
		return nil, nil, true
	}
	for p, t := range r.mu.tasks {
		select {
		case <-t.life.done:
			reused = append(reused, p) // ended on its own: replaced below
			continue
		default:
		}
		switch {
		case held[p] != heldBoth:
			gone = append(gone, p)
		case readded[p]:
			reused = append(reused, p)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i] < gone[j] })
	sort.Slice(reused, func(i, j int) bool { return reused[i] < reused[j] })
	return gone, reused, false
}

// applyAssignment records what the assignment gives and starts the tasks
// that are new here; it refuses a partial task or another partition count.
func (s *session) applyAssignment(cl *kgo.Client, current map[string][]int32, held map[int32]uint8) {
	r := s.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.stopping {
		return
	}
	r.mu.held = held
	r.mu.assigned = true
	info := s.bal.assignment()
	if info.partitions != 0 && info.partitions != s.topo.partitions {
		r.mu.refused = fmt.Sprintf("the group leader assigned tasks for %d partitions, this process works with %d", info.partitions, s.topo.partitions)
		s.env.log.Error("Refusing the assignment: "+r.mu.refused+"; not processing it (restart this process if the input topic changed)",
			zap.Int32("leader_partitions", info.partitions), zap.Int32("partitions", s.topo.partitions))
		cl.PauseFetchPartitions(current)
		return
	}
	var started, partial []int32
	for p, bits := range r.mu.held {
		if bits != heldBoth {
			partial = append(partial, p)
			continue
		}
		if _, ok := r.mu.tasks[p]; !ok {
			started = append(started, p)
		}
	}
	r.mu.refused = ""
	if len(partial) > 0 {
		sort.Slice(partial, func(i, j int) bool { return partial[i] < partial[j] })
		r.mu.refused = fmt.Sprintf("partial tasks %v: the input and repartition partitions of a task must be assigned together", taskNames(partial))
		s.env.log.Error("Refusing partial tasks: each holds only one of its input and repartition partitions; not processing them",
			zap.Strings("tasks", taskNames(partial)), zap.Any("assigned", current))
		cl.PauseFetchPartitions(s.env.topicsOf(partial))
	}
	if len(started) == 0 {
		return
	}
	sort.Slice(started, func(i, j int) bool { return started[i] < started[j] })
	s.startTasksLocked(started, generation(cl))
}

// revoked stops the tasks of revoked partitions, as the guarantee says:
// at-least-once each drains what it was handed, flushes and checkpoints,
// and their offsets are committed before the partitions are let go;
// exactly-once they drop what they folded (the open transaction aborts).
func (s *session) revoked(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
	s.client.CompareAndSwap(nil, cl)
	ps := partitionsOf(parts)
	if len(ps) > 0 {
		s.env.log.Info("Revoking tasks", zap.Strings("tasks", taskNames(ps)), zap.Int32("generation", generation(cl)))
	}
	s.g.revoked(ctx, cl, ps)
	s.reg.release(parts, s.heldBit)
	s.reconcileStandbys()
}

// lost drops the tasks of lost partitions without committing: another
// member may own them already.
func (s *session) lost(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
	ps := partitionsOf(parts)
	s.reg.release(parts, s.heldBit)
	if len(ps) > 0 {
		s.env.log.Warn("Lost tasks (the group moved on without this member); dropping them without committing", zap.Strings("tasks", taskNames(ps)))
	}
	s.cutOff(ps)
	s.g.dropped(ps)
	if err := s.stopTasks(ps, false, "dropped: partitions lost, nothing committed"); err != nil {
		s.env.log.Warn("Dropping lost tasks", zap.Error(err))
	}
	s.reconcileStandbys()
}

// lostHook drops every task when the group session ends in an error that
// lost the partitions. franz-go calls the lost callback first, but the
// exactly-once session swallows a second one within a transaction; this
// hook is not wrapped.
type lostHook struct{ s *session }

var _ kgo.HookGroupManageError = lostHook{}

func (h lostHook) OnGroupManageError(err error) {
	s := h.s
	s.lease.lost()
	ps := s.reg.partitions()
	s.reg.mu.Lock()
	s.reg.mu.held = make(map[int32]uint8)
	s.reg.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	s.env.log.Warn("Group session lost; dropping its tasks without committing", zap.Strings("tasks", taskNames(ps)), zap.Error(err))
	s.cutOff(ps)
	s.g.dropped(ps)
	if err := s.stopTasks(ps, false, "dropped: group session lost, nothing committed"); err != nil {
		s.env.log.Warn("Dropping lost tasks", zap.Error(err))
	}
	s.reconcileStandbys()
}

// leaveGroup sends LeaveGroup with this member's instance id, unless
// leave.group.on.close is false: franz-go's Close does not for a static
// member, and without it the group waits out the session timeout before
// moving the tasks.
func (s *session) leaveGroup(ctx context.Context) error {
	cfg := s.env.cfg
	if !cfg.LeaveGroupOnClose {
		s.env.log.Info("Keeping group membership on close (leave.group.on.close=false): the tasks stay with this member until it returns or its session times out",
			zap.String("group.instance.id", s.env.instanceID), zap.Duration("session_timeout", cfg.SessionTimeout))
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resps, err := s.env.admin.LeaveGroup(lctx, kadm.LeaveGroup(cfg.ApplicationID).InstanceIDs(s.env.instanceID).Reason("salesagg shutting down"))
	if err == nil {
		err = resps.Error()
	}
	if err != nil && !errors.Is(err, kerr.UnknownMemberID) {
		s.env.log.Warn("Leaving the group failed; its tasks move once the session times out", zap.String("group.instance.id", s.env.instanceID), zap.Error(err))
		return nil
	}
	s.env.log.Info("Left the group", zap.String("group.instance.id", s.env.instanceID))
	return nil
}
