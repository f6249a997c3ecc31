package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// The classic protocol's callbacks: what franz-go calls on a SyncGroup, a
// revoke and a loss, and the group-error hook.
//
// Nothing is inferred from the revoke and lost callbacks having fired:
// exactly-once, franz-go's transact session calls them only for the first
// revoke (or loss) of a transaction, so a second one before the transaction
// ends never reaches them. After every SyncGroup (assigned) the tasks are
// reconciled with the assignment just given, and a lost session is also
// taken from the group-error hook, which is not wrapped.

// classicGroup is a session's membership in a classic consumer group:
// franz-go's group client runs it (JoinGroup, SyncGroup, heartbeats), with
// salesagg's balancer (taskBalancer) on the leader.
type classicGroup struct {
	s *session
	*taskBalancer
}

var _ groupProtocol = classicGroup{}

func (g classicGroup) begin(appServer string) {
	s := g.s
	g.start(memberInfo{partitions: s.topo.partitions, processID: s.env.dir.ProcessID(), appServer: appServer})
}

func (g classicGroup) clientOpts() []kgo.Opt {
	s, cfg := g.s, g.s.env.cfg
	return []kgo.Opt{
		kgo.ConsumerGroup(cfg.ApplicationID),
		kgo.InstanceID(s.env.instanceID),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.RebalanceTimeout(rebalanceTimeout),
		kgo.HeartbeatInterval(heartbeatInterval(cfg.SessionTimeout)),
		kgo.ConsumeTopics(cfg.InputTopic, cfg.RepartitionTopic()),
		kgo.Balancers(g.taskBalancer),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(g.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
		// The lost callback can be swallowed (see assigned); the hook
		// cannot: it runs after every group error that lost the partitions.
		kgo.WithHooks(lostHook{s}, leaseHook{s.lease}),
	}
}

// run: franz-go's group client runs the membership itself.
func (g classicGroup) run(context.Context) {}

func (g classicGroup) heartbeat(ctx context.Context) (int32, time.Time, error) {
	sent := time.Now()
	gen, err := g.s.heartbeat(ctx, g.s.kc())
	return gen, sent, err
}

// rejoin makes franz-go rejoin the group; not on the caller's goroutine:
// ForceRebalance takes the group's lock, which franz-go can hold while a
// rebalance waits for the poll in flight (BlockRebalanceOnPoll), itself
// waiting on a fetch from a broker out of reach.
func (g classicGroup) rejoin(string) {
	if cl := g.s.kc(); cl != nil {
		g.s.goroutine(cl.ForceRebalance)
	}
}

func (g classicGroup) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error {
	return commitSync(ctx, g.s.kc(), offsets)
}

// commitSync commits offsets with franz-go's group client cl.
func commitSync(ctx context.Context, cl *kgo.Client, offsets map[string]map[int32]kgo.EpochOffset) error {
	var commitErr error
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			commitErr = err
			return
		}
		commitErr = offsetCommitError(resp.Topics)
	})
	return commitErr
}

// offsetCommitError returns the first partition's error of an
// OffsetCommit response, nil when none failed.
func offsetCommitError(topics []kmsg.OffsetCommitResponseTopic) error {
	for _, t := range topics {
		for _, p := range t.Partitions {
			if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
				return fmt.Errorf("committing %s-%d: %w", t.Topic, p.Partition, e)
			}
		}
	}
	return nil
}

func (g classicGroup) leave(ctx context.Context) error { return g.s.leaveGroup(ctx) }

// assigned builds the classic protocol's assignment from the latest
// SyncGroup, which franz-go calls it after, every time (also with nothing
// added), and applies it (session.apply). The balancer hands out
// partitions: a task is this member's when its input and repartition
// partitions are both held (held bits); a partial task, which only a
// leader that is not salesagg's can give, is refused. A partition franz-go
// reports as newly added was lost meanwhile (another member may have run
// its task).
func (g classicGroup) assigned(_ context.Context, cl *kgo.Client, added map[string][]int32) {
	s := g.s
	s.client.CompareAndSwap(nil, cl)
	a := assignment{generation: generation(cl), held: make(map[int32]uint8), readded: map[int32]bool{}, info: s.asg.assignment()}
	for topic, ps := range g.synced() {
		for _, p := range ps {
			if bit := s.heldBit(topic); bit != 0 {
				a.held[p] |= bit
			}
		}
	}
	for _, ps := range added {
		for _, p := range ps {
			a.readded[p] = true
		}
	}
	s.apply(a)
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
