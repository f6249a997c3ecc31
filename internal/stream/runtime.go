package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/salesagg/salesagg/internal/assign"
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
	// a test holds a task in the restoring state by blocking in it (until
	// ctx is done: the task was stopped).
	BeforeRestore func(ctx context.Context, partition int32)
	// StoreWritable, if set, replaces the check made before each store
	// write (state.Dir.CheckWritable); tests make it fail.
	StoreWritable func(partition int32) error
	// RestoreProgressEvery overrides how often a restore logs its
	// progress (default 5 s).
	RestoreProgressEvery time.Duration
	// AfterPoll, if set, is called by the poll loop with the number of
	// records each poll returned, before they are dispatched; a test stops
	// the runtime there.
	AfterPoll func(records int)
	// TopologyCheckEvery overrides how often the input topic's identity
	// and partition count are checked while running (default 5 s).
	TopologyCheckEvery time.Duration
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
	topo topology
	// blockCache is the Pebble block cache of every store Run opens.
	blockCache *state.BlockCache
	client     *kgo.Client
	session    *kgo.GroupTransactSession
	admin      *kadm.Client

	// instanceID is the static group membership id: group.instance.id,
	// or derived from the state dir's process id.
	instanceID string
	// appServer is the host:port this instance's HTTP server is reached
	// at, advertised in the group (see Advertise).
	appServer string
	// balancer is the group balancer, made by New; Run (re)starts it for
	// each group session.
	balancer *taskBalancer
	// groupClient is the group session's client, for the balancer's
	// rejoin (set once the client exists).
	groupClient atomic.Pointer[kgo.Client]

	committer committer
	badEvents atomic.Int64
	// metrics are the observed instruments (see metrics.go).
	metrics *instruments
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
		tasks map[int32]*task
		// held are the partitions the group gave this member, per task:
		// heldInput and heldRepartition bits. A task runs only while both
		// are held.
		held map[int32]uint8
		// refused is why the latest assignment is not processed (partial
		// tasks, a partition count this process does not work with); ""
		// when it is.
		refused  string
		assigned bool // an assignment was received since the last revoke of all
		stopping bool
		// restoring is the batch of tasks of the latest assignment still
		// restoring, for the "Restoration took" line.
		restoring  map[int32]bool
		restoreAll []string
		restoreAt  time.Time
		// standbys are the standby (and warm-up) copies running here.
		standbys map[int32]*standby
		// closing are the done channels of tasks stopping here: a standby
		// of the same task opens the store once they are closed.
		closing map[int32]<-chan struct{}
	}
	wg sync.WaitGroup // task and standby goroutines

	// local are the checkpoints the stores on disk were last closed with,
	// for the offsets this member reports to the balancer.
	localMu sync.Mutex
	local   map[int32]state.Checkpoint
	// lastProbe is when this member last asked for a rebalance itself.
	probeMu   sync.Mutex
	lastProbe time.Time

	// failed is closed, with failure set, when a task fails; the poll loop
	// then stops and Run returns the failure.
	// abortCycle makes the exactly-once cycle in progress abort: records
	// of it found no running task, or a task that had folded into it was
	// stopped outside a revoke callback.
	abortCycle atomic.Bool
	// commitSoon: a task has maxDirty changed products; exactly-once, the
	// poll loop runs the transaction cycle without waiting for the
	// interval.
	commitSoon atomic.Bool
	commitNow  chan struct{} // buffered 1: wakes the poll loop for it
	// dropLog rate-limits the warning about records polled for a task
	// that is not running; used by the poll loop only.
	dropLog rateLimiter

	failOnce sync.Once
	failure  error
	failed   chan struct{}

	// rewinds are the tasks waiting for the poll loop to move their
	// position back (at-least-once, see task.rewind); guarded by rewindMu.
	rewindMu sync.Mutex
	rewinds  map[int32]*task
	// rewindKick wakes the poll loop for a rewind; buffered 1.
	rewindKick chan struct{}
}

// New returns a runtime for cfg using the locked state dir.
func New(cfg config.Config, log *zap.Logger, dir *state.Dir, knobs Knobs) *Runtime {
	rt := &Runtime{cfg: cfg, log: log, dir: dir, knobs: knobs, failed: make(chan struct{}), eos: cfg.ProcessingGuarantee == config.ExactlyOnceV2,
		dropLog: rateLimiter{every: 10 * time.Second, burst: 3}}
	rt.mu.tasks = make(map[int32]*task)
	rt.mu.held = make(map[int32]uint8)
	rt.metrics = newInstruments(cfg.ProcessingGuarantee)
	rt.commitNow = make(chan struct{}, 1)
	rt.rewindKick = make(chan struct{}, 1)
	rt.mu.standbys = make(map[int32]*standby)
	rt.mu.closing = make(map[int32]<-chan struct{})
	rt.local = make(map[int32]state.Checkpoint)
	rt.balancer = &taskBalancer{input: cfg.InputTopic, repartition: cfg.RepartitionTopic(), log: log.Named("balancer"),
		opts: assign.Options{AcceptableLag: cfg.AcceptableRecoveryLag, Standbys: cfg.NumStandbyReplicas, MaxWarmups: cfg.MaxWarmupReplicas}}
	rt.balancer.offsets = rt.storeOffsets
	rt.balancer.endOffsets = rt.changelogEnds
	rt.appServer = cfg.AdvertisedServer("")
	rt.instanceID = cfg.GroupInstanceID
	if rt.instanceID == "" {
		rt.instanceID = DefaultInstanceID(cfg.ApplicationID, dir.ProcessID())
	}
	rt.balancer.name = rt.instanceID
	rt.balancer.rejoin = func() {
		// The first sync can come before runGroup stored its client.
		for range 100 {
			if cl := rt.groupClient.Load(); cl != nil {
				cl.ForceRebalance()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	rt.committer.onDone = func() { rt.crashPoint("offsets-committed") }
	rt.committer.held = func(topic string, p int32) bool {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return rt.mu.held[p]&rt.heldBit(topic) != 0
	}
	rt.committer.kick = make(chan struct{}, 1)
	return rt
}

// DefaultInstanceID is the group.instance.id of a process whose config sets
// none: derived from the state dir's process id, so it follows the volume (a
// restart on it replaces the dead member at once) and no two processes
// share it (one process per state dir).
func DefaultInstanceID(appID, processID string) string {
	id := appID + "-" + processID
	if len(id) > 249 {
		id = id[len(id)-249:]
	}
	return id
}

// Advertise sets the host:port other instances reach this one's HTTP
// server at, from the address it is bound to (see
// config.Config.AdvertisedServer). Call it before Run.
func (rt *Runtime) Advertise(bound string) { rt.appServer = rt.cfg.AdvertisedServer(bound) }

// InstanceID returns the static group membership id this process uses.
func (rt *Runtime) InstanceID() string { return rt.instanceID }

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
//
// When the input topic is deleted and recreated, or its partition count
// changes, while running, Run stops its tasks and group client (without
// leaving the group) and starts over on the new topic.
func (rt *Runtime) Run(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	rt.work = work
	rt.blockCache = state.NewBlockCache(rt.cfg.StoreCacheBytes)
	defer rt.blockCache.Close() // stores still open keep their hold

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
	rt.scanLocal()

	var fencings []time.Time
	for {
		err := rt.runGroup(ctx, work, cancelWork)
		switch {
		case errors.Is(err, errTopologyChanged):
			rt.log.Warn("Input topic changed while running; rejoining the group on the new topic", zap.String("input", rt.cfg.InputTopic), zap.Error(err))
		case errors.Is(err, errSessionFenced) && ctx.Err() == nil:
			// A broker that aborted the open transaction after
			// transaction.timeout.ms (Kafka was unreachable that long) fences
			// once; another process using this transactional id fences
			// every new session: give up after a few in a short time.
			fencings = append(fencings, time.Now())
			if len(fencings) > maxFencings {
				fencings = fencings[1:]
				if time.Since(fencings[0]) < fencingWindow {
					return fmt.Errorf("fenced %d times within %s (another process with this transactional id?): %w", maxFencings+1, fencingWindow, err)
				}
			}
			rt.log.Warn("The transactional producer was fenced; the open transaction is aborted and the stores hold the committed state; starting a new session",
				zap.Duration("transaction_timeout", rt.cfg.TransactionTimeout()), zap.Error(err))
		default:
			return err
		}
		rt.reset()
	}
}

// A session fenced more than maxFencings times within fencingWindow ends Run.
const (
	maxFencings   = 3
	fencingWindow = 10 * time.Minute
)

// reset clears what one group session left, before the next.
func (rt *Runtime) reset() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.mu.held = make(map[int32]uint8)
	rt.mu.refused = ""
	rt.mu.assigned = false
	rt.mu.stopping = false
	rt.committer.forgetAll()
	rt.abortCycle.Store(false)
	rt.commitSoon.Store(false)
}

// errTopologyChanged stops a group session: the input topic was recreated or
// its partition count changed.
var errTopologyChanged = errors.New("stream: input topic changed")

// runGroup prepares the topics, joins the group and processes until ctx is
// done, a task fails, or the input topic changes (errTopologyChanged).
func (rt *Runtime) runGroup(ctx, work context.Context, cancelWork context.CancelFunc) error {
	if err := rt.prepareTopics(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	rt.balancer.start(memberInfo{partitions: rt.topo.partitions, processID: rt.dir.ProcessID(), appServer: rt.appServer})

	reset := kgo.NewOffset().AtStart()
	if rt.cfg.AutoOffsetReset == "latest" {
		reset = kgo.NewOffset().AtEnd()
	}
	groupOpts := []kgo.Opt{
		kgo.ConsumerGroup(rt.cfg.ApplicationID),
		kgo.InstanceID(rt.instanceID),
		kgo.SessionTimeout(rt.cfg.SessionTimeout),
		// A third of the session (as Kafka advises), at most the 3 s
		// default: a short session must not expire between heartbeats.
		kgo.HeartbeatInterval(min(3*time.Second, rt.cfg.SessionTimeout/3)),
		kgo.ConsumeTopics(rt.cfg.InputTopic, rt.cfg.RepartitionTopic()),
		kgo.Balancers(rt.balancer),
		kgo.ConsumeResetOffset(reset),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(rt.assigned),
		kgo.OnPartitionsRevoked(rt.revoked),
		kgo.OnPartitionsLost(rt.lost),
		// The lost callback can be swallowed (see assigned); the hook
		// cannot: it runs after every group error that lost the partitions.
		kgo.WithHooks(lostHook{rt}),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		// Forwarded events on the repartition topic become visible to their
		// owner only once the transaction that forwarded them commits.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A fetch long-polls for at most this long (the Java consumer's
		// default); it also bounds how long a partition resumed after its
		// restore waits for the fetch in flight to return.
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.ProducerBatchCompression(compression(rt.cfg.CompressionType)),
		kgo.MaxBufferedRecords(100_000),
	}
	if !rt.eos {
		// At-least-once, a revoke runs between polls: the revoked tasks
		// flush and commit what they processed before letting go.
		groupOpts = append(groupOpts, kgo.BlockRebalanceOnPoll())
	}
	var err error
	if rt.eos {
		txnID := rt.cfg.ApplicationID + "-" + rt.dir.ProcessID()
		groupOpts = append(groupOpts, kgo.TransactionalID(txnID), kgo.TransactionTimeout(rt.cfg.TransactionTimeout()))
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
	rt.groupClient.Store(rt.client)
	rt.log.Info("Joining consumer group", zap.String("group", rt.cfg.ApplicationID), zap.String("group.instance.id", rt.instanceID),
		zap.String("input", rt.cfg.InputTopic), zap.Int32("partitions", rt.topo.partitions), zap.String("process_id", rt.dir.ProcessID()))

	// The watcher ends the session when the input topic changes.
	pollCtx, cancelPoll := context.WithCancelCause(ctx)
	defer cancelPoll(nil)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		rt.watchTopology(pollCtx, cancelPoll)
	}()
	defer func() { <-watchDone }()
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		rt.probeLoop(pollCtx)
	}()
	defer func() { <-probeDone }()
	defer cancelPoll(nil)

	if rt.eos {
		return rt.runEOS(pollCtx, ctx, work, cancelWork)
	}

	commitDone := make(chan struct{})
	commitCtx, stopCommits := context.WithCancel(context.Background())
	go func() {
		defer close(commitDone)
		rt.commitLoop(commitCtx)
	}()

	pollErr := rt.poll(pollCtx)
	changed := topologyChanged(pollCtx, ctx)

	// Shutdown: stop every task with a flush, commit, leave the group.
	deadline := time.AfterFunc(GracePeriod, cancelWork)
	defer deadline.Stop()
	rt.beginStopping()
	stopErr := rt.stopTasks(rt.allPartitions(), true, "flushed and committed")
	stopCommits()
	<-commitDone
	commitErr := rt.committer.commit(work, rt.client)
	rt.client.Close()
	if changed != nil {
		rt.wg.Wait()
		return errors.Join(changed, pollErr, stopErr, commitErr)
	}
	leaveErr := rt.leaveGroup(work)
	rt.stopped(work)
	return errors.Join(pollErr, stopErr, commitErr, leaveErr)
}

// topologyChanged returns errTopologyChanged when the poll context ended
// for that reason (and not for a shutdown).
func topologyChanged(pollCtx, ctx context.Context) error {
	if ctx.Err() == nil && errors.Is(context.Cause(pollCtx), errTopologyChanged) {
		return context.Cause(pollCtx)
	}
	return nil
}

// leaveGroup sends LeaveGroup with this member's instance id, unless
// leave.group.on.close is false: franz-go's Close does not for a static
// member, and without it the group waits out the session timeout before
// moving the tasks.
func (rt *Runtime) leaveGroup(ctx context.Context) error {
	if !rt.cfg.LeaveGroupOnClose {
		rt.log.Info("Keeping group membership on close (leave.group.on.close=false): the tasks stay with this member until it returns or its session times out",
			zap.String("group.instance.id", rt.instanceID), zap.Duration("session_timeout", rt.cfg.SessionTimeout))
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resps, err := rt.admin.LeaveGroup(lctx, kadm.LeaveGroup(rt.cfg.ApplicationID).InstanceIDs(rt.instanceID).Reason("salesagg shutting down"))
	if err == nil {
		err = resps.Error()
	}
	if err != nil && !errors.Is(err, kerr.UnknownMemberID) {
		rt.log.Warn("Leaving the group failed; its tasks move once the session times out", zap.String("group.instance.id", rt.instanceID), zap.Error(err))
		return nil
	}
	rt.log.Info("Left the group", zap.String("group.instance.id", rt.instanceID))
	return nil
}

// runEOS runs the exactly-once poll loop, then shuts down: the last
// transaction commits what was folded, tasks close, the group is left.
func (rt *Runtime) runEOS(pollCtx, ctx, work context.Context, cancelWork context.CancelFunc) error {
	pollErr := rt.pollEOS(pollCtx)
	changed := topologyChanged(pollCtx, ctx)
	deadline := time.AfterFunc(GracePeriod, cancelWork)
	defer deadline.Stop()
	var lastErr error
	if pollErr == nil {
		lastErr = rt.transact(work)
	}
	if errors.Is(pollErr, errSessionFenced) && ctx.Err() == nil {
		// Start over without leaving the group (as for a topology change):
		// the new session rejoins under the same instance id at once.
		rt.beginStopping()
		stopErr := rt.stopTasks(rt.allPartitions(), false, "dropped: the producer was fenced, the store holds the committed state")
		rt.session.Close()
		rt.wg.Wait()
		return errors.Join(pollErr, stopErr)
	}
	rt.beginStopping()
	stopErr := rt.stopTasks(rt.allPartitions(), false, "committed with the last transaction")
	rt.session.Close()
	if changed != nil {
		rt.wg.Wait()
		return errors.Join(changed, pollErr, lastErr, stopErr)
	}
	leaveErr := rt.leaveGroup(work)
	rt.stopped(work)
	return errors.Join(pollErr, lastErr, stopErr, leaveErr)
}

// watchTopology checks the input topic every few seconds and ends the group
// session (cancel with errTopologyChanged) when it was recreated (a new
// topic id) or its partition count changed. A missing topic is waited for:
// the operator is recreating it.
func (rt *Runtime) watchTopology(ctx context.Context, cancel context.CancelCauseFunc) {
	every := 5 * time.Second
	if rt.knobs.TopologyCheckEvery > 0 {
		every = rt.knobs.TopologyCheckEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	missing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		mctx, mcancel := context.WithTimeout(ctx, 10*time.Second)
		md, err := rt.admin.Metadata(mctx, rt.cfg.InputTopic)
		mcancel()
		if err != nil {
			continue // Kafka unreachable: the poll loop reports it
		}
		d, ok := md.Topics[rt.cfg.InputTopic]
		if !ok || d.Err != nil || len(d.Partitions) == 0 {
			if !missing {
				rt.log.Warn("Input topic is missing; waiting for it to be created again", zap.String("input", rt.cfg.InputTopic))
			}
			missing = true
			continue
		}
		missing = false
		switch {
		case d.ID != rt.topo.inputID:
			cancel(fmt.Errorf("%w: topic %s was recreated (topic id %s, was %s)", errTopologyChanged, rt.cfg.InputTopic, d.ID, kadm.TopicID(rt.topo.inputID)))
			return
		case int32(len(d.Partitions)) != rt.topo.partitions:
			cancel(fmt.Errorf("%w: topic %s now has %d partitions, was %d", errTopologyChanged, rt.cfg.InputTopic, len(d.Partitions), rt.topo.partitions))
			return
		}
	}
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

// beginStopping marks the runtime stopping (no task or standby starts any
// more) and stops the standbys.
func (rt *Runtime) beginStopping() {
	rt.mu.Lock()
	rt.mu.stopping = true
	rt.stopStandbysLocked()
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
	if errors.Is(err, context.DeadlineExceeded) || kerr.IsRetriable(err) {
		return true
	}
	var netErr net.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &netErr) && netErr.Timeout(),
		errors.As(err, &opErr), errors.As(err, &dnsErr),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, kerr.CoordinatorNotAvailable), errors.Is(err, kerr.NotCoordinator),
		errors.Is(err, kerr.NotController), errors.Is(err, kerr.LeaderNotAvailable):
		return true
	}
	return false
}

// poll is the loop that owns the group client: it fetches and hands each
// partition's records to its task, until ctx is done or a task fails.
func (rt *Runtime) poll(ctx context.Context) error {
	ctx, cancel := rt.untilFailure(ctx)
	defer cancel()
	for {
		// A task asking for a rewind cuts the poll short: its partitions
		// are paused, so the poll may otherwise wait for other records.
		pctx, pcancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-rt.rewindKick:
				pcancel()
			case <-pctx.Done():
			}
		}()
		fetches := rt.client.PollRecords(pctx, 10_000)
		pcancel()
		if rt.knobs.AfterPoll != nil {
			rt.knobs.AfterPoll(fetches.NumRecords())
		}
		if ctx.Err() != nil || fetches.IsClientClosed() {
			// Records polled now are not committed (at-least-once commits
			// only what tasks report): the next owner reads them again.
			rt.client.AllowRebalance()
			select {
			case <-rt.failed:
				return rt.failure
			default:
				return nil
			}
		}
		rt.dispatch(ctx, fetches, rt.applyRewinds())
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

// dispatch hands each partition's records to its task. It never blocks on a
// task that cannot take them (a stalled task keeps reading its inbox; a
// stopped one is skipped). It reports whether records were left unprocessed
// for want of a running task: exactly-once, the cycle then aborts, so that
// their offsets are not committed and they are read again.
//
// Records of partitions in skip are not dispatched: they were read before
// their task's rewind and are read again.
func (rt *Runtime) dispatch(ctx context.Context, fetches kgo.Fetches, skip map[int32]bool) (dropped bool) {
	fetches.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			rt.log.Warn("Fetching", zap.String("topic", topic), zap.Int32("partition", p), zap.Error(err))
		}
	})
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 || skip[p.Partition] {
			return
		}
		rt.mu.Lock()
		t := rt.mu.tasks[p.Partition]
		rt.mu.Unlock()
		if t == nil || (rt.eos && t.State() != TaskRunning) {
			// Revoked meanwhile (the session aborts and the new owner reads
			// from the committed offset), or not processing: nothing of
			// these records is committed.
			if ok, suppressed := rt.dropLog.allow(time.Now()); ok {
				rt.log.Warn("Records polled for a task that is not running here; they are not committed and are read again",
					zap.String("topic", p.Topic), zap.Int32("partition", p.Partition), zap.Int("records", len(p.Records)), zap.Int64("suppressed", suppressed))
			}
			dropped = true
			return
		}
		select {
		case t.inbox <- batch{topic: p.Topic, recs: p.Records, hwm: p.HighWatermark, epoch: t.rewindEpoch.Load()}:
		case <-t.done:
			dropped = true
		case <-ctx.Done():
			dropped = true
		}
	})
	return dropped
}

// Bits of Runtime.mu.held.
const (
	heldInput uint8 = 1 << iota
	heldRepartition
	heldBoth = heldInput | heldRepartition
)

func (rt *Runtime) heldBit(topic string) uint8 {
	switch topic {
	case rt.cfg.InputTopic:
		return heldInput
	case rt.cfg.RepartitionTopic():
		return heldRepartition
	}
	return 0
}

// assigned reconciles the tasks with the assignment of the latest
// SyncGroup, which franz-go calls it after, every time (also with nothing
// added), and starts a task for each task whose input and repartition
// partitions are now both held. Fetching for a new task stays paused until
// its restore is done. A partial task (one of its two partitions) or an
// assignment made for another partition count is refused: logged, paused,
// never processed, and the process is not ready.
//
// Nothing is inferred from the revoke and lost callbacks having fired:
// exactly-once, franz-go's transact session calls them only for the first
// revoke (or loss) of a transaction, so a second one before the
// transaction ends never reaches the runtime. Hence, here:
//   - a task whose partitions the latest assignment does not give this
//     member is stopped (its part of the open transaction aborted);
//   - a task whose partition franz-go reports as newly added was lost
//     meanwhile (another member may have run it): the old task object is
//     stopped and a new one restores from its checkpoint.
func (rt *Runtime) assigned(_ context.Context, cl *kgo.Client, added map[string][]int32) {
	defer rt.reconcileStandbys()
	current := rt.balancer.synced()
	held := make(map[int32]uint8)
	for topic, ps := range current {
		for _, p := range ps {
			if bit := rt.heldBit(topic); bit != 0 {
				held[p] |= bit
			}
		}
	}
	rt.mu.Lock()
	if rt.mu.stopping {
		rt.mu.Unlock()
		return
	}
	readded := map[int32]bool{}
	for _, ps := range added {
		for _, p := range ps {
			readded[p] = true
		}
	}
	var gone, reused []int32
	for p, t := range rt.mu.tasks {
		select {
		case <-t.done:
			// Ended on its own (lost its membership): replaced below.
			reused = append(reused, p)
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
	rt.mu.Unlock()
	if len(gone)+len(reused) > 0 {
		sort.Slice(gone, func(i, j int) bool { return gone[i] < gone[j] })
		sort.Slice(reused, func(i, j int) bool { return reused[i] < reused[j] })
		rt.log.Warn("Stopping tasks the latest assignment does not leave running here (their revoke or loss was not signalled); their uncommitted work is dropped",
			zap.Strings("not_assigned", taskNames(gone)), zap.Strings("reassigned", taskNames(reused)), zap.Int32("generation", generation(cl)))
		if rt.eos {
			// Their folded records are in the open transaction.
			rt.abortCycle.Store(true)
		}
		if err := rt.stopTasks(append(gone, reused...), false, "dropped: the latest assignment moved it, nothing more committed"); err != nil {
			rt.log.Warn("Stopping unassigned tasks", zap.Error(err))
		}
		rt.committer.forget(rt.cfg.InputTopic, append(gone, reused...))
		rt.committer.forget(rt.cfg.RepartitionTopic(), append(gone, reused...))
	}

	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.mu.stopping {
		return
	}
	rt.mu.held = held
	rt.mu.assigned = true
	info := rt.balancer.assignment()
	if info.partitions != 0 && info.partitions != rt.topo.partitions {
		rt.mu.refused = fmt.Sprintf("the group leader assigned tasks for %d partitions, this process works with %d", info.partitions, rt.topo.partitions)
		rt.log.Error("Refusing the assignment: "+rt.mu.refused+"; not processing it (restart this process if the input topic changed)",
			zap.Int32("leader_partitions", info.partitions), zap.Int32("partitions", rt.topo.partitions))
		cl.PauseFetchPartitions(current)
		return
	}
	var started, partial []int32
	for p, bits := range rt.mu.held {
		if bits != heldBoth {
			partial = append(partial, p)
			continue
		}
		if _, ok := rt.mu.tasks[p]; ok {
			continue
		}
		started = append(started, p)
	}
	rt.mu.refused = ""
	if len(partial) > 0 {
		sort.Slice(partial, func(i, j int) bool { return partial[i] < partial[j] })
		rt.mu.refused = fmt.Sprintf("partial tasks %v: the input and repartition partitions of a task must be assigned together", taskNames(partial))
		rt.log.Error("Refusing partial tasks: each holds only one of its input and repartition partitions; not processing them",
			zap.Strings("tasks", taskNames(partial)), zap.Any("assigned", current))
		cl.PauseFetchPartitions(rt.topicsOf(partial))
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
		t := newTask(rt, p)
		// A standby copy here stops first: the task takes its store over
		// and restores only what it lacked.
		t.standbyAt, t.standbyApplied = rt.takeStandbyLocked(p)
		rt.mu.tasks[p] = t
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
	rt.log.Info("Assigned partitions", zap.Strings("tasks", rt.mu.restoreAll), zap.Int32("generation", generation(cl)))
}

// lostHook drops every task when the group session ends in an error that
// lost the partitions. franz-go calls the lost callback first, but the
// exactly-once session swallows a second one within a transaction; this
// hook is not wrapped.
type lostHook struct{ rt *Runtime }

var _ kgo.HookGroupManageError = lostHook{}

func (h lostHook) OnGroupManageError(err error) {
	rt := h.rt
	ps := rt.allPartitions()
	rt.mu.Lock()
	rt.mu.held = make(map[int32]uint8)
	rt.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	rt.log.Warn("Group session lost; dropping its tasks without committing", zap.Strings("tasks", taskNames(ps)), zap.Error(err))
	if rt.eos {
		rt.abortCycle.Store(true)
	}
	if err := rt.stopTasks(ps, false, "dropped: group session lost, nothing committed"); err != nil {
		rt.log.Warn("Dropping lost tasks", zap.Error(err))
	}
	rt.committer.forget(rt.cfg.InputTopic, ps)
	rt.committer.forget(rt.cfg.RepartitionTopic(), ps)
	rt.reconcileStandbys()
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

// taskRestored resumes fetching for a restored task and logs when the whole
// latest assignment is restored.
func (rt *Runtime) taskRestored(t *task) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.mu.tasks[t.partition] != t {
		return // stopped meanwhile: its partitions stay paused
	}
	rt.client.ResumeFetchPartitions(rt.topicsOf([]int32{t.partition}))
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
	if !rt.eos {
		// The partitions are let go only once their last offsets are
		// committed (the committer commits only what this member holds).
		defer rt.release(parts)
	}
	ps := partitionsOf(parts)
	if rt.eos {
		rt.release(parts)
	}
	if len(ps) > 0 {
		rt.log.Info("Revoking tasks", zap.Strings("tasks", taskNames(ps)), zap.Int32("generation", generation(cl)))
	}
	if rt.eos {
		// A rebalance can come at any time: the session aborts the open
		// transaction, so the revoked tasks' uncommitted totals are dropped
		// and their stores hold the committed state.
		if err := rt.stopTasks(ps, false, "revoked; the open transaction is aborted, the store holds the committed state"); err != nil {
			rt.log.Error("Stopping revoked tasks", zap.Error(err))
		}
		rt.reconcileStandbys()
		return
	}
	if err := rt.stopTasks(ps, true, "revoked; flushed and committed"); err != nil {
		rt.log.Error("Stopping revoked tasks", zap.Error(err))
	}
	if err := rt.committer.commit(ctx, cl); err != nil {
		rt.log.Error("Committing offsets of revoked partitions", zap.Error(err))
	}
	rt.reconcileStandbys()
}

// lost drops the tasks of lost partitions without committing: another
// member may own them already.
func (rt *Runtime) lost(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
	ps := rt.release(parts)
	if len(ps) > 0 {
		rt.log.Warn("Lost tasks (the group moved on without this member); dropping them without committing", zap.Strings("tasks", taskNames(ps)))
	}
	if err := rt.stopTasks(ps, false, "dropped: partitions lost, nothing committed"); err != nil {
		rt.log.Warn("Dropping lost tasks", zap.Error(err))
	}
	rt.committer.forget(rt.cfg.InputTopic, ps)
	rt.committer.forget(rt.cfg.RepartitionTopic(), ps)
	rt.reconcileStandbys()
}

// release records that the group took parts back and returns the tasks
// that lost either of their partitions: they stop, whichever went.
func (rt *Runtime) release(parts map[string][]int32) []int32 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	seen := map[int32]bool{}
	var ps []int32
	for topic, tps := range parts {
		for _, p := range tps {
			rt.mu.held[p] &^= rt.heldBit(topic)
			if rt.mu.held[p] == 0 {
				delete(rt.mu.held, p)
			}
			if !seen[p] {
				seen[p] = true
				ps = append(ps, p)
			}
		}
	}
	refusedLeft := false
	for _, bits := range rt.mu.held {
		if bits != heldBoth {
			refusedLeft = true
		}
	}
	if !refusedLeft {
		rt.mu.refused = ""
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
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

func (rt *Runtime) allPartitions() []int32 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var ps []int32
	for p := range rt.mu.tasks {
		ps = append(ps, p)
	}
	return ps
}

// stopTasks stops the tasks of ps and waits for them. A task still restoring
// cancels its restore at once; the wait is bounded by that, not by the
// restore's length.
//
// outcome says, in the Closed line, what became of the tasks' last changes.
func (rt *Runtime) stopTasks(ps []int32, flush bool, outcome string) error {
	rt.mu.Lock()
	var ts []*task
	for _, p := range ps {
		if t, ok := rt.mu.tasks[p]; ok {
			ts = append(ts, t)
			delete(rt.mu.tasks, p)
			delete(rt.mu.restoring, p)
			rt.mu.closing[p] = t.done
		}
	}
	if len(rt.mu.tasks) == 0 {
		rt.mu.assigned = false
	}
	rt.mu.Unlock()
	for _, t := range ts {
		t.requestStop(flush)
	}
	var errs []error
	for _, t := range ts {
		<-t.done
		if s := t.State(); s == TaskFailed {
			errs = append(errs, fmt.Errorf("task %s failed", t.name))
		}
		if t.State() == TaskFailed {
			t.log.Info(fmt.Sprintf("task [%s] Closed after a failure", t.name))
		} else {
			t.log.Info(fmt.Sprintf("task [%s] Closed: %s", t.name, outcome), zap.String("outcome", outcome))
		}
		if t.State() == TaskClosed && t.cp.ChangelogTopicID == rt.topo.changelogID && t.stats.checkpoint.Load() >= 0 {
			// The task goroutine is done: its checkpoint is final.
			rt.noteLocal(t.partition, t.cp)
		}
	}
	rt.mu.Lock()
	for _, t := range ts {
		if rt.mu.closing[t.partition] == (<-chan struct{})(t.done) {
			delete(rt.mu.closing, t.partition)
		}
	}
	rt.mu.Unlock()
	return errors.Join(errs...)
}

// checkMembership asks the group coordinator whether this member is still
// in the generation it knows (a Heartbeat with its member id, generation and
// instance id). At-least-once, a task checks it before writing its
// changelog: a member that was paused past its session timeout (a zombie)
// learns it lost its tasks before it writes over their new owner. A
// rebalance in progress is fine: a cooperative member keeps its tasks until
// it revokes them, and nobody else gets them before.
func (rt *Runtime) checkMembership(ctx context.Context) error {
	member, gen := rt.client.GroupMetadata()
	if member == "" || gen < 0 {
		return errors.New("not a group member yet")
	}
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = rt.cfg.ApplicationID
	req.MemberID = member
	req.Generation = gen
	req.InstanceID = &rt.instanceID
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(cctx, rt.client)
	if err != nil {
		return fmt.Errorf("checking group membership: %w", err)
	}
	err = kerr.ErrorForCode(resp.ErrorCode)
	switch {
	case err == nil, errors.Is(err, kerr.RebalanceInProgress):
		return nil
	case errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.FencedInstanceID):
		return fmt.Errorf("%w (generation %d): %w", errNotMember, gen, err)
	}
	return fmt.Errorf("checking group membership (generation %d): %w", gen, err)
}

// errNotMember: the group coordinator says this member is not in the
// generation it knows (it was expired, fenced or replaced); its tasks are
// someone else's now.
var errNotMember = errors.New("stream: not a member of the group's generation")

// requestRewind asks the poll loop to move task t's partitions back to the
// offsets t folds again from (see task.rewind).
func (rt *Runtime) requestRewind(t *task) {
	rt.rewindMu.Lock()
	defer rt.rewindMu.Unlock()
	if rt.rewinds == nil {
		rt.rewinds = map[int32]*task{}
	}
	rt.rewinds[t.partition] = t
	select {
	case rt.rewindKick <- struct{}{}:
	default:
	}
}

// applyRewinds moves the positions of the tasks that asked for it, between
// two polls (the poll loop owns the client; at-least-once a revoke cannot
// run meanwhile), and returns their partitions: what the last poll returned
// for them is from before the rewind and is not dispatched.
func (rt *Runtime) applyRewinds() map[int32]bool {
	rt.rewindMu.Lock()
	todo := rt.rewinds
	rt.rewinds = nil
	rt.rewindMu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	skip := map[int32]bool{}
	set := map[string]map[int32]kgo.EpochOffset{}
	for p, t := range todo {
		rt.mu.Lock()
		current := rt.mu.tasks[p] == t
		rt.mu.Unlock()
		if !current {
			continue // stopped meanwhile: its next owner starts from the commits
		}
		to := t.rewindTo()
		for i, topic := range []string{rt.cfg.InputTopic, rt.cfg.RepartitionTopic()} {
			if to[i] < 0 {
				continue
			}
			if set[topic] == nil {
				set[topic] = map[int32]kgo.EpochOffset{}
			}
			set[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: to[i]}
		}
		skip[p] = true
		t.log.Info(fmt.Sprintf("task [%s] Rewinding to the last committed offsets", t.name),
			zap.Int64("input_offset", to[0]), zap.Int64("repartition_offset", to[1]))
	}
	rt.client.SetOffsets(set)
	for p := range skip {
		todo[p].rewindEpoch.Add(1)
	}
	return skip
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
	pending map[string]map[int32]kgo.EpochOffset // guarded by mu
	// gen counts forgets; forgot is the gen at which each partition was
	// last forgotten (its task stopped or was lost), so that a commit that
	// failed does not put back offsets of a partition forgotten meanwhile.
	// Guarded by mu.
	gen    uint64
	forgot map[string]map[int32]uint64
	onDone func()
	kick   chan struct{} // signalled by report; buffered 1
	// held, if set, tells whether this member holds a partition now: only
	// those are committed.
	held func(topic string, partition int32) bool
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

func (c *committer) forgetAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for topic, ps := range c.pending {
		for p := range ps {
			c.markForgotLocked(topic, p)
		}
	}
	c.pending = nil
	// Offsets in flight are of partitions whose session ended: none is put
	// back (see commit).
	c.forgot = map[string]map[int32]uint64{"": {-1: c.gen}}
}

func (c *committer) forget(topic string, ps []int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, p := range ps {
		delete(c.pending[topic], p)
		c.markForgotLocked(topic, p)
	}
}

func (c *committer) markForgotLocked(topic string, p int32) {
	if c.forgot == nil {
		c.forgot = map[string]map[int32]uint64{}
	}
	if c.forgot[topic] == nil {
		c.forgot[topic] = map[int32]uint64{}
	}
	c.forgot[topic][p] = c.gen
}

// forgottenSince reports whether topic/p was forgotten after gen.
func (c *committer) forgottenSince(topic string, p int32, gen uint64) bool {
	return c.forgot[topic][p] > gen || c.forgot[""][-1] > gen
}

// commit commits the pending offsets synchronously, those of partitions
// this member holds. Offsets that fail to commit are kept for the next try,
// unless newer ones arrived or the partition was forgotten meanwhile.
func (c *committer) commit(ctx context.Context, cl *kgo.Client) error {
	c.mu.Lock()
	todo := c.pending
	c.pending = nil
	gen := c.gen
	c.mu.Unlock()
	if c.held != nil {
		for topic, ps := range todo {
			for p := range ps {
				if !c.held(topic, p) {
					delete(ps, p)
				}
			}
		}
	}
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
				if _, newer := c.pending[topic][p]; newer || c.forgottenSince(topic, p, gen) {
					continue
				}
				if c.pending == nil {
					c.pending = make(map[string]map[int32]kgo.EpochOffset)
				}
				if c.pending[topic] == nil {
					c.pending[topic] = make(map[int32]kgo.EpochOffset)
				}
				c.pending[topic][p] = eo
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

// storeOptions are the options of the stores the runtime opens for writing:
// they share the runtime's block cache (a store of their own before Run).
func (rt *Runtime) storeOptions() state.OpenOptions {
	return state.OpenOptions{BlockCache: rt.blockCache}
}
