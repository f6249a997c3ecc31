package stream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/changelog"
)

// A session's membership in a streams group (group.protocol=streams; see
// streamsgroup.go). franz-go runs no streams-group member: the session's
// heartbeat loop sends StreamsGroupHeartbeat to the group coordinator
// itself, and the group client consumes the assigned tasks' partitions
// directly (AddConsumePartitions, from the group's committed offsets).
//
// The loop applies each assignment as franz-go runs the classic
// callbacks: between two polls (the poll loop holds between while it
// dispatches). The tasks no longer given to this member are revoked first
// (at-least-once: flushed, their offsets committed), and reported gone in
// the next heartbeat; only then does the coordinator give them to another
// member. The tasks given are started through session.apply, the classic
// protocol's path. A fenced member drops every task without committing and
// joins again.

// streamsGroup is a session's membership in a streams group. The
// heartbeat loop (run) is the only sender of heartbeats and the only
// writer of the member's state; others ask it for a heartbeat (heartbeat).
type streamsGroup struct {
	s *session
	*streamsMember
	// kick asks the loop for a heartbeat now (buffered 1).
	kick chan struct{}
	// mu guards waiters (callers of heartbeat waiting for the next
	// answer) and confirmed (when the latest heartbeat the coordinator
	// answered without an error was sent, and the epoch it confirmed).
	mu        sync.Mutex
	waiters   []chan heartbeatResult
	confirmed heartbeatResult
	// ids are the topic ids commits name the topics by; idsStale that a
	// commit found one unknown (a topic recreated since the start), so the
	// start's are not used again (both guarded by mu).
	ids      map[string][16]byte
	idsStale bool
	// noOffsets: the coordinator refused the task offsets (a broker
	// before warm-ups); the loop's.
	noOffsets bool
	// coord is the group coordinator's node id, -1 when unknown; the
	// loop's.
	coord int32
	// problemLog rate-limits the warnings of heartbeats that fail; the
	// loop's.
	problemLog rateLimiter
	// done is closed when the loop returned: the leave is sent after.
	done chan struct{}
	// reconciling is set while the loop applies an answer: the answer
	// just confirmed the member (see heartbeat).
	reconciling atomic.Bool
	// lastActive are the active tasks the latest heartbeat reported; the
	// loop's.
	lastActive []int32
	// txn is the exactly-once client (nil at least once), told which
	// partitions are read from where; set before the loop starts.
	txn *streamsTxn
}

// heartbeatResult is an answered heartbeat's outcome for a waiter: the
// epoch, when the heartbeat was sent, the coordinator's error.
type heartbeatResult struct {
	epoch int32
	sent  time.Time
	err   error
}

var _ groupProtocol = (*streamsGroup)(nil)

func newStreamsGroup(s *session, m *streamsMember) *streamsGroup {
	return &streamsGroup{s: s, streamsMember: m, kick: make(chan struct{}, 1), coord: -1, done: make(chan struct{}),
		problemLog: rateLimiter{every: 30 * time.Second, burst: 3}}
}

func (g *streamsGroup) begin(appServer string) {
	cfg := g.s.env.cfg
	var windows []string
	for _, size := range cfg.WindowSizes() {
		windows = append(windows, cfg.WindowChangelogTopic(size))
	}
	g.streamsMember.begin(streamsTopology(cfg.InputTopic, cfg.RepartitionTopic(), cfg.ChangelogTopic(), windows, cfg.ReplicationFactor),
		g.s.env.dir.ProcessID(), appServer)
}

// clientOpts: the group client consumes the partitions the loop adds.
func (g *streamsGroup) clientOpts() []kgo.Opt { return nil }

// run is the heartbeat loop: a heartbeat every interval the coordinator
// asks for (sooner when kicked), with the stores' offsets every task
// offset interval; each answer applied before the next.
func (g *streamsGroup) run(ctx context.Context) {
	defer close(g.done)
	var purging sync.WaitGroup
	defer purging.Wait()
	pctx, stopPurge := context.WithCancel(ctx)
	defer stopPurge()
	purging.Go(func() { g.purgeLoop(pctx) })
	if g.brokersSpeakStreams(ctx) {
		g.configureGroup(ctx)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var offsetsSent time.Time
	for {
		select {
		case <-ctx.Done():
			g.answerWaiters(heartbeatResult{sent: time.Now(), err: ctx.Err()})
			return
		case <-timer.C:
		case <-g.kick:
		}
		interval, offsetEvery := g.heartbeatEvery()
		withOffsets := time.Since(offsetsSent) >= offsetEvery
		err := g.beat(ctx, withOffsets)
		if err == nil && withOffsets {
			offsetsSent = time.Now()
		}
		if st, _ := g.state(); st == memberLeft {
			return
		}
		next := interval
		if err != nil {
			next = min(interval, time.Second)
		}
		if st, _ := g.state(); st == memberFenced {
			next = 0
		}
		timer.Reset(next)
	}
}

// purgeLoop deletes, every repartition.purge.interval.ms, the records of
// the repartition partitions of this member's active tasks before the
// group's committed offsets, as Kafka Streams does: those records are
// folded and committed, and the repartition topic of a streams group keeps
// records forever (the coordinator creates it with retention.ms -1, Kafka
// Streams' setting). Only the committed offsets count (not a transaction's
// pending ones), so whoever owns a task, nothing unread is deleted.
func (g *streamsGroup) purgeLoop(ctx context.Context) {
	t := time.NewTicker(g.s.env.cfg.RepartitionPurgeInterval)
	defer t.Stop()
	purged := map[int32]int64{}
	warn := rateLimiter{every: 10 * time.Minute, burst: 1}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.purge(ctx, purged); err != nil && ctx.Err() == nil {
			if ok, suppressed := warn.allow(time.Now()); ok {
				g.s.env.log.Warn("Could not delete the repartition topic's committed records; trying again",
					zap.String("topic", g.s.env.cfg.RepartitionTopic()), zap.Int64("suppressed", suppressed), zap.Error(err))
			}
		}
	}
}

// purge deletes the committed records of the repartition partitions of the
// member's active tasks, those not deleted up to there already (purged,
// by partition, updated).
func (g *streamsGroup) purge(ctx context.Context, purged map[int32]int64) error {
	e := g.s.env
	active, _, _ := g.target()
	if len(active) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	committed, err := e.admin.FetchOffsets(cctx, e.cfg.ApplicationID)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return err
	}
	topic := e.cfg.RepartitionTopic()
	to := kadm.Offsets{}
	for _, p := range active {
		if o, ok := committed.Lookup(topic, p); ok && o.At > purged[p] {
			to.Add(kadm.Offset{Topic: topic, Partition: p, At: o.At})
		}
	}
	if len(to) == 0 {
		return nil
	}
	deleted, err := e.admin.DeleteRecords(cctx, to)
	if err != nil {
		return err
	}
	var errs []error
	deleted.Each(func(d kadm.DeleteRecordsResponse) {
		if d.Err != nil {
			errs = append(errs, fmt.Errorf("%s-%d: %w", d.Topic, d.Partition, d.Err))
			return
		}
		if o, ok := to.Lookup(d.Topic, d.Partition); ok {
			purged[d.Partition] = o.At
			e.log.Debug("Deleted the repartition topic's committed records", zap.String("topic", d.Topic),
				zap.Int32("partition", d.Partition), zap.Int64("before", o.At))
		}
	})
	return errors.Join(errs...)
}

// brokersSpeakStreams reports whether a broker answers StreamsGroupHeartbeat
// (Apache Kafka 4.2 or later; the dev broker does not). When none does, the
// member's problem says so in /readyz and the log, and the loop goes on
// trying (the brokers may be upgraded); true when the versions cannot be
// read.
func (g *streamsGroup) brokersSpeakStreams(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	vs, err := g.s.env.admin.ApiVersions(cctx)
	if err != nil {
		return true
	}
	key := (*kmsg.StreamsGroupHeartbeatRequest)(nil).Key()
	speaks := false
	vs.Each(func(v kadm.BrokerApiVersions) {
		if _, ok := v.KeyMaxVersion(key); ok && v.Err == nil {
			speaks = true
		}
	})
	if !speaks {
		problem := "the brokers do not speak the streams group protocol (no StreamsGroupHeartbeat: Apache Kafka 4.2 or later has it, the dev broker does not); use group.protocol classic"
		g.setProblem(problem)
		g.s.env.log.Error("group.protocol is streams, but "+problem, zap.String("group", g.group))
	}
	return speaks
}

// configureGroup sets the group's own settings from this process's keys:
// under the streams protocol the coordinator runs the session, the standby
// replicas and the warm-ups by the group's configuration
// (streams.session.timeout.ms, streams.num.standby.replicas,
// streams.num.warmup.replicas, streams.acceptable.recovery.lag), not by
// what a member asks. Refused (a broker before 4.4 knows no warm-up
// settings; no ALTER_CONFIGS on the group; a value outside the broker's
// bounds), it tries again with fewer: without the warm-ups, then the
// standbys alone, and a warning says what the group keeps. The lease then
// runs by the group's session timeout when it is shorter than
// session.timeout.ms.
func (g *streamsGroup) configureGroup(ctx context.Context) {
	e := g.s.env
	standbys := map[string]string{"streams.num.standby.replicas": strconv.Itoa(e.cfg.NumStandbyReplicas)}
	session := maps.Clone(standbys)
	session["streams.session.timeout.ms"] = strconv.FormatInt(e.cfg.SessionTimeout.Milliseconds(), 10)
	all := maps.Clone(session)
	all["streams.num.warmup.replicas"] = strconv.Itoa(e.cfg.MaxWarmupReplicas)
	all["streams.acceptable.recovery.lag"] = strconv.FormatInt(e.cfg.AcceptableRecoveryLag, 10)
	var err error
	for i, set := range []map[string]string{all, session, standbys} {
		if err = g.alterGroup(ctx, set); err == nil {
			if i > 0 {
				e.log.Warn("The streams group keeps its own settings for some of this process's keys (set them with kafka-configs --entity-type groups)",
					zap.String("group", g.group), zap.Any("wanted", all), zap.Any("set", set))
			}
			e.log.Info("Set the streams group's configuration", zap.String("group", g.group), zap.Any("config", set))
			break
		}
		e.log.Warn("Could not set the streams group's configuration", zap.String("group", g.group), zap.Any("wanted", set), zap.Error(err))
	}
	if err != nil {
		e.log.Warn("The streams group keeps its own configuration (set it with kafka-configs --entity-type groups)", zap.String("group", g.group))
	}
	if d, err := g.groupSessionTimeout(ctx); err == nil && d > 0 && d < e.cfg.SessionTimeout {
		e.log.Warn("The streams group's session timeout is shorter than session.timeout.ms; the lease runs by the group's",
			zap.Duration("group_session_timeout", d), zap.Duration("session_timeout", e.cfg.SessionTimeout))
		g.s.lease.setSessionTimeout(d)
	}
}

// alterGroup sets the group's configs in set (IncrementalAlterConfigs).
func (g *streamsGroup) alterGroup(ctx context.Context, set map[string]string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, g.group
	for _, k := range slices.Sorted(maps.Keys(set)) {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = k, kmsg.StringPtr(set[k])
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(cctx, g.s.env.client)
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if rerr := kerr.ErrorForCode(r.ErrorCode); rerr != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = *r.ErrorMessage
			}
			return fmt.Errorf("%w: %s", rerr, msg)
		}
	}
	return nil
}

// groupSessionTimeout reads the group's streams.session.timeout.ms (its
// own, or the broker's default).
func (g *streamsGroup) groupSessionTimeout(ctx context.Context) (time.Duration, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, g.group
	res.ConfigNames = []string{"streams.session.timeout.ms"}
	req.Resources = append(req.Resources, res)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(cctx, g.s.env.client)
	if err != nil {
		return 0, err
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return 0, err
		}
		for _, c := range r.Configs {
			if c.Name == "streams.session.timeout.ms" && c.Value != nil {
				ms, err := strconv.ParseInt(*c.Value, 10, 64)
				if err != nil {
					return 0, err
				}
				return time.Duration(ms) * time.Millisecond, nil
			}
		}
	}
	return 0, errors.New("no streams.session.timeout.ms in the group's configuration")
}

// beat sends one heartbeat and applies its answer.
func (g *streamsGroup) beat(ctx context.Context, withOffsets bool) error {
	s := g.s
	req, ok := g.request(g.report(withOffsets))
	if !ok {
		return nil
	}
	sent := time.Now()
	resp, err := g.send(ctx, req)
	if err != nil {
		s.heartbeatAnswered(ctx, err)
		g.answerWaiters(heartbeatResult{sent: sent, err: err})
		if ctx.Err() == nil {
			if ok, suppressed := g.problemLog.allow(time.Now()); ok {
				s.env.log.Warn("Streams group heartbeat not answered; retrying", zap.String("group", g.group), zap.Int64("suppressed", suppressed), zap.Error(err))
			}
		}
		return err
	}
	var names map[string]string
	if resp.PartitionsByUserEndpoint != nil {
		names = g.memberNames(ctx)
	}
	out := g.answer(resp, req.MemberEpoch, names)
	_, epoch := g.state()
	if out.statusChanged {
		_, statuses := g.readiness()
		if len(statuses) > 0 {
			s.env.log.Info("The group coordinator reports on the topology", zap.String("group", g.group), zap.Strings("status", statuses))
		}
	}
	switch {
	case out.fenced:
		s.heartbeatAnswered(ctx, nil)
		g.answerWaiters(heartbeatResult{sent: sent, err: out.err})
		s.env.log.Warn("The group coordinator fenced this member (its epoch is not the group's); dropping its tasks without committing and joining again",
			zap.String("member", g.memberID), zap.Error(out.err))
		g.dropAll("dropped: fenced by the group coordinator, nothing committed")
		return out.err
	case out.err != nil && errors.Is(out.err, kerr.InvalidRequest) && req.TaskOffsets != nil && !g.noOffsets:
		// A coordinator before warm-ups refuses task offsets: send none.
		g.noOffsets = true
		s.env.log.Info("The group coordinator takes no task offsets (no warm-ups on this broker); heartbeats go on without them", zap.Error(out.err))
		g.rejoin("")
		return nil
	case out.err != nil:
		if errors.Is(out.err, kerr.NotCoordinator) || errors.Is(out.err, kerr.CoordinatorNotAvailable) || errors.Is(out.err, kerr.CoordinatorLoadInProgress) {
			g.coord = -1
		}
		s.heartbeatAnswered(ctx, out.err)
		g.answerWaiters(heartbeatResult{epoch: epoch, sent: sent, err: out.err})
		if ok, suppressed := g.problemLog.allow(time.Now()); ok {
			s.env.log.Warn("The group coordinator refused the streams group heartbeat; retrying", zap.String("group", g.group),
				zap.Int32("member_epoch", req.MemberEpoch), zap.Int64("suppressed", suppressed), zap.Error(out.err))
		}
		return out.err
	}
	if out.joined {
		s.env.log.Info("Joined the streams group", zap.String("group", g.group), zap.String("member", g.memberID), zap.Int32("member_epoch", epoch))
	}
	if st, _ := g.state(); st == memberLeft {
		g.answerWaiters(heartbeatResult{epoch: epoch, sent: sent})
		return nil
	}
	s.lease.joinAnswered(sent)
	g.mu.Lock()
	g.confirmed = heartbeatResult{epoch: epoch, sent: sent}
	g.mu.Unlock()
	// Set before the waiters are answered: one that asks after them is
	// answered by this heartbeat too (see heartbeat).
	g.reconciling.Store(true)
	g.answerWaiters(heartbeatResult{epoch: epoch, sent: sent})
	g.reconcile(ctx)
	g.reconciling.Store(false)
	if !slices.Equal(g.report(false).active, subtopologyTasks(req.ActiveTasks)) {
		// Tell the coordinator at once what runs here now: a revoked
		// task goes to its next owner only once this member says so.
		g.rejoin("")
	}
	return nil
}

// report is what the next heartbeat tells: the tasks this member runs
// (restoring or processing) and its copies, and, when due, its stores'
// offsets and the changelog ends.
func (g *streamsGroup) report(withOffsets bool) heartbeatReport {
	s := g.s
	r := heartbeatReport{active: s.reg.partitions()}
	if _, stopping, _ := s.reg.readiness(); stopping {
		// Shutting down, the tasks leave the registry before their last
		// flush and commit: they are reported as owned until the leave,
		// so that the coordinator gives none away before its commit.
		r.active = g.lastActive
	}
	g.lastActive = r.active
	for _, sb := range s.reg.standbys() {
		if copyKind(sb.kind.Load()) == kindWarmup {
			r.warmup = append(r.warmup, sb.partition)
		} else {
			r.standby = append(r.standby, sb.partition)
		}
	}
	if withOffsets && !g.noOffsets {
		// The coordinator weighs a copy's lag (end minus offset) against
		// acceptable.recovery.lag for warm-ups: the ends of every task.
		r.offsets, _ = s.storeOffsets()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ends, err := changelog.Ends(ctx, s.env.admin, s.env.cfg.ChangelogTopic())
		if err != nil {
			r.offsets = nil // sent with the next heartbeat
		}
		r.ends = ends
	}
	return r
}

// send sends req to the group coordinator, finding it first when unknown.
func (g *streamsGroup) send(ctx context.Context, req *kmsg.StreamsGroupHeartbeatRequest) (*kmsg.StreamsGroupHeartbeatResponse, error) {
	// The admin's client: a leave is sent after the group client closed.
	cl := g.s.env.client
	if g.coord < 0 {
		coord, err := findGroupCoordinator(ctx, cl, g.group)
		if err != nil {
			return nil, fmt.Errorf("finding the group coordinator: %w", err)
		}
		g.coord = coord
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cl.Broker(int(g.coord)).Request(hctx, req)
	if err != nil {
		g.coord = -1
		return nil, err
	}
	return resp.(*kmsg.StreamsGroupHeartbeatResponse), nil
}

// memberNames returns the members' names by endpoint, from their client
// tags in StreamsGroupDescribe; nil when the coordinator does not answer
// (the members are named by their endpoints until the next change).
func (g *streamsGroup) memberNames(ctx context.Context) map[string]string {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	members, err := describeStreamsGroupAt(dctx, g.s.env.client, g.coord, g.group)
	if err != nil {
		return nil
	}
	names := map[string]string{}
	for _, m := range members {
		if m.endpoint != "" && m.name != "" {
			names[m.endpoint] = m.name
		}
	}
	return names
}

// findGroupCoordinator returns the node id of group's coordinator.
func findGroupCoordinator(ctx context.Context, cl *kgo.Client, group string) (int32, error) {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = group
	req.CoordinatorKeys = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return -1, err
	}
	for _, c := range resp.Coordinators {
		if err := kerr.ErrorForCode(c.ErrorCode); err != nil {
			return -1, err
		}
		return c.NodeID, nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return -1, err
	}
	return resp.NodeID, nil
}

// reconcile makes the tasks running here those of the latest assignment,
// between two polls: the tasks no longer given are revoked (flushed and
// committed at-least-once) and their partitions no longer consumed; the
// tasks given anew start from the group's committed offsets (those whose
// offsets cannot be read now wait for the next heartbeat); the standby and
// warm-up copies follow.
func (g *streamsGroup) reconcile(ctx context.Context) {
	s := g.s
	cl := s.kc()
	if _, stopping, _ := s.reg.readiness(); stopping {
		return // shutting down: the tasks stop on their own
	}
	target, epoch, info := g.target()
	running := s.reg.partitions()
	var revoke, add []int32
	for _, p := range running {
		if !slices.Contains(target, p) {
			revoke = append(revoke, p)
		}
	}
	for _, p := range target {
		if !slices.Contains(running, p) {
			add = append(add, p)
		}
	}
	if len(revoke)+len(add) > 0 {
		// Only a change of tasks waits for the poll loop to be between
		// two polls (exactly-once: between two cycles); an answer that
		// changes none does not hold up the heartbeats.
		s.between.Lock()
		defer s.between.Unlock()
	}
	if len(revoke) > 0 {
		s.env.log.Info("Revoking tasks", zap.Strings("tasks", taskNames(revoke)), zap.Int32("member_epoch", epoch))
		s.g.revoked(ctx, cl, revoke)
		s.reg.release(s.env.topicsOf(revoke), s.heldBit)
		cl.RemoveConsumePartitions(s.env.topicsOf(revoke))
		if g.txn != nil {
			g.txn.released(s.env.topicsOf(revoke))
		}
	}
	var from map[string]map[int32]kgo.Offset
	if len(add) > 0 {
		var err error
		if from, err = s.committedOffsets(ctx, add); err != nil {
			s.env.log.Warn("Reading the group's committed offsets of the tasks assigned; starting them at the next heartbeat", zap.Strings("tasks", taskNames(add)), zap.Error(err))
			target = slices.DeleteFunc(target, func(p int32) bool { return slices.Contains(add, p) })
			add = nil
		}
	}
	held := make(map[int32]uint8, len(target))
	for _, p := range target {
		held[p] = heldBoth
	}
	s.apply(assignment{generation: epoch, held: held, readded: map[int32]bool{}, info: info})
	if len(add) > 0 {
		// A partition still consumed from before (a lapsed lease pauses
		// and keeps them) would go on from its old position: start over
		// from the committed offsets.
		cl.RemoveConsumePartitions(s.env.topicsOf(add))
		cl.AddConsumePartitions(from)
		if g.txn != nil {
			g.txn.consumed(from)
		}
	}
}

// committedOffsets returns where the input and repartition partitions of
// ps are read from: the group's committed offsets, or where
// auto.offset.reset says when none is.
func (s *session) committedOffsets(ctx context.Context, ps []int32) (map[string]map[int32]kgo.Offset, error) {
	e := s.env
	topics := []string{e.cfg.InputTopic, e.cfg.RepartitionTopic()}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Stable offsets: a commit in a transaction still being decided (the
	// previous owner's last, exactly-once) is waited for, not read past.
	committed, err := e.admin.FetchOffsets(kadm.RequireStable(cctx), e.cfg.ApplicationID)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return nil, err
	}
	reset := kgo.NewOffset().AtStart()
	var ends kadm.ListedOffsets
	if e.cfg.AutoOffsetReset == "latest" {
		// The end as an offset, not "the end": a rewind after an abort
		// (exactly-once) must not skip what arrived since.
		if ends, err = e.admin.ListEndOffsets(cctx, topics...); err == nil {
			err = ends.Error()
		}
		if err != nil {
			return nil, err
		}
	}
	out := map[string]map[int32]kgo.Offset{}
	for _, topic := range topics {
		out[topic] = map[int32]kgo.Offset{}
		for _, p := range ps {
			out[topic][p] = reset
			if o, ok := ends.Lookup(topic, p); ok {
				out[topic][p] = kgo.NewOffset().At(o.Offset)
			}
			if o, ok := committed.Lookup(topic, p); ok && o.At >= 0 {
				out[topic][p] = kgo.NewOffset().At(o.At)
			}
		}
	}
	return out, nil
}

// dropAll drops every task without committing (the member was fenced) and
// stops consuming their partitions.
func (g *streamsGroup) dropAll(outcome string) {
	s := g.s
	s.lease.lost()
	s.between.Lock()
	defer s.between.Unlock()
	ps := s.reg.partitions()
	s.reg.mu.Lock()
	s.reg.mu.held = make(map[int32]uint8)
	s.reg.mu.Unlock()
	if len(ps) > 0 {
		s.cutOff(ps)
		s.g.dropped(ps)
		if err := s.stopTasks(ps, false, outcome); err != nil {
			s.env.log.Warn("Dropping tasks", zap.Error(err))
		}
		s.kc().RemoveConsumePartitions(s.env.topicsOf(ps))
		if g.txn != nil {
			g.txn.released(s.env.topicsOf(ps))
		}
	}
	s.reconcileStandbys()
}

// heartbeat asks the loop for a heartbeat now and waits for its answer.
// An answer to a heartbeat sent within the last confirmFresh is the answer
// (every task's flush asks); so is the one the loop applies now, for a
// third of the session timeout (a revoked task flushes its last cycle and
// asks while the loop waits for it). sent is always when the answering
// heartbeat was sent, so that the lease runs from what the coordinator
// actually said.
func (g *streamsGroup) heartbeat(ctx context.Context) (int32, time.Time, error) {
	st, epoch := g.state()
	if st != memberStable {
		return epoch, time.Now(), errNotMemberYet
	}
	g.mu.Lock()
	c, at := g.confirmed, g.confirmed.sent
	g.mu.Unlock()
	if c.epoch == epoch && (time.Since(at) < confirmFresh || (g.reconciling.Load() && time.Since(at) < g.s.lease.timeout()/3)) {
		return epoch, at, nil
	}
	ch := make(chan heartbeatResult, 1)
	g.mu.Lock()
	g.waiters = append(g.waiters, ch)
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
	select {
	case r := <-ch:
		return r.epoch, r.sent, r.err
	case <-ctx.Done():
		return epoch, time.Now(), ctx.Err()
	}
}

// confirmFresh is how long an answered heartbeat confirms the member for
// those who ask: far within the session timeout, so that a process paused
// longer asks the coordinator again before it writes.
const confirmFresh = time.Second

// answerWaiters gives r to every caller of heartbeat waiting.
func (g *streamsGroup) answerWaiters(r heartbeatResult) {
	g.mu.Lock()
	ws := g.waiters
	g.waiters = nil
	g.mu.Unlock()
	for _, ch := range ws {
		ch <- r
	}
}

// rejoin: the next heartbeat, sent now, reports what this member runs
// (after a lapse: nothing) and its offsets; the coordinator's answer is
// applied as any other.
func (g *streamsGroup) rejoin(string) {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// commit commits offsets in the member's name: its member id and epoch,
// which the coordinator checks (a zombie's commit is refused).
func (g *streamsGroup) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error {
	_, epoch := g.state()
	ids, err := g.topicIDs(ctx)
	if err != nil {
		return err
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = g.group
	req.MemberID = g.memberID
	req.Generation = epoch
	for topic, ps := range offsets {
		rt := kmsg.NewOffsetCommitRequestTopic()
		// OffsetCommit v10 names topics by id (franz-go sends the highest
		// version both sides speak).
		rt.Topic, rt.TopicID = topic, ids[topic]
		for p, eo := range ps {
			rp := kmsg.NewOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = p, eo.Offset, eo.Epoch
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, g.s.kc())
	if err != nil {
		return err
	}
	err = offsetCommitError(resp.Topics)
	if errors.Is(err, kerr.UnknownTopicID) {
		g.forgetTopicIDs()
	}
	return err
}

// forgetTopicIDs: a topic was recreated, its id is read again.
func (g *streamsGroup) forgetTopicIDs() {
	g.mu.Lock()
	g.ids, g.idsStale = nil, true
	g.mu.Unlock()
}

// topicIDs returns the ids of the input and repartition topics, read once.
func (g *streamsGroup) topicIDs(ctx context.Context) (map[string][16]byte, error) {
	g.mu.Lock()
	ids, stale := g.ids, g.idsStale
	g.mu.Unlock()
	if ids != nil {
		return ids, nil
	}
	e := g.s.env
	// The start learnt them (ensureTopics), unless a topic was recreated
	// since. The admin client's metadata would not do right after the start
	// created a topic: it keeps the answer that the topic was missing for
	// metadata.min.age.
	if topo := g.s.topo; !stale && topo.inputID != ([16]byte{}) && topo.repartitionID != ([16]byte{}) {
		ids = map[string][16]byte{e.cfg.InputTopic: topo.inputID, e.cfg.RepartitionTopic(): topo.repartitionID}
		g.mu.Lock()
		g.ids = ids
		g.mu.Unlock()
		return ids, nil
	}
	topics, err := e.admin.ListTopics(ctx, e.cfg.InputTopic, e.cfg.RepartitionTopic())
	if err != nil {
		return nil, fmt.Errorf("reading the topic ids to commit with: %w", err)
	}
	ids = map[string][16]byte{}
	for _, name := range []string{e.cfg.InputTopic, e.cfg.RepartitionTopic()} {
		d, ok := topics[name]
		if !ok || d.Err != nil {
			return nil, fmt.Errorf("reading the topic id of %s to commit with: %v", name, d.Err)
		}
		ids[name] = d.ID
	}
	g.mu.Lock()
	g.ids = ids
	g.mu.Unlock()
	return ids, nil
}

// leave has the loop send the leave heartbeat (epoch -1) so that the
// tasks move at once, unless leave.group.on.close is false, and waits for
// it (at most 10 s).
func (g *streamsGroup) leave(ctx context.Context) error {
	s := g.s
	if !s.env.cfg.LeaveGroupOnClose {
		s.env.log.Info("Keeping group membership on close (leave.group.on.close=false): the tasks stay with this member until it returns or the group's session times out",
			zap.String("member", g.memberID))
		return nil
	}
	if !g.streamsMember.leave() {
		return nil
	}
	g.rejoin("")
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	select {
	case <-g.done:
	case <-lctx.Done():
	}
	if st, _ := g.state(); st != memberLeft {
		s.env.log.Warn("Leaving the streams group failed; its tasks move once the group's session times out", zap.String("member", g.memberID))
		return nil
	}
	s.env.log.Info("Left the group", zap.String("member", g.memberID))
	return nil
}

// describedMember is what StreamsGroupDescribe says of one member.
type describedMember struct {
	// name is its salesagg.instance client tag, endpoint its
	// application.server ("" when none).
	name, endpoint string
	id             string
	epoch          int32
	// active are the tasks it holds, target those the coordinator means
	// for it.
	active, target []int32
}

// groupDescription is the latest StreamsGroupDescribe of the group, read
// again at most once a second for the status (Runtime.Instances). Guarded
// by mu.
type groupDescription struct {
	mu      sync.Mutex
	at      time.Time
	members []describedMember
}

// read returns the members as the coordinator describes them now (or as it
// did within the last second); nil when it does not answer. mu is held
// across the describe (at most 2 s): concurrent readers, one per status
// request, wait for one answer rather than each asking the coordinator.
func (d *groupDescription) read(cl *kgo.Client, group string) []describedMember {
	d.mu.Lock()
	defer d.mu.Unlock()
	if time.Since(d.at) < time.Second {
		return d.members
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ms, err := describeStreamsGroup(ctx, cl, group)
	if err != nil {
		ms = nil
	}
	d.at, d.members = time.Now(), ms
	return ms
}

// describeStreamsGroup asks group's coordinator for its members.
func describeStreamsGroup(ctx context.Context, cl *kgo.Client, group string) ([]describedMember, error) {
	coord, err := findGroupCoordinator(ctx, cl, group)
	if err != nil {
		return nil, err
	}
	return describeStreamsGroupAt(ctx, cl, coord, group)
}

// describeStreamsGroupAt asks coordinator coord for group's members: their
// ids, epochs, tasks, endpoints and salesagg.instance names.
func describeStreamsGroupAt(ctx context.Context, cl *kgo.Client, coord int32, group string) ([]describedMember, error) {
	req := kmsg.NewPtrStreamsGroupDescribeRequest()
	req.Groups = []string{group}
	kresp, err := cl.Broker(int(coord)).Request(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []describedMember
	for _, gr := range kresp.(*kmsg.StreamsGroupDescribeResponse).Groups {
		if err := kerr.ErrorForCode(gr.ErrorCode); err != nil {
			return nil, err
		}
		for _, mb := range gr.Members {
			d := describedMember{id: mb.MemberID, epoch: mb.MemberEpoch,
				active: subtopologyTasks(mb.Assignment.ActiveTasks), target: subtopologyTasks(mb.TargetAssignment.ActiveTasks)}
			if mb.UserEndpoint != nil {
				d.endpoint = net.JoinHostPort(mb.UserEndpoint.Host, strconv.Itoa(int(mb.UserEndpoint.Port)))
			}
			for _, tag := range mb.ClientTags {
				if tag.Key == instanceTag {
					d.name = tag.Value
				}
			}
			out = append(out, d)
		}
	}
	return out, nil
}
