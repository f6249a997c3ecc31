package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/assign"
	"github.com/salesagg/salesagg/internal/changelog"
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

// standby is one copy: its goroutine, its store, its position. Its fields
// are set by newStandby; the atomics and probe are read by status queries
// and the balancer, the rest is the goroutine's.
type standby struct {
	deps      copyDeps
	partition int32
	name      string
	log       *zap.Logger
	// kind is what the copy is for (set by the reconciler): a copyKind.
	kind atomic.Uint32
	// probe is when this warm-up last asked for a rejoin because it caught
	// up, and the offsets it judged by (the pair it then reports at the
	// join, see storeOffsets); guarded by its mu.
	probe probeMark
	// after are the done channels of the store's previous users here
	// (this partition's active task or copies, stopping): the copy opens
	// the store once they are all closed.
	after []<-chan struct{}
	life  copyLife
	store atomic.Pointer[state.Store]
	// pos is where the copy is (see copyPosition).
	pos copyPosition
	cp  state.Checkpoint // owned by the goroutine
	// windows follow the task's window changelogs into the same store, one
	// per size (windowlog.go); their goroutines run while tail does.
	windows []*windowFollower
}

// copyDeps are what a copy is given by the session that starts it.
type copyDeps struct {
	env   *env
	topo  topology
	local *localStores
	// probe asks the group for a rebalance (a warm-up caught up); it
	// reports whether it asked.
	probe func(reason string) bool
	// spawn runs a function as one of the session's goroutines.
	spawn func(func())
}

// probeMark is a warm-up's last caught-up probe.
type probeMark struct {
	mu          sync.Mutex // guards at, offset and end
	at          time.Time  // guarded by mu
	offset, end int64      // guarded by mu
}

// copyLife is a copy's state and its stop request.
type copyLife struct {
	state    atomicCopyState
	quit     chan struct{}
	quitOnce sync.Once
	// done is closed when the copy's goroutine has ended (its store
	// closed).
	done chan struct{}
}

// copyPosition: position is the next changelog offset the store reflects
// (-1: not opened yet); end the changelog's last stable offset last seen
// (-1: unknown); applied the records applied since the copy started.
type copyPosition struct {
	position, end, applied atomic.Int64
}

func newStandby(deps copyDeps, p int32, kind copyKind, after []<-chan struct{}) *standby {
	s := &standby{deps: deps, partition: p, name: state.TaskName(p), after: after,
		life: copyLife{quit: make(chan struct{}), done: make(chan struct{})}}
	s.log = deps.env.log.With(zap.String("task", s.name), zap.Int32("partition", p), zap.String("role", "standby"))
	s.kind.Store(uint32(kind))
	s.pos.position.Store(-1)
	s.pos.end.Store(-1)
	for _, w := range windowAggs(deps.env, deps.topo) {
		s.windows = append(s.windows, newWindowFollower(w))
	}
	return s
}

// role names the copy in logs and status: "standby", "warmup" or
// "incoming".
func (s *standby) role() string { return copyKind(s.kind.Load()).String() }

func (s *standby) isWarmup() bool { return copyKind(s.kind.Load()) == kindWarmup }

// State returns the copy's state.
func (s *standby) State() copyState { return s.life.state.get() }

// setState moves the copy to st (see copyMoves), logging a move the table
// does not allow (and not making it).
func (s *standby) setState(st copyState) {
	if from, ok := s.life.state.move(st); !ok {
		s.log.Error(fmt.Sprintf("task [%s] Refusing the copy state change %s -> %s: not an allowed move (a bug)", s.name, from, st))
	}
}

// lag is how many changelog offsets the store is behind the last stable
// offset last seen (-1: unknown yet).
func (s *standby) lag() int64 {
	pos, end := s.pos.position.Load(), s.pos.end.Load()
	if pos < 0 || end < 0 {
		return -1
	}
	return max(0, end-pos)
}

// requestStop asks the copy to stop; it returns at once (done is closed
// once its store is).
func (s *standby) requestStop() { s.life.quitOnce.Do(func() { close(s.life.quit) }) }

// stop asks the copy to stop and waits until its store is closed. Never
// called with the registry's lock held.
func (s *standby) stop() {
	s.requestStop()
	<-s.life.done
}

// run tails the changelog until stopped. A failure is logged and retried
// after standbyRetry: a standby never stops the process.
func (s *standby) run(ctx context.Context) {
	defer close(s.life.done)
	for _, after := range s.after {
		select {
		case <-after:
		case <-s.life.quit:
			s.setState(copyClosed)
			return
		case <-ctx.Done():
			s.setState(copyClosed)
			return
		}
	}
	outer := ctx
	ctx, cancel := cancelOn(ctx, s.life.quit, nil)
	defer cancel()
	s.log.Info(fmt.Sprintf("task [%s] Starting %s copy", s.name, s.role()))
	for {
		err := s.tail(ctx)
		if hook := s.deps.env.knobs.beforeCopyClose; hook != nil && ctx.Err() != nil {
			hook(outer, s.partition)
		}
		if st := s.store.Swap(nil); st != nil {
			if cerr := st.Close(); cerr != nil {
				s.log.Warn("Closing standby store", zap.Error(cerr))
			} else if s.pos.position.Load() >= 0 {
				s.deps.local.note(s.partition, s.cp)
			}
		}
		if ctx.Err() != nil {
			s.setState(copyClosed)
			s.log.Info(fmt.Sprintf("task [%s] Closed %s copy at changelog offset %d", s.name, s.role(), s.pos.position.Load()),
				zap.Int64("checkpoint", s.pos.position.Load()), zap.Int64("applied", s.pos.applied.Load()))
			return
		}
		s.setState(copyRetrying)
		s.log.Warn(fmt.Sprintf("task [%s] Standby copy failed; starting over in %s", s.name, standbyRetry), zap.Error(err))
		select {
		case <-ctx.Done():
			s.setState(copyClosed)
			return
		case <-time.After(standbyRetry):
		}
	}
}

// tail opens the store, validates its checkpoint against the changelog and
// applies the changelog from there until ctx is done.
func (s *standby) tail(ctx context.Context) error {
	e := s.deps.env
	s.setState(copyOpening)
	st, err := e.openStore(s.partition, s.log)
	if err != nil {
		return err
	}
	s.store.Store(st)
	topic := e.cfg.ChangelogTopic()
	tp := fmt.Sprintf("%s-%d", topic, s.partition)
	logStart, end, err := changelog.Bounds(ctx, e.client, topic, s.partition, boundsRetryLog(s.log, tp))
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
	from, ok := checkCheckpoint(s.log, e.cfg.StoreName, s.name, tp, cp, found, logStart, end, e.changelogIdentity(ctx, s.deps.topo.changelogID))
	if !ok && found {
		if err := s.wipe(); err != nil {
			return err
		}
	}
	if ok {
		s.cp = cp
	} else {
		s.cp = state.Checkpoint{ChangelogOffset: logStart, InputOffset: -1, ChangelogTopicID: s.deps.topo.changelogID}
	}
	s.pos.position.Store(from)
	s.pos.end.Store(end)

	r, err := changelog.Open(changelog.Options{Client: e.kafkaOpts(), Topic: topic, TopicID: s.deps.topo.changelogID,
		Partition: s.partition, From: from, FetchBytes: standbyFetchBytes, Log: s.log})
	if err != nil {
		return err
	}
	defer r.Close()
	s.setState(copyTailing)
	s.log.Info(fmt.Sprintf("task [%s] %s copy tailing changelog %s from offset %d (%d behind)", s.name, s.role(), tp, from, max(0, end-from)),
		zap.Int64("from", from), zap.Int64("end_offset", end))
	s.checkCaughtUp()
	stopWindows := s.follow(ctx, s.store.Load())
	defer stopWindows()
	var updates []state.Update
	for {
		b, err := r.Next(ctx)
		if errors.Is(err, changelog.ErrOutOfRange) {
			// Compaction or retention moved the log start past us.
			s.log.Warn("Changelog start moved past the standby copy; wiping it and starting over", zap.String("changelog", tp))
			stopWindows()
			return errors.Join(err, s.wipe())
		}
		if err != nil {
			return err
		}
		if updates, err = s.apply(b, tp, updates[:0]); err != nil {
			return err
		}
		s.checkCaughtUp()
	}
}

// apply writes a batch of the changelog into the copy and moves its
// checkpoint and position past it. updates is scratch space, returned for
// reuse.
func (s *standby) apply(b changelog.Batch, tp string, updates []state.Update) ([]state.Update, error) {
	if b.StableEnd >= 0 {
		s.pos.end.Store(b.StableEnd)
	}
	for _, rec := range b.Records {
		u, err := changelog.Update(rec)
		if err != nil {
			changelog.LogUnreadable(s.log, tp, rec.Offset, err)
			continue
		}
		updates = append(updates, u)
	}
	if b.Next > s.cp.ChangelogOffset {
		cp := s.cp
		cp.ChangelogOffset = b.Next
		if err := s.store.Load().ApplyUnsynced(updates, cp); err != nil {
			return updates, err
		}
		s.cp = cp
		s.pos.position.Store(b.Next)
		s.pos.applied.Add(int64(len(b.Records)))
	}
	return updates, nil
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
	pos, end := s.position()
	cfg := s.deps.env.cfg
	if !assign.CaughtUp(pos, end, cfg.AcceptableRecoveryLag) {
		return
	}
	s.probe.mu.Lock()
	if !s.probe.at.IsZero() && time.Since(s.probe.at) < cfg.ProbingRebalanceInterval {
		s.probe.mu.Unlock()
		return
	}
	prevAt, prevOffset, prevEnd := s.probe.at, s.probe.offset, s.probe.end
	s.probe.at, s.probe.offset, s.probe.end = time.Now(), pos, end
	s.probe.mu.Unlock()
	// Not inline: the caller may hold the registry's lock. A probe the rate
	// limit refused is asked again by the probe loop.
	s.deps.spawn(func() {
		if !s.deps.probe(fmt.Sprintf("warm-up copy of task %s caught up (%d behind)", s.name, max(0, end-pos))) {
			s.probe.mu.Lock()
			s.probe.at, s.probe.offset, s.probe.end = prevAt, prevOffset, prevEnd
			s.probe.mu.Unlock()
		}
	})
}

// reported returns the offset and end this copy reports at a join: while a
// caught-up probe is recent, the pair it judged by, so that the leader
// decides on the same offsets; else its position and the end last seen.
func (s *standby) reported() (offset, end int64) {
	s.probe.mu.Lock()
	defer s.probe.mu.Unlock()
	if !s.probe.at.IsZero() && time.Since(s.probe.at) < s.deps.env.cfg.ProbingRebalanceInterval && s.probe.offset >= 0 {
		return s.probe.offset, s.probe.end
	}
	return s.position()
}

// position is the copy's position in its totals' changelog and the end it
// measured it against, plus what its windows lack (each size's lag; one
// not known yet counts as acceptable.recovery.lag + 1): the balancer,
// which takes end - offset for the lag, weighs a task's whole restore,
// not its totals' alone.
func (s *standby) position() (offset, end int64) {
	pos, end := s.pos.position.Load(), s.pos.end.Load()
	if pos < 0 || end < 0 {
		return pos, end
	}
	for _, f := range s.windows {
		if lag := f.lag(); lag >= 0 {
			end += lag
		} else {
			end += s.deps.env.cfg.AcceptableRecoveryLag + 1
		}
	}
	return pos, end
}

// wipe deletes the standby's store and opens an empty one. From its start
// the copy reports no position (nor its last probe's, nor the checkpoint
// its store was closed with): until it tails again, after standbyRetry
// when the wipe follows a failure, a rebalance must not take the store for
// caught up.
func (s *standby) wipe() error {
	e := s.deps.env
	if st := s.store.Swap(nil); st != nil {
		_ = st.Close()
	}
	s.pos.position.Store(-1)
	s.probe.mu.Lock()
	s.probe.at, s.probe.offset, s.probe.end = time.Time{}, -1, -1
	s.probe.mu.Unlock()
	s.deps.local.forget(s.partition)
	if err := e.dir.Wipe(s.partition); err != nil {
		return err
	}
	st, err := state.Open(e.dir.TaskPath(s.partition), s.log, e.storeOptions())
	if err != nil {
		return err
	}
	s.store.Store(st)
	s.cp = state.Checkpoint{InputOffset: -1, ChangelogTopicID: s.deps.topo.changelogID}
	return nil
}
