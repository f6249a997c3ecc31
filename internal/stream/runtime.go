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

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
)

// Knobs are hooks for tests. The zero value does nothing.
type Knobs struct {
	// CrashPoint, if set, is called at the named points of the commit
	// cycle ("flush-start", "changelog-produced", "changelog-flushed",
	// "store-written", "offsets-committed"); a test kills the process there.
	CrashPoint func(point string)
	// BeforeRestore, if set, is called by each task before it restores;
	// a test holds a task in the restoring state by blocking in it.
	BeforeRestore func(partition int32)
	// StoreWritable, if set, replaces the check made before each store
	// write (state.Dir.CheckWritable); tests make it fail.
	StoreWritable func(partition int32) error
	// RestoreProgressEvery overrides how often a restore logs its
	// progress (default 5 s).
	RestoreProgressEvery time.Duration
}

// Runtime runs salesagg's tasks for one process. Create it with New and run
// it with Run; its status methods are safe to call from any goroutine.
type Runtime struct {
	cfg   config.Config
	log   *zap.Logger
	dir   *state.Dir
	knobs Knobs

	// eos is processing.guarantee=exactly_once_v2: the poll loop runs one
	// transaction per commit interval through session (see eos.go).
	eos bool

	// set by Run before any task starts
	topo    topology
	client  *kgo.Client
	session *kgo.GroupTransactSession
	admin   *kadm.Client

	committer committer
	badEvents atomic.Int64
	// kafkaDown is set while a transaction cannot be ended for want of
	// Kafka; the process is then not ready.
	kafkaDown atomic.Bool
	// secOpts are the TLS and SASL client options, built by Run.
	secOpts []kgo.Opt
	// work is the context tasks run under: canceled when the shutdown
	// grace period runs out, not when shutdown begins.
	work context.Context

	mu struct {
		sync.Mutex
		tasks    map[int32]*task
		assigned bool // an assignment was received since the last revoke of all
		stopping bool
		// restoring is the batch of tasks of the latest assignment still
		// restoring, for the "Restoration took" line.
		restoring  map[int32]bool
		restoreAll []string
		restoreAt  time.Time
	}
	wg sync.WaitGroup // task goroutines

	// failed is closed, with failure set, when a task fails; the poll loop
	// then stops and Run returns the failure.
	failOnce sync.Once
	failure  error
	failed   chan struct{}
}

// New returns a runtime for cfg using the locked state dir.
func New(cfg config.Config, log *zap.Logger, dir *state.Dir, knobs Knobs) *Runtime {
	rt := &Runtime{cfg: cfg, log: log, dir: dir, knobs: knobs, failed: make(chan struct{}), eos: cfg.ProcessingGuarantee == config.ExactlyOnceV2}
	rt.mu.tasks = make(map[int32]*task)
	rt.committer.onDone = func() { rt.crashPoint("offsets-committed") }
	rt.committer.kick = make(chan struct{}, 1)
	return rt
}

// GracePeriod bounds how long Run takes to stop once its context is done.
const GracePeriod = 30 * time.Second

func (rt *Runtime) kafkaOpts() []kgo.Opt {
	return append([]kgo.Opt{
		kgo.SeedBrokers(rt.cfg.BootstrapServers...),
		kgo.ClientID(rt.cfg.ApplicationID + "-" + rt.dir.ProcessID()),
		kgo.WithLogger(kzap.New(rt.log.Named("kafka"), kzap.LevelFn(func() kgo.LogLevel {
			// franz-go logs one level below ours: its info is our debug.
			if rt.log.Core().Enabled(zapcore.DebugLevel) {
				return kgo.LogLevelInfo
			}
			return kgo.LogLevelWarn
		}))),
	}, rt.secOpts...)
}

// Run connects to Kafka, prepares the topics, joins the group and processes
// until ctx is done; then it stops every task (flushing and checkpointing),
// commits, leaves the group and closes the stores within GracePeriod.
func (rt *Runtime) Run(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	rt.work = work

	var err error
	if rt.secOpts, err = securityOpts(rt.cfg.Security); err != nil {
		return err
	}
	adminClient, err := kgo.NewClient(rt.kafkaOpts()...)
	if err != nil {
		return fmt.Errorf("creating Kafka client: %w", err)
	}
	defer adminClient.Close()
	rt.admin = kadm.NewClient(adminClient)

	if err := rt.prepareTopics(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}

	reset := kgo.NewOffset().AtStart()
	if rt.cfg.AutoOffsetReset == "latest" {
		reset = kgo.NewOffset().AtEnd()
	}
	groupOpts := []kgo.Opt{
		kgo.ConsumerGroup(rt.cfg.ApplicationID),
		kgo.SessionTimeout(rt.cfg.SessionTimeout),
		kgo.ConsumeTopics(rt.cfg.InputTopic, rt.cfg.RepartitionTopic()),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.ConsumeResetOffset(reset),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(rt.assigned),
		kgo.OnPartitionsRevoked(rt.revoked),
		kgo.OnPartitionsLost(rt.lost),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		// Forwarded events on the repartition topic become visible to their
		// owner only once the transaction that forwarded them commits.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A fetch long-polls for at most this long (the Java consumer's
		// default); it also bounds how long a partition resumed after its
		// restore waits for the fetch in flight to return.
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.MaxBufferedRecords(100_000),
	}
	if rt.cfg.GroupInstanceID != "" {
		groupOpts = append(groupOpts, kgo.InstanceID(rt.cfg.GroupInstanceID))
	}
	if !rt.eos {
		// At-least-once, a revoke runs between polls: the revoked tasks
		// flush and commit what they processed before letting go.
		groupOpts = append(groupOpts, kgo.BlockRebalanceOnPoll())
	}
	if rt.eos {
		txnID := rt.cfg.ApplicationID + "-" + rt.dir.ProcessID()
		groupOpts = append(groupOpts, kgo.TransactionalID(txnID), kgo.RequireStableFetchOffsets(),
			kgo.TransactionTimeout(max(60*time.Second, 10*rt.cfg.CommitInterval)))
		rt.session, err = kgo.NewGroupTransactSession(append(rt.kafkaOpts(), groupOpts...)...)
		if err == nil {
			rt.client = rt.session.Client()
			rt.logTransactionalID(txnID)
		}
	} else {
		rt.client, err = kgo.NewClient(append(rt.kafkaOpts(), groupOpts...)...)
	}
	if err != nil {
		return fmt.Errorf("creating group consumer: %w", err)
	}
	rt.log.Info("Joining consumer group", zap.String("group", rt.cfg.ApplicationID), zap.String("input", rt.cfg.InputTopic),
		zap.Int32("partitions", rt.topo.partitions), zap.String("process_id", rt.dir.ProcessID()))

	if rt.eos {
		return rt.runEOS(ctx, work, cancelWork)
	}

	commitDone := make(chan struct{})
	commitCtx, stopCommits := context.WithCancel(context.Background())
	go func() {
		defer close(commitDone)
		rt.commitLoop(commitCtx)
	}()

	pollErr := rt.poll(ctx)

	// Shutdown: stop every task with a flush, commit, leave the group.
	deadline := time.AfterFunc(GracePeriod, cancelWork)
	defer deadline.Stop()
	rt.beginStopping()
	stopErr := rt.stopTasks(rt.allPartitions(), true)
	stopCommits()
	<-commitDone
	commitErr := rt.committer.commit(work, rt.client)
	rt.client.Close() // leaves the group
	rt.stopped(work)
	return errors.Join(pollErr, stopErr, commitErr)
}

// runEOS runs the exactly-once poll loop, then shuts down: the last
// transaction commits what was folded, tasks close, the group is left.
func (rt *Runtime) runEOS(ctx, work context.Context, cancelWork context.CancelFunc) error {
	pollErr := rt.pollEOS(ctx)
	deadline := time.AfterFunc(GracePeriod, cancelWork)
	defer deadline.Stop()
	var lastErr error
	if pollErr == nil {
		lastErr = rt.transact(work)
	}
	rt.beginStopping()
	stopErr := rt.stopTasks(rt.allPartitions(), false)
	rt.session.Close() // leaves the group
	rt.stopped(work)
	return errors.Join(pollErr, lastErr, stopErr)
}

// stopped waits for the task goroutines after the group was left, and
// logs how the shutdown went.
func (rt *Runtime) stopped(work context.Context) {
	rt.wg.Wait()
	if work.Err() != nil {
		rt.log.Warn("Shutdown grace period ran out; the next start restores the changelog tail", zap.Duration("grace", GracePeriod))
	}
	rt.log.Info("Stopped")
}

func (rt *Runtime) beginStopping() {
	rt.mu.Lock()
	rt.mu.stopping = true
	rt.mu.Unlock()
}

// prepareTopics checks and creates the topics, retrying while Kafka cannot
// be reached.
func (rt *Runtime) prepareTopics(ctx context.Context) error {
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		attemptCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		topo, err := ensureTopics(attemptCtx, rt.admin, rt.cfg, rt.log)
		cancel()
		if err == nil {
			rt.mu.Lock()
			rt.topo = topo
			rt.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		if !retriable(err) {
			return err
		}
		rt.log.Warn("Waiting for Kafka", zap.Strings("bootstrap.servers", rt.cfg.BootstrapServers), zap.Int("attempt", attempt), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// retriable reports whether a start-up error can go away by waiting: Kafka
// unreachable or not ready, as opposed to a wrong topic layout.
func retriable(err error) bool {
	var te interface{ Timeout() bool }
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"connection refused", "dial", "EOF", "unable to dial", "broken pipe", "connection reset", "not available", "NOT_CONTROLLER", "LEADER_NOT_AVAILABLE", "COORDINATOR"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// poll is the loop that owns the group client: it fetches and hands each
// partition's records to its task, until ctx is done or a task fails.
func (rt *Runtime) poll(ctx context.Context) error {
	ctx, cancel := rt.untilFailure(ctx)
	defer cancel()
	for {
		fetches := rt.client.PollRecords(ctx, 10_000)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			rt.client.AllowRebalance()
			select {
			case <-rt.failed:
				return rt.failure
			default:
				return nil
			}
		}
		rt.dispatch(ctx, fetches)
		rt.client.AllowRebalance()
	}
}

// untilFailure returns a context that is also done when a task fails, so
// that the poll loop stops polling.
func (rt *Runtime) untilFailure(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-rt.failed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// dispatch hands each partition's records to its task.
func (rt *Runtime) dispatch(ctx context.Context, fetches kgo.Fetches) {
	fetches.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			rt.log.Warn("Fetching", zap.String("topic", topic), zap.Int32("partition", p), zap.Error(err))
		}
	})
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		rt.mu.Lock()
		t := rt.mu.tasks[p.Partition]
		rt.mu.Unlock()
		if t == nil {
			return // revoked meanwhile; the new owner reads from the committed offset
		}
		select {
		case t.inbox <- batch{topic: p.Topic, recs: p.Records, hwm: p.HighWatermark}:
		case <-t.done:
		case <-ctx.Done():
		}
	})
}

// assigned starts a task for each newly assigned partition. Fetching for it
// stays paused until its restore is done.
func (rt *Runtime) assigned(_ context.Context, cl *kgo.Client, parts map[string][]int32) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.mu.stopping {
		return
	}
	rt.mu.assigned = true
	var started []int32
	for _, ps := range parts {
		for _, p := range ps {
			if _, ok := rt.mu.tasks[p]; ok {
				continue
			}
			t := newTask(rt, p)
			rt.mu.tasks[p] = t
			started = append(started, p)
		}
	}
	if len(started) == 0 {
		return
	}
	sort.Slice(started, func(i, j int) bool { return started[i] < started[j] })
	cl.PauseFetchPartitions(rt.topicsOf(started))
	rt.mu.restoring = make(map[int32]bool)
	rt.mu.restoreAll = nil
	rt.mu.restoreAt = time.Now()
	for _, p := range started {
		t := rt.mu.tasks[p]
		rt.mu.restoring[p] = true
		rt.mu.restoreAll = append(rt.mu.restoreAll, t.name)
		rt.wg.Add(1)
		go func() {
			defer rt.wg.Done()
			if err := t.run(rt.work); err != nil {
				rt.failOnce.Do(func() {
					rt.failure = err
					close(rt.failed)
				})
			}
		}()
	}
	rt.log.Info("Assigned partitions", zap.Strings("tasks", rt.mu.restoreAll))
}

// taskRestored resumes fetching for a restored task and logs when the whole
// latest assignment is restored.
func (rt *Runtime) taskRestored(t *task) {
	rt.client.ResumeFetchPartitions(rt.topicsOf([]int32{t.partition}))
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if !rt.mu.restoring[t.partition] {
		return
	}
	delete(rt.mu.restoring, t.partition)
	if len(rt.mu.restoring) == 0 {
		ms := time.Since(rt.mu.restoreAt).Milliseconds()
		rt.log.Info(fmt.Sprintf("Restoration took %d ms for all tasks [%s]", ms, strings.Join(rt.mu.restoreAll, ", ")),
			zap.Int64("duration_ms", ms), zap.Strings("tasks", rt.mu.restoreAll))
	}
}

func (rt *Runtime) topicsOf(ps []int32) map[string][]int32 {
	return map[string][]int32{rt.cfg.InputTopic: ps, rt.cfg.RepartitionTopic(): ps}
}

// revoked stops the tasks of revoked partitions: each drains what it was
// handed, flushes and checkpoints; then their offsets are committed before
// the partitions are let go.
func (rt *Runtime) revoked(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
	ps := rt.partitionsOf(parts)
	if rt.eos {
		// A rebalance can come at any time: the session aborts the open
		// transaction, so the revoked tasks' uncommitted totals are dropped
		// and their stores hold the committed state.
		if err := rt.stopTasks(ps, false); err != nil {
			rt.log.Error("Stopping revoked tasks", zap.Error(err))
		}
		return
	}
	if err := rt.stopTasks(ps, true); err != nil {
		rt.log.Error("Stopping revoked tasks", zap.Error(err))
	}
	if err := rt.committer.commit(ctx, cl); err != nil {
		rt.log.Error("Committing offsets of revoked partitions", zap.Error(err))
	}
}

// lost drops the tasks of lost partitions without committing: another
// member may own them already.
func (rt *Runtime) lost(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
	ps := rt.partitionsOf(parts)
	if err := rt.stopTasks(ps, false); err != nil {
		rt.log.Warn("Dropping lost tasks", zap.Error(err))
	}
	rt.committer.forget(rt.cfg.InputTopic, ps)
	rt.committer.forget(rt.cfg.RepartitionTopic(), ps)
}

// partitionsOf returns the task partitions among parts: a task goes when
// its input partition goes.
func (rt *Runtime) partitionsOf(parts map[string][]int32) []int32 {
	return parts[rt.cfg.InputTopic]
}

func (rt *Runtime) allPartitions() []int32 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var ps []int32
	for p := range rt.mu.tasks {
		ps = append(ps, p)
	}
	return ps
}

// stopTasks stops the tasks of ps and waits for them.
func (rt *Runtime) stopTasks(ps []int32, flush bool) error {
	rt.mu.Lock()
	var ts []*task
	for _, p := range ps {
		if t, ok := rt.mu.tasks[p]; ok {
			ts = append(ts, t)
			delete(rt.mu.tasks, p)
			delete(rt.mu.restoring, p)
		}
	}
	if len(rt.mu.tasks) == 0 {
		rt.mu.assigned = false
	}
	rt.mu.Unlock()
	for _, t := range ts {
		select {
		case t.stop <- flush:
		default:
		}
	}
	var errs []error
	for _, t := range ts {
		<-t.done
		if s := t.State(); s == TaskFailed {
			errs = append(errs, fmt.Errorf("task %s failed", t.name))
		}
		t.log.Info(fmt.Sprintf("task [%s] Closed", t.name), zap.Bool("flushed", flush))
	}
	return errors.Join(errs...)
}

// checkWritable tells whether partition's store can take a write.
func (rt *Runtime) checkWritable(partition int32) error {
	if rt.knobs.StoreWritable != nil {
		return rt.knobs.StoreWritable(partition)
	}
	return rt.dir.CheckWritable(partition)
}

func (rt *Runtime) crashPoint(name string) {
	if rt.knobs.CrashPoint != nil {
		rt.knobs.CrashPoint(name)
	}
}

// commitLoop commits the offsets tasks report, as soon as they report them
// (several reports arriving together are one commit).
func (rt *Runtime) commitLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-rt.committer.kick:
			if err := rt.committer.commit(ctx, rt.client); err != nil && ctx.Err() == nil {
				rt.log.Warn("Committing offsets", zap.Error(err))
			}
		}
	}
}

// committer holds the offsets tasks made safe to commit (their changelog is
// acknowledged and their store written) until they are committed.
type committer struct {
	mu      sync.Mutex
	pending map[string]map[int32]kgo.EpochOffset
	onDone  func()
	kick    chan struct{} // signalled by report; buffered 1
}

func (c *committer) report(topic string, partition int32, next int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = make(map[string]map[int32]kgo.EpochOffset)
	}
	if c.pending[topic] == nil {
		c.pending[topic] = make(map[int32]kgo.EpochOffset)
	}
	c.pending[topic][partition] = kgo.EpochOffset{Epoch: -1, Offset: next}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *committer) forget(topic string, ps []int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		delete(c.pending[topic], p)
	}
}

// commit commits the pending offsets synchronously. Offsets that fail to
// commit are kept for the next try, unless newer ones arrived meanwhile.
func (c *committer) commit(ctx context.Context, cl *kgo.Client) error {
	c.mu.Lock()
	todo := c.pending
	c.pending = nil
	c.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	var commitErr error
	cl.CommitOffsetsSync(ctx, todo, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			commitErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil && commitErr == nil {
					commitErr = fmt.Errorf("committing %s-%d: %w", t.Topic, p.Partition, e)
				}
			}
		}
	})
	if commitErr != nil {
		c.mu.Lock()
		for topic, ps := range todo {
			for p, eo := range ps {
				if _, newer := c.pending[topic][p]; !newer {
					if c.pending == nil {
						c.pending = make(map[string]map[int32]kgo.EpochOffset)
					}
					if c.pending[topic] == nil {
						c.pending[topic] = make(map[int32]kgo.EpochOffset)
					}
					c.pending[topic][p] = eo
				}
			}
		}
		c.mu.Unlock()
		return commitErr
	}
	if c.onDone != nil {
		c.onDone()
	}
	return nil
}
