package stream

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// The assignment a group protocol gives this member, in one shape whatever
// the protocol, and the one session method that applies it. The classic
// consumer group (salesagg's balancer, balancer.go; franz-go's callbacks,
// callbacks.go) builds it from each SyncGroup.

// assignor is what the runtime reads of the group protocol's latest
// assignment outside of applying it: the status, the queries' routing, the
// standby copies and the restore's "Took over from" line.
type assignor interface {
	// assignment returns what the latest assignment tells every member:
	// the owners of the tasks and their application.servers, each
	// member's standby and warm-up copies, the probe flag, the partition
	// count it was made for.
	assignment() assignmentInfo
	// cameFrom returns the member task p ran on before its current owner,
	// "" when unknown.
	cameFrom(p int32) string
}

var _ assignor = (*taskBalancer)(nil)

// groupProtocol is a session's membership in the group, by group.protocol,
// chosen once at start like the commit cycle: classic (a consumer group
// with salesagg's balancer and franz-go's group client; callbacks.go) or
// streams (a KIP-1071 streams group whose coordinator assigns the tasks;
// streamsgroup.go, streamsession.go).
type groupProtocol interface {
	assignor
	// begin starts the membership, before the group client exists.
	begin(appServer string)
	// clientOpts are the protocol's options of the group client.
	clientOpts() []kgo.Opt
	// run runs the membership's own goroutines until ctx is done; the
	// session waits for them.
	run(ctx context.Context)
	// heartbeat asks the group coordinator whether this member is in the
	// group at the generation (member epoch) it knows: nil, the error of
	// the coordinator's error code, or why no answer came; sent is when
	// the heartbeat that answers was sent (the lease runs from it).
	heartbeat(ctx context.Context) (gen int32, sent time.Time, err error)
	// rejoin makes the member join again after its tasks were dropped (the
	// lease lapsed), or rebalance (probe) with what it reports now.
	rejoin(reason string)
	// commit commits at-least-once input offsets in this member's name.
	commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error
	// leave leaves the group at a shutdown that is not followed by another
	// session.
	leave(ctx context.Context) error
}

// assignment is what the group gives this member at one generation.
type assignment struct {
	// generation is the group generation the assignment is for.
	generation int32
	// held are the tasks given to this member, each with the bits of its
	// partitions given (heldBoth: the whole task). Only a classic leader
	// that is not salesagg's can give half a task, which is refused.
	held map[int32]uint8
	// readded are the tasks given anew though they may be running here:
	// lost in between, another member may have run them. Their tasks
	// restart from their checkpoints.
	readded map[int32]bool
	// info is what the assignment tells every member.
	info assignmentInfo
}

// apply reconciles the tasks with a, the latest assignment: a task a does
// not leave running here is stopped (its part of the open transaction
// aborted), a readded one is stopped and started again from its
// checkpoint, a new one is started (its fetching paused until its restore
// is done), and the standby copies follow. An assignment made for another
// partition count, or a partial task, is refused: logged, paused, never
// processed, and the process is not ready. The lease is held again, and a
// task it had lapsed rereads from its committed offsets.
func (s *session) apply(a assignment) {
	defer s.reconcileStandbys()
	lapsed := s.lease.assigned(time.Now())
	s.env.waits.answered(groupWait)
	gone, reused, stopping := s.staleTasks(a.held, a.readded)
	if stopping {
		return
	}
	if len(gone)+len(reused) > 0 {
		s.env.log.Warn("Stopping tasks the latest assignment does not leave running here (their revoke or loss was not signalled); their uncommitted work is dropped",
			zap.Strings("not_assigned", taskNames(gone)), zap.Strings("reassigned", taskNames(reused)), zap.Int32("generation", a.generation))
		stale := append(gone, reused...)
		s.g.dropped(stale)
		if err := s.stopTasks(stale, false, "dropped: the latest assignment moved it, nothing more committed"); err != nil {
			s.env.log.Warn("Stopping unassigned tasks", zap.Error(err))
		}
	}
	s.applyAssignment(a)
	if len(reused) > 0 {
		s.g.replaced(reused)
	}
	s.rereadLapsed(lapsed)
}

// staleTasks returns the tasks to stop before an assignment is applied:
// those whose partitions held does not give both, and those readded while
// they run (or that ended on their own).
func (s *session) staleTasks(held map[int32]uint8, readded map[int32]bool) (gone, reused []int32, stopping bool) {
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
func (s *session) applyAssignment(a assignment) {
	r := s.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.stopping {
		return
	}
	r.mu.held = a.held
	r.mu.assigned = true
	info := a.info
	if info.partitions != 0 && info.partitions != s.topo.partitions {
		r.mu.refused = fmt.Sprintf("the group leader assigned tasks for %d partitions, this process works with %d", info.partitions, s.topo.partitions)
		s.env.log.Error("Refusing the assignment: "+r.mu.refused+"; not processing it (restart this process if the input topic changed)",
			zap.Int32("leader_partitions", info.partitions), zap.Int32("partitions", s.topo.partitions))
		s.kc().PauseFetchPartitions(s.env.topicsOf(slices.Collect(maps.Keys(a.held))))
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
			zap.Strings("tasks", taskNames(partial)))
		s.kc().PauseFetchPartitions(s.env.topicsOf(partial))
	}
	if len(started) == 0 {
		return
	}
	sort.Slice(started, func(i, j int) bool { return started[i] < started[j] })
	s.startTasksLocked(started, a.generation)
}
