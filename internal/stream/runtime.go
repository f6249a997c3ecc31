package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/assign"
	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
)

// Knobs are hooks for tests. The zero value does nothing.
type Knobs struct {
	// CrashPoint, if set, is called at the named points of the commit
	// cycle ("flush-start", "changelog-produced", "changelog-flushed",
	// "store-written", "offsets-committed") and of a full restore's bulk
	// load ("bulk-spilled" after each sorted run, "bulk-ingest" before the
	// tables are ingested); a test kills the process there.
	CrashPoint func(point string)
	// BeforeRestore, if set, is called by each task before it restores;
	// a test holds a task in the restoring state by blocking in it (until
	// ctx is done: the task was stopped).
	BeforeRestore func(ctx context.Context, partition int32)
	// BeforeProductListing, if set, is called by each task that starts on a
	// store with data, in the goroutine that lists the store's products
	// for its filter of new products, before it lists them; a test holds
	// the filter learning by blocking in it (until ctx is done: the task
	// stopped).
	BeforeProductListing func(ctx context.Context, partition int32)
	// beforeCopyClose, if set, is called by each standby copy that was
	// asked to stop, before it closes its store; a test keeps the store
	// open by blocking in it (until ctx is done: the grace period ran out).
	beforeCopyClose func(ctx context.Context, partition int32)
	// StoreWritable, if set, replaces the check made before each store
	// write (state.Dir.CheckWritable); tests make it fail.
	StoreWritable func(partition int32) error
	// RestoreProgressEvery overrides how often a restore logs its
	// progress (default 5 s).
	RestoreProgressEvery time.Duration
	// RestoreMemoryBytes overrides the memory the bulk loads of full
	// restores share (default 64 MiB).
	RestoreMemoryBytes int64
	// AfterPoll, if set, is called by the poll loop with the number of
	// records each poll returned, before they are dispatched; a test stops
	// the runtime there.
	AfterPoll func(records int)
	// TopologyCheckEvery overrides how often the input topic's identity
	// and partition count are checked while running (default 5 s).
	TopologyCheckEvery time.Duration
	// maxDirty overrides how many changed products and records to
	// produce a task keeps before it flushes early (default 100,000).
	maxDirty int
	// AfterSummary, if set, is called at the end of each
	// log.summary.interval.ms with whether the summary was logged.
	AfterSummary func(logged bool)
	// FlushProduced, if set, is called by each at-least-once flush once
	// it handed its records to the client, before it waits for them, with
	// the task's partition and how many records it produced.
	FlushProduced func(partition int32, records int)
	// LeaseLapseDelay, if set, makes the lease loop lapse the lease only
	// that long past its deadline (the tasks are overdue meanwhile): a
	// test widens the window in which records are polled for overdue
	// tasks and a heartbeat answer can still hold the lease again.
	LeaseLapseDelay time.Duration
	// Dial, if set, dials every broker connection of the runtime's
	// clients (not with TLS); a test routes them through a fault proxy.
	Dial func(ctx context.Context, network, host string) (net.Conn, error)
}

// Runtime runs salesagg's tasks for one process. Create it with New and run
// it with Run; its status methods are safe to call from any goroutine.
//
// Run runs one group session after another (session.go): a session joins
// the group, runs the tasks and standby copies the assignments give this
// member, and shuts down; a new one starts when the input topic changed or
// the producer was fenced. What outlives a session is here: the env, the
// registry the status reads, the balancer, the local stores' checkpoints.
type Runtime struct {
	env *env
	reg *registry
	// bal is the classic protocol's balancer, member the streams group
	// member (group.protocol streams); asg is what the status and the
	// queries read of the latest assignment: one of the two.
	bal    *taskBalancer
	member *streamsMember
	asg    assignor
	local  *localStores
	// appServer is the host:port this instance's HTTP server is reached
	// at, advertised in the group (set by Advertise before Run).
	appServer string
	// current is the group session running (nil before the first).
	current atomic.Pointer[session]
	// described is the streams group as its coordinator describes it,
	// for /v1/instances (group.protocol streams).
	described groupDescription
}

// New returns a runtime for cfg using the locked state dir.
func New(cfg config.Config, log *zap.Logger, dir *state.Dir, knobs Knobs) *Runtime {
	e := &env{cfg: cfg, log: log, dir: dir, knobs: knobs, eos: cfg.ProcessingGuarantee == config.ExactlyOnceV2, reach: newReachability(log), waits: newKafkaWaits(log), kafkaLog: newLogRepeats(),
		metrics: newInstruments(cfg.ProcessingGuarantee), instanceID: cfg.GroupInstanceID}
	if e.instanceID == "" {
		e.instanceID = cfg.DerivedInstanceID(dir.ProcessID())
	}
	rt := &Runtime{env: e, reg: newRegistry(), local: newLocalStores(), appServer: cfg.AdvertisedServer("")}
	rt.bal = &taskBalancer{input: cfg.InputTopic, repartition: cfg.RepartitionTopic(), changelog: cfg.ChangelogTopic(), log: log.Named("balancer"), name: e.instanceID,
		opts: assign.Options{AcceptableLag: cfg.AcceptableRecoveryLag, Standbys: cfg.NumStandbyReplicas, MaxWarmups: cfg.MaxWarmupReplicas}}
	rt.asg = rt.bal
	if cfg.GroupProtocol == config.GroupProtocolStreams {
		rt.member = newStreamsMember(cfg.ApplicationID, dir.ProcessID(), e.instanceID)
		rt.asg = rt.member
	}
	rt.bal.offsets = func() (map[int32]int64, map[int32]int64) {
		if s := rt.current.Load(); s != nil {
			return s.storeOffsets()
		}
		return rt.local.offsets(rt.reg.topology().changelogID), nil
	}
	rt.bal.endOffsets = func(ctx context.Context) (map[int32]int64, error) {
		return changelog.Ends(ctx, e.admin, cfg.ChangelogTopic())
	}
	// A static member that restarted on another port got its old
	// assignment back: rejoin, from the session's goroutines.
	rt.bal.rejoin = func() {
		if s := rt.current.Load(); s != nil {
			s.goroutine(s.rejoin)
		}
	}
	return rt
}

// Advertise sets the host:port other instances reach this one's HTTP
// server at, from the address it is bound to (see
// config.Config.AdvertisedServer). Call it before Run.
func (rt *Runtime) Advertise(bound string) { rt.appServer = rt.env.cfg.AdvertisedServer(bound) }

// InstanceID returns the static group membership id this process uses.
func (rt *Runtime) InstanceID() string { return rt.env.instanceID }

// GracePeriod bounds how long Run takes to stop once its context is done.
const GracePeriod = 30 * time.Second

// A session fenced more than maxFencings times within fencingWindow, each
// time sooner than the transaction timeout, ends Run.
const (
	maxFencings   = 3
	fencingWindow = 10 * time.Minute
)

// errTopologyChanged stops a group session: the input topic was recreated or
// its partition count changed.
var errTopologyChanged = errors.New("stream: input topic changed")

// Run connects to Kafka, prepares the topics, joins the group and processes
// until ctx is done; then it stops every task (flushing and checkpointing),
// commits, leaves the group and closes the stores within GracePeriod.
//
// When the input topic is deleted and recreated, or its partition count
// changes, while running, Run stops its tasks and group client (without
// leaving the group) and starts over on the new topic; likewise when the
// exactly-once producer was fenced (the broker aborted its transaction).
func (rt *Runtime) Run(ctx context.Context) error {
	e := rt.env
	// work is canceled when the shutdown grace period runs out, not when
	// shutdown begins.
	work, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	e.blockCache = state.NewBlockCache(e.cfg.StoreCacheBytes)
	defer e.blockCache.Close() // stores still open keep their hold
	e.bulkBudget = state.NewBulkBudget(cmp.Or(e.knobs.RestoreMemoryBytes, restoreMemoryBytes))
	var err error
	if e.secOpts, err = SecurityOpts(e.cfg.Security); err != nil {
		return err
	}
	adminClient, err := kgo.NewClient(e.kafkaOpts()...)
	if err != nil {
		return fmt.Errorf("creating Kafka client: %w", err)
	}
	defer adminClient.Close()
	e.admin, e.client = kadm.NewClient(adminClient), adminClient
	rt.local.scan(e.dir, e.log)
	if e.cfg.LogSummaryInterval > 0 {
		stopSummary, summaryDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(summaryDone)
			rt.runSummary(e.cfg.LogSummaryInterval, stopSummary)
		}()
		defer func() {
			close(stopSummary)
			<-summaryDone
		}()
	}

	var fencings []time.Time
	for {
		topo, err := prepareTopics(ctx, e)
		if err != nil || ctx.Err() != nil {
			return err
		}
		rt.reg.setTopology(topo)
		s := newSession(e, rt.reg, rt.bal, rt.member, rt.local, topo, work.Done())
		rt.current.Store(s)
		err = s.run(ctx, work, cancelWork, rt.appServer)
		switch {
		case errors.Is(err, errTopologyChanged):
			e.log.Warn("Input topic changed while running; rejoining the group on the new topic", zap.String("input", e.cfg.InputTopic), zap.Error(err))
		case errors.Is(err, errProducerIDLost) && ctx.Err() == nil:
			e.log.Warn("The transactional producer could not get its producer id (a broker failed while it asked); the stores hold the committed state; starting a new session",
				zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		case errors.Is(err, errSessionFenced) && ctx.Err() == nil:
			var f *fencing
			errors.As(err, &f)
			timeout := e.cfg.TransactionTimeout()
			if f != nil && f.timedOut(timeout) {
				// The broker aborted a transaction that outlived its
				// timeout (Kafka unreachable, the process paused that
				// long): this process's own, as often as it happens.
				e.log.Warn("The transactional producer was fenced: its transaction was open past transaction.timeout.ms and the broker aborted it; the stores hold the committed state; starting a new session",
					zap.Duration("open", f.open.Round(time.Millisecond)), zap.Duration("transaction_timeout", timeout), zap.Error(err))
				break
			}
			// Fenced sooner than the broker's timeout: another producer
			// initialised this transactional id. Another process using
			// it fences every new session: give up after a few.
			fencings = append(fencings, time.Now())
			if len(fencings) > maxFencings {
				fencings = fencings[1:]
				if time.Since(fencings[0]) < fencingWindow {
					return fmt.Errorf("fenced %d times within %s, each time sooner than transaction.timeout.ms (another process with this transactional id?): %w", maxFencings+1, fencingWindow, err)
				}
			}
			var open time.Duration
			if f != nil {
				open = f.open
			}
			e.log.Warn("The transactional producer was fenced sooner than transaction.timeout.ms: another producer took its transactional id (another process with this state dir's process id?); the stores hold the committed state; starting a new session",
				zap.Duration("open", open.Round(time.Millisecond)), zap.Duration("transaction_timeout", timeout), zap.Int("recent", len(fencings)), zap.Error(err))
		default:
			return err
		}
		rt.reg.reset()
	}
}
