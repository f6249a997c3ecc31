package stream

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// A group session: one membership of the consumer group, from joining to
// leaving (or to starting over on a changed input topic, or after the
// producer was fenced). It owns the group client and every goroutine it
// starts (tasks, standby copies, the topology watcher, the probe loop),
// and waits for them; Run starts one session after another.

// session is one group session. Its fields are set by newSession and run,
// before the client exists; the client, once made, is the poll loop's
// (callbacks run on franz-go's goroutines and use it only as franz-go
// allows: pausing, resuming, committing in a revoke).
type session struct {
	env *env
	reg *registry
	// proto is the session's group protocol; asg is what the rest reads
	// of the latest assignment (proto's).
	proto groupProtocol
	asg   assignor
	local *localStores
	topo  topology
	// client is the group client (exactly-once, the transact session's),
	// set once made; callbacks can run before run stores it, so they store
	// the client franz-go passes them first (the same one).
	client atomic.Pointer[kgo.Client]
	g      guarantee
	fail   failure
	// workDone is closed when the shutdown grace period ran out: tasks stop
	// where they are.
	workDone <-chan struct{}
	// wg counts every goroutine the session started.
	wg sync.WaitGroup
	// dropLog rate-limits the warning about records polled for a task that
	// is not running; the poll loop's.
	dropLog rateLimiter
	probes  prober
	// lease is this member's hold on its tasks, from the coordinator's
	// answers (lease.go).
	lease *lease
	// conns are the group client's open broker connections, reset when
	// tasks are cut off (cutoff.go).
	conns *brokerConns
	// between is held by the poll loop while it hands out what it polled,
	// and by the streams group while it applies an assignment, so that an
	// assignment is applied between two polls, as franz-go runs the
	// classic callbacks (BlockRebalanceOnPoll).
	between sync.Mutex
}

func newSession(e *env, reg *registry, bal *taskBalancer, member *streamsMember, local *localStores, topo topology, workDone <-chan struct{}) *session {
	s := &session{env: e, reg: reg, local: local, topo: topo, workDone: workDone,
		fail: newFailure(), dropLog: rateLimiter{every: 10 * time.Second, burst: 3},
		lease: newLease(e.cfg.SessionTimeout, rebalanceTimeout), conns: &brokerConns{}}
	s.proto = classicGroup{s: s, taskBalancer: bal}
	if member != nil {
		s.proto = newStreamsGroup(s, member)
	}
	s.asg = s.proto
	s.probes.interval = e.cfg.ProbingRebalanceInterval
	s.lease.lapseDelay = e.knobs.LeaseLapseDelay
	if e.eos {
		s.g = newExactlyOnce(s)
	} else {
		s.g = newAtLeastOnce(s)
	}
	return s
}

// guarantee is the commit cycle of processing.guarantee, chosen once per
// session: at-least-once (alos.go) or exactly-once (eos.go).
type guarantee interface {
	// client makes the group client from the session's options.
	client(opts []kgo.Opt) (*kgo.Client, error)
	// taskDeps fills in what tasks get from the guarantee.
	taskDeps(*taskDeps)
	// poll is the poll loop, until ctx is done; records are handed to the
	// tasks (and cycles run) under work.
	poll(ctx, work context.Context) error
	// revoked stops the tasks of a revoke callback.
	revoked(ctx context.Context, cl *kgo.Client, ps []int32)
	// dropped is told of tasks stopped without their revoke (lost, or
	// moved away): nothing of theirs may be committed.
	dropped(ps []int32)
	// replaced is told of tasks started in place of dropped ones while
	// this member kept their partitions: the client's position is past
	// what the dropped tasks folded, and must go back to what is
	// committed before the new tasks are handed records.
	replaced(ps []int32)
	// stop is the guarantee's part of a shutdown, after polling ended: the
	// last cycle, the tasks stopped, the last commit.
	stop(work context.Context, pollErr error) error
	// close closes the group client.
	close()
}

// kc returns the group client (nil before it exists).
func (s *session) kc() *kgo.Client { return s.client.Load() }

// rejoin makes this member rejoin the group (the balancer found the group
// advertising an old address for it); the first sync can come before run
// stored the client.
func (s *session) rejoin() {
	for range 100 {
		if cl := s.kc(); cl != nil {
			cl.ForceRebalance()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failure is the first failure of a task: it ends the poll loop and the
// session.
type failure struct {
	once sync.Once
	err  error // set before ch is closed
	ch   chan struct{}
}

func newFailure() failure { return failure{ch: make(chan struct{})} }

func (f *failure) set(err error) {
	f.once.Do(func() {
		f.err = err
		close(f.ch)
	})
}

// go runs fn as one of the session's goroutines.
func (s *session) goroutine(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

// clientOpts are the group client's options.
func (s *session) clientOpts() []kgo.Opt {
	cfg := s.env.cfg
	reset := kgo.NewOffset().AtStart()
	if cfg.AutoOffsetReset == "latest" {
		reset = kgo.NewOffset().AtEnd()
	}
	opts := append(s.env.kafkaOpts(), s.proto.clientOpts()...)
	return append(opts,
		kgo.ConsumeResetOffset(reset),
		kgo.WithHooks(s.conns),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		// Forwarded events on the repartition topic become visible to their
		// owner only once the transaction that forwarded them commits.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers reach the tasks, which step over them: the
		// committed offsets then pass a transaction's last marker, as the
		// Java consumer's position does.
		kgo.KeepControlRecords(),
		// A fetch long-polls for at most this long (the Java consumer's
		// default); it also bounds how long a partition resumed after its
		// restore waits for the fetch in flight to return.
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchCompression(compression(cfg.CompressionType)),
		kgo.MaxBufferedRecords(100_000),
	)
}

// run joins the group and processes until ctx is done, a task fails, the
// input topic changes (errTopologyChanged) or the producer is fenced
// (errSessionFenced); then it shuts down: the guarantee's last cycle and
// commit, the tasks stopped, the client closed, and (unless the session is
// followed by another) the group left. work is canceled when the grace
// period runs out.
func (s *session) run(ctx context.Context, work context.Context, cancelWork context.CancelFunc, appServer string) error {
	s.proto.begin(appServer)
	cl, err := s.g.client(s.clientOpts())
	if err != nil {
		return fmt.Errorf("creating group consumer: %w", err)
	}
	s.client.Store(cl)
	s.env.log.Info("Joining consumer group", zap.String("group", s.env.cfg.ApplicationID), zap.String("group.instance.id", s.env.instanceID),
		zap.String("input", s.env.cfg.InputTopic), zap.Int32("partitions", s.topo.partitions), zap.String("process_id", s.env.dir.ProcessID()))

	// The watcher ends the session when the input topic changes.
	pollCtx, cancelPoll := context.WithCancelCause(ctx)
	defer cancelPoll(nil)
	s.goroutine(func() { watchTopology(pollCtx, s.env, s.topo, cancelPoll) })
	s.goroutine(func() { s.probeLoop(pollCtx) })
	s.goroutine(func() { s.leaseLoop(pollCtx) })
	// The membership's goroutines outlive polling: the tasks' last flush
	// and commit are in its name, and a leave is its last word.
	memberCtx, cancelMember := context.WithCancel(work)
	defer cancelMember()
	s.goroutine(func() { s.proto.run(memberCtx) })
	pollErr := s.poll(pollCtx, work)
	changed := topologyChanged(pollCtx, ctx)
	cancelPoll(nil)

	// Shutdown: whatever the reason, within the grace period.
	deadline := time.AfterFunc(GracePeriod, cancelWork)
	defer deadline.Stop()
	for _, sb := range s.reg.beginStopping() {
		sb.stop()
	}
	stopErr := s.g.stop(work, pollErr)
	s.g.close()
	if changed != nil || ((errors.Is(pollErr, errSessionFenced) || errors.Is(pollErr, errProducerIDLost)) && ctx.Err() == nil) {
		// Start over without leaving the group: the next session rejoins
		// under the same instance id at once.
		cancelMember()
		s.wg.Wait()
		return errors.Join(changed, pollErr, stopErr)
	}
	leaveErr := s.proto.leave(work)
	cancelMember()
	s.wg.Wait()
	if work.Err() != nil {
		s.env.log.Warn("Shutdown grace period ran out; the next start restores the changelog tail", zap.Duration("grace", GracePeriod))
	}
	s.env.log.Info("Stopped")
	return errors.Join(pollErr, stopErr, leaveErr)
}

// poll runs the guarantee's poll loop, which also ends when a task fails.
func (s *session) poll(ctx, work context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.goroutine(func() {
		select {
		case <-s.fail.ch:
			cancel()
		case <-ctx.Done():
		}
	})
	err := s.g.poll(ctx, work)
	select {
	case <-s.fail.ch:
		return errors.Join(err, s.fail.err)
	default:
		return err
	}
}

// topologyChanged returns errTopologyChanged when the poll context ended
// for that reason (and not for a shutdown).
func topologyChanged(pollCtx, ctx context.Context) error {
	if ctx.Err() == nil && errors.Is(context.Cause(pollCtx), errTopologyChanged) {
		return context.Cause(pollCtx)
	}
	return nil
}

// dispatch hands each partition's records to its task. It never blocks on a
// task that cannot take them (a stalled task keeps reading its inbox; a
// stopped one is skipped). It reports whether records were left unprocessed
// for want of a running task: exactly-once, the cycle then aborts, so that
// their offsets are not committed and they are read again. Records of
// partitions in skip are not dispatched: they were read before their task's
// rewind and are read again.
//
// unread are the positions to read again from, per topic and partition: the
// first offset of the records polled while the lease was past its deadline.
// Their tasks may be another member's already, so they are not handed over;
// but when the lease holds again without a rebalance (a heartbeat sent
// before the deadline answered after it), the same tasks go on, and the
// client's position must not stay past records they never folded: at
// least once, the poll loop moves it back (exactly-once, the cycle's abort
// does).
func (s *session) dispatch(ctx context.Context, fetches kgo.Fetches, skip map[int32]bool) (dropped bool, unread map[string]map[int32]kgo.EpochOffset) {
	fetches.EachError(func(topic string, p int32, err error) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return
		}
		if topic == "" {
			// The group management loop's error, handed over in a fetch.
			s.env.waits.failed(groupWait, "the group coordinator of "+s.env.cfg.ApplicationID+" (joining the group)", -1, err)
			return
		}
		s.env.waits.failed(fetchWait(topic, p), fmt.Sprintf("the leader of %s-%d to serve fetches", topic, p), p, err)
	})
	fetches.EachTopic(func(ft kgo.FetchTopic) {
		answered := map[int32]bool{}
		for _, fp := range ft.Partitions {
			if fp.Err == nil && len(fp.Records) > 0 {
				answered[fp.Partition] = true
			}
		}
		s.env.waits.answeredPartitions(ft.Topic, answered)
	})
	// Past the lease's deadline (a process paused, or cut off from the
	// coordinator) the tasks may be another member's already: nothing is
	// folded until the lease loop has dropped them.
	overdue := s.lease.overdue(time.Now())
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 || skip[p.Partition] {
			return
		}
		if overdue {
			if unread == nil {
				unread = map[string]map[int32]kgo.EpochOffset{}
			}
			if unread[p.Topic] == nil {
				unread[p.Topic] = map[int32]kgo.EpochOffset{}
			}
			if o, ok := unread[p.Topic][p.Partition]; !ok || p.Records[0].Offset < o.Offset {
				unread[p.Topic][p.Partition] = kgo.EpochOffset{Epoch: -1, Offset: p.Records[0].Offset}
			}
			if ok, suppressed := s.dropLog.allow(time.Now()); ok {
				s.env.log.Warn("Records polled while the lease is past its deadline (the tasks may be another member's already); not handed to their task, read again",
					zap.String("topic", p.Topic), zap.Int32("partition", p.Partition), zap.Int64("from_offset", p.Records[0].Offset),
					zap.Int("records", len(p.Records)), zap.Int64("suppressed", suppressed))
			}
			dropped = true
			return
		}
		t := s.reg.task(p.Partition)
		if t == nil || (s.env.eos && t.State() != taskRunning) {
			// Revoked meanwhile (the session aborts and the new owner reads
			// from the committed offset), or not processing: nothing of
			// these records is committed.
			if ok, suppressed := s.dropLog.allow(time.Now()); ok {
				s.env.log.Warn("Records polled for a task that is not running here; they are not committed and are read again",
					zap.String("topic", p.Topic), zap.Int32("partition", p.Partition), zap.Int("records", len(p.Records)), zap.Int64("suppressed", suppressed))
			}
			dropped = true
			return
		}
		select {
		case t.mail.inbox <- batch{topic: p.Topic, recs: p.Records, hwm: p.HighWatermark, epoch: t.retry.rewindEpoch.Load()}:
		case <-t.life.done:
			dropped = true
		case <-ctx.Done():
			dropped = true
		}
	})
	return dropped, unread
}

// heldBit is the bit of registry.mu.held for topic.
func (s *session) heldBit(topic string) uint8 {
	switch topic {
	case s.env.cfg.InputTopic:
		return heldInput
	case s.env.cfg.RepartitionTopic():
		return heldRepartition
	}
	return 0
}

// taskDeps are what the session gives a task.
func (s *session) taskDeps() taskDeps {
	d := taskDeps{env: s.env, topo: s.topo, client: s.kc(), restored: s.restored, cameFrom: s.asg.cameFrom}
	s.g.taskDeps(&d)
	return d
}

// startTasks starts a task for each of ps (their partitions paused until
// their restore is done). Called with reg.mu held.
func (s *session) startTasksLocked(ps []int32, generation int32) {
	s.kc().PauseFetchPartitions(s.env.topicsOf(ps))
	r := &s.reg.mu
	r.restoring = restoreBatch{left: map[int32]bool{}, at: time.Now()}
	for _, p := range ps {
		t := newTask(s.taskDeps(), p)
		// A standby copy here stops first: the task takes its store over
		// once the copy, and any task or copy still closing the store
		// here, is done with it, and restores only what it lacked.
		s.takeStandbyLocked(p)
		t.handover.after, t.handover.from = s.reg.waitsLocked(p)
		r.tasks[p] = t
		r.restoring.left[p] = true
		r.restoring.names = append(r.restoring.names, t.name)
		s.goroutine(func() {
			ctx, cancel := untilClosed(s.workDone)
			defer cancel()
			if err := t.run(ctx); err != nil {
				s.fail.set(err)
			}
		})
	}
	s.env.log.Info("Assigned partitions", zap.Strings("tasks", r.restoring.names), zap.Int32("generation", generation))
}

// cancelOn returns a context derived from parent that is also canceled
// when ch yields a value or is closed; then, when not nil, runs first. The
// goroutine watching ch ends with the context, so the caller's cancel ends
// it.
func cancelOn[T any](parent context.Context, ch <-chan T, then func()) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-ch:
			if then != nil {
				then()
			}
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// untilClosed returns a context that is done when ch is closed (or its
// cancel is called).
func untilClosed(ch <-chan struct{}) (context.Context, context.CancelFunc) {
	return cancelOn(context.Background(), ch, nil)
}

// restored resumes fetching for a restored task and logs when the whole
// latest assignment is restored.
func (s *session) restored(t *task) {
	r := s.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.tasks[t.partition] != t {
		return // stopped meanwhile: its partitions stay paused
	}
	s.kc().ResumeFetchPartitions(s.env.topicsOf([]int32{t.partition}))
	b := &r.mu.restoring
	if !b.left[t.partition] {
		return
	}
	delete(b.left, t.partition)
	if len(b.left) == 0 {
		ms := time.Since(b.at).Milliseconds()
		s.env.log.Info(fmt.Sprintf("Restoration took %d ms for all tasks [%s]", ms, strings.Join(b.names, ", ")),
			zap.Int64("duration_ms", ms), zap.Strings("tasks", b.names))
	}
}

// stopTasks stops the tasks of ps and waits for them. A task still
// restoring abandons its restore; the wait is bounded by that, not by the
// restore's length. outcome says, in the Closed line, what became of the
// tasks' last changes.
func (s *session) stopTasks(ps []int32, flush bool, outcome string) error {
	ts := s.reg.take(ps)
	for _, t := range ts {
		t.requestStop(flush)
	}
	var errs []error
	for _, t := range ts {
		<-t.life.done
		if t.State() == taskFailed {
			errs = append(errs, fmt.Errorf("task %s failed", t.name))
		}
		t.logClosed(outcome)
		if t.State() == taskClosed && t.totals.cp.ChangelogTopicID == s.topo.changelogID && t.stats.checkpoint.Load() >= 0 {
			// The task goroutine is done: its checkpoint is final.
			s.local.note(t.partition, t.totals.cp)
		}
	}
	s.reg.closed(ts)
	return errors.Join(errs...)
}

// logClosed logs the Closed line of a task whose goroutine has ended:
// outcome, the session's word for what became of its last changes, unless
// the task's own end says otherwise.
func (t *task) logClosed(outcome string) {
	switch {
	case t.State() == taskFailed:
		t.log.Info(fmt.Sprintf("task [%s] Closed after a failure", t.name))
	case !t.life.reached(taskRunning):
		// Stopped before its restore ended: it folded nothing, so the
		// session's outcome (committed, flushed) is not its own.
		t.log.Info(fmt.Sprintf("task [%s] Closed while restoring: it processed no events, so it had nothing to commit", t.name),
			zap.String("outcome", "nothing to commit: stopped while restoring"))
	case t.stall.batch != nil && !t.deps.env.eos:
		// Stalled at its end (before the stop or in its drain): the stop
		// flushed nothing and reported no offset past what the store holds,
		// whatever the session did for the other tasks. The goroutine has
		// ended, so its stall is final.
		t.log.Info(fmt.Sprintf("task [%s] Closed while stalled: nothing flushed; the next owner reads again from the last committed offsets", t.name),
			zap.String("outcome", "nothing flushed: stalled"))
	default:
		t.log.Info(fmt.Sprintf("task [%s] Closed: %s", t.name, outcome), zap.String("outcome", outcome))
	}
}

// partitionsOf returns the partitions of parts, of any topic, sorted.
func partitionsOf(parts map[string][]int32) []int32 {
	seen := map[int32]bool{}
	var ps []int32
	for _, tps := range parts {
		for _, p := range tps {
			if !seen[p] {
				seen[p] = true
				ps = append(ps, p)
			}
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

// compression returns the producer codec of compression.type.
func compression(name string) kgo.CompressionCodec {
	switch name {
	case "gzip":
		return kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

// generation returns the group generation cl's member is in (-1: none).
func generation(cl *kgo.Client) int32 {
	_, gen := cl.GroupMetadata()
	return gen
}
