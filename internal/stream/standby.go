package stream

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/assign"
	"github.com/salesagg/salesagg/internal/state"
)

// Standby tasks.
//
// A standby of task p on this member tails changelog partition p
// (read_committed) into the task's local store, the one the active task
// would open here, with the same checkpoint. When the task becomes active
// here, its restore starts from that checkpoint and replays only what the
// standby lacked. A standby never processes input and never writes to
// Kafka; it never runs on the member running its active task (the balancer
// sees to it, and the member stops its standby before starting the task).
// A warm-up is a standby built on the member a task should move to: once it
// has caught up, the member rejoins so that the balancer moves the task.
//
// Memory is bounded whatever the lag: one fetch of at most
// standbyFetchBytes is buffered at a time, and each fetch is one store
// batch.

// standbyFetchBytes bounds one standby fetch.
const standbyFetchBytes = 4 << 20

// standbyRetry is how long a standby that failed waits before starting
// over.
const standbyRetry = 5 * time.Second

type standby struct {
	rt        *Runtime
	partition int32
	name      string
	log       *zap.Logger
	// kind is what the copy is for (set by the reconciler): a copyKind.
	kind atomic.Uint32
	// probe is when this warm-up last asked for a rejoin because it caught
	// up, and the offsets it judged by (the same pair it then reports at
	// the join, see storeOffsets); guarded by probeMu.
	probeMu sync.Mutex
	probe   struct {
		at          time.Time
		offset, end int64
	}
	// after, if not nil, is closed once the store's previous user (this
	// partition's active task, stopping here) is done with it.
	after <-chan struct{}

	quit     chan struct{}
	quitOnce sync.Once
	done     chan struct{}

	store atomic.Pointer[state.Store]
	state atomic.Int32 // TaskRestoring while opening, TaskRunning while tailing
	// position is the next changelog offset the store reflects (-1: not
	// opened yet); end the changelog's last stable offset last seen (-1:
	// unknown); applied the records applied since the standby started.
	position atomic.Int64
	end      atomic.Int64
	applied  atomic.Int64

	cp state.Checkpoint // owned by the goroutine
}

func newStandby(rt *Runtime, p int32, kind copyKind, after <-chan struct{}) *standby {
	s := &standby{rt: rt, partition: p, name: state.TaskName(p), after: after, quit: make(chan struct{}), done: make(chan struct{})}
	s.log = rt.log.With(zap.String("task", s.name), zap.Int32("partition", p), zap.String("role", "standby"))
	s.kind.Store(uint32(kind))
	s.position.Store(-1)
	s.end.Store(-1)
	return s
}

// role names the copy in logs and status: "standby", "warmup" or
// "incoming".
func (s *standby) role() string { return copyKind(s.kind.Load()).String() }

func (s *standby) isWarmup() bool { return copyKind(s.kind.Load()) == kindWarmup }

// lag is how many changelog offsets the store is behind the last stable
// offset last seen (-1: unknown yet).
func (s *standby) lag() int64 {
	pos, end := s.position.Load(), s.end.Load()
	if pos < 0 || end < 0 {
		return -1
	}
	return max(0, end-pos)
}

// stop asks the standby to stop and waits until its store is closed.
func (s *standby) stop() {
	s.quitOnce.Do(func() { close(s.quit) })
	<-s.done
}

// run tails the changelog until stopped. A failure is logged and retried
// after standbyRetry: a standby never stops the process.
func (s *standby) run(ctx context.Context) {
	defer close(s.done)
	if s.after != nil {
		select {
		case <-s.after:
		case <-s.quit:
			return
		case <-ctx.Done():
			return
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	s.log.Info(fmt.Sprintf("task [%s] Starting %s copy", s.name, s.role()))
	for {
		err := s.tail(ctx)
		if st := s.store.Swap(nil); st != nil {
			if cerr := st.Close(); cerr != nil {
				s.log.Warn("Closing standby store", zap.Error(cerr))
			} else if s.position.Load() >= 0 {
				s.rt.noteLocal(s.partition, s.cp)
			}
		}
		if ctx.Err() != nil {
			s.state.Store(int32(TaskClosed))
			s.log.Info(fmt.Sprintf("task [%s] Closed %s copy at changelog offset %d", s.name, s.role(), s.position.Load()),
				zap.Int64("checkpoint", s.position.Load()), zap.Int64("applied", s.applied.Load()))
			return
		}
		s.state.Store(int32(TaskFailed))
		s.log.Warn(fmt.Sprintf("task [%s] Standby copy failed; starting over in %s", s.name, standbyRetry), zap.Error(err))
		select {
		case <-ctx.Done():
			s.state.Store(int32(TaskClosed))
			return
		case <-time.After(standbyRetry):
		}
	}
}

// tail opens the store, validates its checkpoint against the changelog and
// applies the changelog from there until ctx is done.
func (s *standby) tail(ctx context.Context) error {
	s.state.Store(int32(TaskRestoring))
	st, err := s.rt.openStore(s.partition, s.log)
	if err != nil {
		return err
	}
	s.store.Store(st)
	tp := fmt.Sprintf("%s-%d", s.rt.cfg.ChangelogTopic(), s.partition)
	logStart, end, err := s.rt.changelogBounds(ctx, s.partition, s.log)
	if err != nil {
		return err
	}
	cp, found, err := st.Checkpoint()
	if state.IsCorrupt(err) {
		if err := s.wipe(); err != nil {
			return err
		}
		found = false
	} else if err != nil {
		return err
	}
	from, ok := s.rt.checkCheckpoint(s.log, s.name, tp, cp, found, logStart, end)
	if !ok && found {
		if err := s.wipe(); err != nil {
			return err
		}
	}
	if ok {
		s.cp = cp
	} else {
		s.cp = state.Checkpoint{ChangelogOffset: logStart, InputOffset: -1, ChangelogTopicID: s.rt.topo.changelogID}
	}
	s.position.Store(from)
	s.end.Store(end)

	client, err := kgo.NewClient(append(s.rt.kafkaOpts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.rt.cfg.ChangelogTopic(): {s.partition: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxBytes(standbyFetchBytes),
		kgo.FetchMaxPartitionBytes(standbyFetchBytes),
		kgo.MaxConcurrentFetches(1),
		// Out of range is seen (and the copy wiped), never a silent jump.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	)...)
	if err != nil {
		return fmt.Errorf("creating standby consumer: %w", err)
	}
	defer client.Close()
	s.state.Store(int32(TaskRunning))
	s.log.Info(fmt.Sprintf("task [%s] %s copy tailing changelog %s from offset %d (%d behind)", s.name, s.role(), tp, from, max(0, end-from)),
		zap.Int64("from", from), zap.Int64("end_offset", end))
	s.checkCaughtUp()

	var updates []state.Update
	for {
		qctx, cancel := context.WithTimeout(ctx, restoreQuiet)
		fetches := client.PollFetches(qctx)
		quiet := qctx.Err() != nil && fetches.NumRecords() == 0 && !hasFetchErrors(fetches)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if quiet {
			// Idle, or behind records the consumer never reports (an
			// aborted tail): ask the broker, so that the copy's position
			// reaches the stable end.
			if end := s.end.Load(); end > s.cp.ChangelogOffset {
				if vis, err := s.rt.visibleFrom(ctx, client, s.partition, s.cp.ChangelogOffset, end); err == nil && vis > s.cp.ChangelogOffset {
					cp := s.cp
					cp.ChangelogOffset = vis
					if err := s.store.Load().ApplyUnsynced(nil, cp); err != nil {
						return err
					}
					s.cp = cp
					s.position.Store(vis)
				}
			}
			s.checkCaughtUp()
			continue
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if errors.Is(ferr, kerr.OffsetOutOfRange) {
			// Compaction or retention moved the log start past us.
			s.log.Warn("Changelog start moved past the standby copy; wiping it and starting over", zap.String("changelog", tp))
			return errors.Join(ferr, s.wipe())
		}
		if ferr != nil {
			s.log.Warn("Fetching changelog for a standby copy", zap.String("changelog", tp), zap.Error(ferr))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		updates = updates[:0]
		next := s.cp.ChangelogOffset
		var n int64
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if p.LastStableOffset >= 0 {
				s.end.Store(p.LastStableOffset)
			}
			for _, r := range p.Records {
				next = r.Offset + 1
				if r.Attrs.IsControl() {
					continue
				}
				n++
				if u, ok := changelogUpdate(r, s.log, tp); ok {
					updates = append(updates, u)
				}
			}
		})
		if next > s.cp.ChangelogOffset {
			cp := s.cp
			cp.ChangelogOffset = next
			if err := s.store.Load().ApplyUnsynced(updates, cp); err != nil {
				return err
			}
			s.cp = cp
			s.position.Store(next)
			s.applied.Add(n)
		}
		s.checkCaughtUp()
	}
}

// checkCaughtUp asks for a rebalance once a warm-up is caught up by the rule
// the leader applies (assign.CaughtUp on its position and the stable end it
// last saw, the pair it then reports at the join), at most once per
// probing.rebalance.interval.ms: a leader that still does not move the task
// (it weighs other members too) is asked again only after that.
func (s *standby) checkCaughtUp() {
	if !s.isWarmup() {
		return
	}
	pos, end := s.position.Load(), s.end.Load()
	if !assign.CaughtUp(pos, end, s.rt.cfg.AcceptableRecoveryLag) {
		return
	}
	s.probeMu.Lock()
	if !s.probe.at.IsZero() && time.Since(s.probe.at) < s.rt.cfg.ProbingRebalanceInterval {
		s.probeMu.Unlock()
		return
	}
	prev := s.probe
	s.probe.at, s.probe.offset, s.probe.end = time.Now(), pos, end
	s.probeMu.Unlock()
	// Not inline: the caller may hold the runtime's lock. A probe the rate
	// limit refused is asked again by the probe loop.
	go func() {
		if !s.rt.probe(fmt.Sprintf("warm-up copy of task %s caught up (%d behind)", s.name, max(0, end-pos))) {
			s.probeMu.Lock()
			s.probe = prev
			s.probeMu.Unlock()
		}
	}()
}

// reported returns the offset and end this copy reports at a join: while a
// caught-up probe is recent, the pair it judged by, so that the leader
// decides on the same offsets; else its position and the end last seen.
func (s *standby) reported() (offset, end int64) {
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if !s.probe.at.IsZero() && time.Since(s.probe.at) < s.rt.cfg.ProbingRebalanceInterval && s.probe.offset >= 0 {
		return s.probe.offset, s.probe.end
	}
	return s.position.Load(), s.end.Load()
}

// wipe deletes the standby's store and opens an empty one.
func (s *standby) wipe() error {
	if st := s.store.Swap(nil); st != nil {
		_ = st.Close()
	}
	if err := s.rt.dir.Wipe(s.partition); err != nil {
		return err
	}
	st, err := state.Open(s.rt.dir.TaskPath(s.partition), s.log, s.rt.storeOptions())
	if err != nil {
		return err
	}
	s.store.Store(st)
	s.cp = state.Checkpoint{InputOffset: -1, ChangelogTopicID: s.rt.topo.changelogID}
	return nil
}

// reconcileStandbys makes the standbys running here those the latest
// assignment gives this member, minus the tasks active here: it stops the
// others (their stores stay on disk) and starts the missing ones. A
// standby of a task still stopping here starts once the task is done with
// the store. It is called after every assignment and revoke.
func (rt *Runtime) reconcileStandbys() {
	info := rt.balancer.assignment()
	want := info.standbys[rt.instanceID]
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.mu.stopping || rt.work == nil {
		return
	}
	for p, sb := range rt.mu.standbys {
		if _, ok := want[p]; ok && rt.mu.tasks[p] == nil {
			continue
		}
		if rt.mu.tasks[p] == nil && info.owners[p] == rt.instanceID {
			// The task comes here: its start takes the copy over
			// (takeStandbyLocked), which the revoke callback running
			// first must not stop.
			continue
		}
		delete(rt.mu.standbys, p)
		sb.stop()
	}
	ps := make([]int32, 0, len(want))
	for p := range want {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	for _, p := range ps {
		kind := want[p]
		if p < 0 || p >= rt.topo.partitions || rt.mu.tasks[p] != nil {
			continue
		}
		if sb := rt.mu.standbys[p]; sb != nil {
			if copyKind(sb.kind.Swap(uint32(kind))) != kind {
				sb.log.Info(fmt.Sprintf("task [%s] Copy is now a %s copy", sb.name, sb.role()))
			}
			sb.checkCaughtUp()
			continue
		}
		sb := newStandby(rt, p, kind, rt.mu.closing[p])
		rt.mu.standbys[p] = sb
		rt.wg.Add(1)
		go func() {
			defer rt.wg.Done()
			sb.run(rt.work)
		}()
	}
}

// takeStandbyLocked stops task p's standby, if one runs here, and returns
// the changelog offset its store reflects (-1: none ran) and the records it
// applied since it started. Called with rt.mu held, before the active task
// p starts.
func (rt *Runtime) takeStandbyLocked(p int32) (at, applied int64) {
	sb := rt.mu.standbys[p]
	if sb == nil {
		return -1, 0
	}
	delete(rt.mu.standbys, p)
	sb.stop()
	return sb.position.Load(), sb.applied.Load()
}

// stopStandbysLocked stops every standby. Called with rt.mu held.
func (rt *Runtime) stopStandbysLocked() {
	for p, sb := range rt.mu.standbys {
		delete(rt.mu.standbys, p)
		sb.stop()
	}
}

// noteLocal records the checkpoint a store of task p was closed with, for
// the offsets this member reports to the balancer.
func (rt *Runtime) noteLocal(p int32, cp state.Checkpoint) {
	rt.localMu.Lock()
	defer rt.localMu.Unlock()
	rt.local[p] = cp
}

// scanLocal reads the checkpoint of every store in the state dir (read
// only), for the offsets this member reports before it runs anything.
func (rt *Runtime) scanLocal() {
	ps, err := rt.dir.Tasks()
	if err != nil {
		rt.log.Warn("Listing the stores in the state dir", zap.Error(err))
		return
	}
	for _, p := range ps {
		st, err := state.Open(rt.dir.TaskPath(p), rt.log, state.OpenOptions{ReadOnly: true})
		if err != nil {
			continue // unreadable: it counts as no state; its task deals with it
		}
		cp, found, err := st.Checkpoint()
		_ = st.Close()
		if err == nil && found {
			rt.noteLocal(p, cp)
		}
	}
}

// storeOffsets are the checkpoints of this member's local stores, per task,
// as reported to the balancer: assign.Running for an active task that runs,
// the position of a standby or a restoring task, the checkpoint a store was
// last closed with otherwise. Stores of another changelog (recreated since)
// are left out.
func (rt *Runtime) storeOffsets() (map[int32]int64, map[int32]int64) {
	out, ends := map[int32]int64{}, map[int32]int64{}
	rt.localMu.Lock()
	for p, cp := range rt.local {
		if cp.ChangelogTopicID == rt.topo.changelogID && cp.ChangelogOffset >= 0 {
			out[p] = cp.ChangelogOffset
		}
	}
	rt.localMu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for p, sb := range rt.mu.standbys {
		if pos, end := sb.reported(); pos >= 0 {
			out[p] = pos
			if end >= 0 {
				ends[p] = end
			}
		}
	}
	for p, t := range rt.mu.tasks {
		switch st := t.State(); {
		case st == TaskRunning || st == TaskStalled:
			out[p] = assign.Running
		case t.stats.checkpoint.Load() >= 0:
			out[p] = t.stats.checkpoint.Load()
			delete(ends, p)
		}
	}
	return out, ends
}

// probe asks the group for a rebalance (this member rejoins), at most once
// per probeGap: a warm-up caught up, or the probing interval passed. It
// reports whether it asked.
func (rt *Runtime) probe(reason string) bool {
	cl := rt.groupClient.Load()
	if cl == nil {
		return false
	}
	rt.probeMu.Lock()
	if time.Since(rt.lastProbe) < probeGap {
		rt.probeMu.Unlock()
		return false
	}
	rt.lastProbe = time.Now()
	rt.probeMu.Unlock()
	rt.log.Info("Rejoining the group so that the balancer can move tasks to caught-up copies", zap.String("reason", reason))
	cl.ForceRebalance()
	return true
}

// probeGap is the least time between two rebalances this member asks for.
const probeGap = 5 * time.Second

// probeLoop asks for a probing rebalance every probing.rebalance.interval.ms
// while this member builds warm-ups, and every probeGap checks the warm-ups
// again: one that caught up while its changelog was idle, or whose report
// the rate limit refused, reports now.
func (rt *Runtime) probeLoop(ctx context.Context) {
	check := time.NewTicker(probeGap)
	defer check.Stop()
	next := time.Now().Add(rt.cfg.ProbingRebalanceInterval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
		}
		rt.mu.Lock()
		var warm []*standby
		for _, sb := range rt.mu.standbys {
			if sb.isWarmup() {
				warm = append(warm, sb)
			}
		}
		rt.mu.Unlock()
		if len(warm) == 0 {
			next = time.Now().Add(rt.cfg.ProbingRebalanceInterval)
			continue
		}
		for _, sb := range warm {
			sb.checkCaughtUp()
		}
		if time.Now().After(next) && rt.balancer.assignment().probe {
			// The leader said tasks wait for warm-ups (the assignment's
			// probe flag): rejoin so that it can move those caught up.
			next = time.Now().Add(rt.cfg.ProbingRebalanceInterval)
			names := make([]string, len(warm))
			for i, sb := range warm {
				names[i] = sb.name
			}
			sort.Strings(names)
			rt.probe(fmt.Sprintf("probing rebalance for warm-ups %v", names))
		}
	}
}

// standbyTotal returns product's total from the standby copy of task p
// here, when it runs and is within acceptable.recovery.lag; lag is how far
// behind it may be.
func (rt *Runtime) standbyTotal(p int32, product string) (total int64, ok bool, lag int64, err error) {
	rt.mu.Lock()
	sb := rt.mu.standbys[p]
	rt.mu.Unlock()
	if sb == nil {
		return 0, false, 0, ErrNotHosted
	}
	lag = sb.lag()
	st := sb.store.Load()
	if TaskState(sb.state.Load()) != TaskRunning || st == nil || lag < 0 {
		return 0, false, lag, fmt.Errorf("%w: the standby copy of task %s is not tailing yet", ErrNotReady, sb.name)
	}
	if lag > rt.cfg.AcceptableRecoveryLag {
		return 0, false, lag, fmt.Errorf("%w: the standby copy of task %s is %d records behind (acceptable.recovery.lag %d)", ErrNotReady, sb.name, lag, rt.cfg.AcceptableRecoveryLag)
	}
	e, ok, err := st.Get(product)
	return e.Total, ok, lag, err
}
