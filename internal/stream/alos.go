package stream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// At-least-once (processing.guarantee=at_least_once)
//
// Each task runs its own commit cycle every commit interval: it produces its
// changed totals (with the input offsets they reflect) and its other
// records, waits for them to be acknowledged, writes its store with the
// checkpoint, and only then reports the input offsets it processed; the
// committer commits them. A crash anywhere in between loses nothing: the
// input is read again from the last commit and every event already in a
// total is recognised by its offset and skipped. The poll loop blocks
// rebalances while it dispatches (BlockRebalanceOnPoll), so a revoke runs
// between polls: the revoked tasks flush and commit what they processed
// before letting go.

// atLeastOnce is the at-least-once guarantee of a session.
type atLeastOnce struct {
	s         *session
	committer committer
	// rewinds are the tasks waiting for the poll loop to move their
	// position back (see task.rewind). kick (buffered 1) cuts the poll
	// short for them.
	rewinds struct {
		mu   sync.Mutex              // guards todo and fromCommitted
		todo map[int32]rewindRequest // guarded by mu
		// fromCommitted are the partitions of replaced tasks, to move
		// back to the group's committed offsets. Guarded by mu.
		fromCommitted map[int32]bool
		kick          chan struct{}
	}
	// stopCommits ends the commit loop (set by poll, before the loop).
	commitsDone chan struct{}
	stopCommits context.CancelFunc
}

func newAtLeastOnce(s *session) *atLeastOnce {
	a := &atLeastOnce{s: s}
	a.rewinds.kick = make(chan struct{}, 1)
	a.committer.kick = make(chan struct{}, 1)
	a.committer.onDone = func() { s.env.crashPoint("offsets-committed") }
	a.committer.held = func(topic string, p int32) bool { return s.reg.holds(p, s.heldBit(topic)) }
	a.committer.send = func(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error {
		return s.proto.commit(ctx, offsets)
	}
	return a
}

func (a *atLeastOnce) client(opts []kgo.Opt) (*kgo.Client, error) {
	// A revoke runs between polls: the revoked tasks flush and commit what
	// they processed before letting go.
	return kgo.NewClient(append(opts, kgo.BlockRebalanceOnPoll())...)
}

func (a *atLeastOnce) taskDeps(d *taskDeps) {
	d.committer = &a.committer
	d.member = a.checkMembership
	d.rewind = a.requestRewind
	d.gate = func(now time.Time) context.Context { return a.s.lease.produceGate(now) }
}

// poll is the loop that owns the group client: it fetches and hands each
// partition's records to its task, until ctx is done; the committer commits
// what the tasks report meanwhile.
func (a *atLeastOnce) poll(ctx, _ context.Context) error {
	s := a.s
	commitCtx, stop := context.WithCancel(context.Background())
	a.stopCommits, a.commitsDone = stop, make(chan struct{})
	s.goroutine(func() {
		defer close(a.commitsDone)
		a.commitLoop(commitCtx)
	})
	for {
		// A task asking for a rewind cuts the poll short: its partitions
		// are paused, so the poll may otherwise wait for other records.
		pctx, pcancel := cancelOn(ctx, a.rewinds.kick, nil)
		fetches := s.kc().PollRecords(pctx, 10_000)
		pcancel()
		if s.env.knobs.AfterPoll != nil {
			s.env.knobs.AfterPoll(fetches.NumRecords())
		}
		if ctx.Err() != nil || fetches.IsClientClosed() {
			// Records polled now are not committed (at-least-once commits
			// only what tasks report): the next owner reads them again.
			s.kc().AllowRebalance()
			return nil
		}
		s.between.Lock()
		if _, unread := s.dispatch(ctx, fetches, a.applyRewinds()); len(unread) > 0 {
			// Polled past the lease's deadline: read again, whether the
			// tasks go on here (the lease held again) or are dropped and
			// rewound to the committed offsets (it lapsed).
			s.kc().SetOffsets(unread)
		}
		s.between.Unlock()
		s.kc().AllowRebalance()
	}
}

func (a *atLeastOnce) revoked(ctx context.Context, cl *kgo.Client, ps []int32) {
	if err := a.s.stopTasks(ps, true, "revoked; flushed and committed"); err != nil {
		a.s.env.log.Error("Stopping revoked tasks", zap.Error(err))
	}
	// The partitions are let go only once their last offsets are committed
	// (the committer commits only what this member holds).
	if err := a.committer.commit(ctx); err != nil {
		a.s.env.log.Error("Committing offsets of revoked partitions", zap.Error(err))
	}
}

// replaced asks the poll loop to move the partitions of tasks started in
// place of dropped ones back to the group's committed offsets: the dropped
// tasks' uncommitted work is gone, and the client would otherwise go on
// from past it (a loss; seen when a second rebalance re-added partitions
// this member held).
func (a *atLeastOnce) replaced(ps []int32) {
	a.rewinds.mu.Lock()
	defer a.rewinds.mu.Unlock()
	if a.rewinds.fromCommitted == nil {
		a.rewinds.fromCommitted = map[int32]bool{}
	}
	for _, p := range ps {
		a.rewinds.fromCommitted[p] = true
	}
	select {
	case a.rewinds.kick <- struct{}{}:
	default:
	}
}

func (a *atLeastOnce) dropped(ps []int32) {
	a.committer.forget(a.s.env.cfg.InputTopic, ps)
	a.committer.forget(a.s.env.cfg.RepartitionTopic(), ps)
}

// stop stops every task with a flush, then commits what they reported.
func (a *atLeastOnce) stop(work context.Context, _ error) error {
	stopErr := a.s.stopTasks(a.s.reg.partitions(), true, "flushed and committed")
	if a.stopCommits != nil {
		a.stopCommits()
		<-a.commitsDone
	}
	return errors.Join(stopErr, a.committer.commit(work))
}

func (a *atLeastOnce) close() {
	a.s.kc().Close()
	a.committer.forgetAll()
}

// checkMembership asks the group coordinator whether this member is still
// in the generation it knows (a Heartbeat with its member id, generation and
// instance id). At-least-once, a task checks it before writing its
// changelog: a member that was paused past its session timeout (a zombie)
// learns it lost its tasks before it writes over their new owner. A
// rebalance in progress is fine: a cooperative member keeps its tasks until
// it revokes them, and nobody else gets them before.
func (a *atLeastOnce) checkMembership(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	gen, _, err := a.s.proto.heartbeat(cctx)
	switch {
	case err == nil, errors.Is(err, kerr.RebalanceInProgress):
		return nil
	case errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.FencedInstanceID),
		errors.Is(err, kerr.FencedMemberEpoch):
		return fmt.Errorf("%w (generation %d): %w", errNotMember, gen, err)
	}
	return fmt.Errorf("checking group membership (generation %d): %w", gen, err)
}

// errNotMember: the group coordinator says this member is not in the
// generation it knows (it was expired, fenced or replaced); its tasks are
// someone else's now.
var errNotMember = errors.New("stream: not a member of the group's generation")

// rewindRequest is a task's rewind request: the offsets it folds again from,
// per topic (input, repartition; see task.rewindTo), read when it asked.
type rewindRequest struct {
	t  *task
	to [2]int64
}

// requestRewind asks the poll loop to move task t's partitions back to the
// offsets t folds again from (see task.rewind).
func (a *atLeastOnce) requestRewind(t *task) {
	a.rewinds.mu.Lock()
	defer a.rewinds.mu.Unlock()
	if a.rewinds.todo == nil {
		a.rewinds.todo = map[int32]rewindRequest{}
	}
	// The offsets are read here, on the task goroutine that calls
	// requestRewind: the task's next flush (its ticker) writes
	// t.in.reported while the poll loop has not applied the rewind yet.
	a.rewinds.todo[t.partition] = rewindRequest{t: t, to: t.rewindTo()}
	select {
	case a.rewinds.kick <- struct{}{}:
	default:
	}
}

// applyRewinds moves the positions of the tasks that asked for it, between
// two polls (the poll loop owns the client; at-least-once a revoke cannot
// run meanwhile), and returns their partitions: what the last poll returned
// for them is from before the rewind and is not dispatched.
func (a *atLeastOnce) applyRewinds() map[int32]bool {
	a.rewinds.mu.Lock()
	todo, fromCommitted := a.rewinds.todo, a.rewinds.fromCommitted
	a.rewinds.todo, a.rewinds.fromCommitted = nil, nil
	a.rewinds.mu.Unlock()
	if len(todo) == 0 && len(fromCommitted) == 0 {
		return nil
	}
	skip := map[int32]bool{}
	set := map[string]map[int32]kgo.EpochOffset{}
	if len(fromCommitted) > 0 {
		a.rewindToCommitted(fromCommitted, set, skip)
	}
	for p, rw := range todo {
		t, to := rw.t, rw.to
		if !a.s.reg.isCurrent(t) {
			continue // stopped meanwhile: its next owner starts from the commits
		}
		setPositions(set, []string{a.s.env.cfg.InputTopic, a.s.env.cfg.RepartitionTopic()}, p, to)
		skip[p] = true
		t.log.Info(fmt.Sprintf("task [%s] Rewinding to the last committed offsets", t.name),
			zap.Int64("input_offset", to[0]), zap.Int64("repartition_offset", to[1]))
	}
	a.s.kc().SetOffsets(set)
	for p, rw := range todo {
		if skip[p] {
			rw.t.retry.rewindEpoch.Add(1)
		}
	}
	return skip
}

// commitLoop commits the offsets tasks report, as soon as they report them
// (several reports arriving together are one commit).
func (a *atLeastOnce) commitLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.committer.kick:
			if err := a.committer.commit(ctx); err != nil && ctx.Err() == nil {
				a.s.env.log.Warn("Committing offsets", zap.Error(err))
			}
		}
	}
}

// committer holds the offsets tasks made safe to commit (their changelog is
// acknowledged and their store written) until they are committed.
type committer struct {
	sendMu  sync.Mutex                           // held across a commit
	mu      sync.Mutex                           // guards pending, gen and forgot
	pending map[string]map[int32]kgo.EpochOffset // guarded by mu
	// gen counts forgets; forgot is the gen at which each partition was
	// last forgotten (its task stopped or was lost), so that a commit that
	// failed does not put back offsets of a partition forgotten meanwhile.
	gen    uint64                      // guarded by mu
	forgot map[string]map[int32]uint64 // guarded by mu
	onDone func()
	kick   chan struct{} // signalled by report; buffered 1
	// held, if set, tells whether this member holds a partition now: only
	// those are committed.
	held func(topic string, partition int32) bool
	// send commits offsets in the member's name (the group protocol's).
	send func(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error
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

// forgottenSince reports whether topic/p was forgotten after gen; c.mu is
// held.
func (c *committer) forgottenSince(topic string, p int32, gen uint64) bool {
	return c.forgot[topic][p] > gen || c.forgot[""][-1] > gen
}

// commit commits the pending offsets synchronously, those of partitions
// this member holds. Offsets that fail to commit are kept for the next try,
// unless newer ones arrived or the partition was forgotten meanwhile.
func (c *committer) commit(ctx context.Context) error {
	// One commit at a time: a commit that finds nothing pending (a
	// revoke's) returns only after the one in flight, so that a task is
	// let go only once its last offsets are committed.
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
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
	commitErr := c.send(ctx, todo)
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

// rewindToCommitted adds to set the group's committed offsets (or, where
// none is, the start or end as auto.offset.reset says) of the input and
// repartition partitions of ps, and marks them in skip: what the last poll
// returned for them is from the old position. When the offsets cannot be
// read, ps are asked for again at the next poll and stay skipped
// meanwhile, so that no new task folds from past the committed offsets.
func (a *atLeastOnce) rewindToCommitted(ps map[int32]bool, set map[string]map[int32]kgo.EpochOffset, skip map[int32]bool) {
	e := a.s.env
	topics := []string{e.cfg.InputTopic, e.cfg.RepartitionTopic()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	committed, err := e.admin.FetchOffsets(ctx, e.cfg.ApplicationID)
	if err == nil {
		err = committed.Error()
	}
	var fallback kadm.ListedOffsets
	if err == nil {
		if e.cfg.AutoOffsetReset == "latest" {
			fallback, err = e.admin.ListEndOffsets(ctx, topics...)
		} else {
			fallback, err = e.admin.ListStartOffsets(ctx, topics...)
		}
	}
	if err != nil {
		e.log.Warn("Reading the committed offsets to rewind replaced tasks to; retrying at the next poll", zap.Error(err))
		for p := range ps {
			skip[p] = true
		}
		a.rewinds.mu.Lock()
		if a.rewinds.fromCommitted == nil {
			a.rewinds.fromCommitted = map[int32]bool{}
		}
		maps.Copy(a.rewinds.fromCommitted, ps)
		a.rewinds.mu.Unlock()
		return
	}
	for p := range ps {
		t := a.s.reg.task(p)
		if t == nil {
			continue // gone meanwhile: its next owner starts from the commits
		}
		var to [2]int64
		for i, topic := range topics {
			to[i] = -1
			if o, ok := committed.Lookup(topic, p); ok && o.At >= 0 {
				to[i] = o.At
			} else if o, ok := fallback.Lookup(topic, p); ok {
				to[i] = o.Offset
			}
		}
		setPositions(set, topics, p, to)
		skip[p] = true
		t.retry.rewindEpoch.Add(1)
		t.log.Info(fmt.Sprintf("task [%s] Replaced: folding again from the committed offsets", t.name),
			zap.Int64("input_offset", to[0]), zap.Int64("repartition_offset", to[1]))
	}
}

// setPositions adds partition p's position in each of topics (the input and
// the repartition topic) to set, for kgo's SetOffsets; a negative position
// (nothing to move to) is left out.
func setPositions(set map[string]map[int32]kgo.EpochOffset, topics []string, p int32, to [2]int64) {
	for i, topic := range topics {
		if to[i] < 0 {
			continue
		}
		if set[topic] == nil {
			set[topic] = map[int32]kgo.EpochOffset{}
		}
		set[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: to[i]}
	}
}

// flush runs the at-least-once commit cycle described in the package
// documentation.
func (t *task) flush(ctx context.Context) error {
	if t.changed() > 0 {
		// A member that lost the task (paused past its session timeout, a
		// zombie) must not write what its new owner writes: check with the
		// group coordinator first, at most once a second while it does not
		// confirm. Until it does, nothing of the cycle is written: the
		// changes are kept for the next try (if the task was lost,
		// franz-go's loss stops it and drops them meanwhile; if the
		// generation only moved on, as in a cooperative rebalance that
		// keeps the task here, they are flushed then, and nothing is lost),
		// and past maxDirty the task pauses its partitions so that they stay
		// bounded. The refusal shows in the task's status.
		if !t.retry.memberUnknownAt.IsZero() && time.Since(t.retry.memberUnknownAt) < time.Second {
			return nil
		}
		if err := t.deps.member(ctx); err != nil {
			t.retry.memberUnknownAt = time.Now()
			t.retry.memberRefused = true
			t.trouble.fail(err)
			msg := fmt.Sprintf("task [%s] Not flushing: the group coordinator did not confirm this member owns the task; nothing of the cycle is written, retrying", t.name)
			if errors.Is(err, errNotMember) {
				msg = fmt.Sprintf("task [%s] Not flushing: the group coordinator says this member is not in its generation; nothing of the cycle is written, retrying", t.name)
			}
			if ok, suppressed := t.retry.memberLog.allow(time.Now()); ok {
				t.log.Warn(msg, zap.Int("products", len(t.totals.dirty)), zap.Int("records", len(t.out.outbox)), zap.Int64("suppressed", suppressed), zap.Error(err))
			}
			if !t.retry.memberPaused && t.changed() >= t.dirtyBound() {
				t.retry.memberPaused = true
				t.deps.client.PauseFetchPartitions(t.deps.env.topicsOf([]int32{t.partition}))
			}
			return nil
		}
		t.retry.memberUnknownAt = time.Time{}
		if t.retry.memberRefused {
			t.retry.memberRefused = false
			t.trouble.clear()
		}
	}
	if t.retry.memberPaused {
		t.retry.memberPaused = false
		if t.retry.resumeAt.IsZero() {
			t.deps.client.ResumeFetchPartitions(t.deps.env.topicsOf([]int32{t.partition}))
		}
	}
	began := time.Now()
	t.deps.env.crashPoint("flush-start")
	updates, maxOffset, err := t.produceDirty(ctx)
	if err != nil {
		t.out.pending.Wait()
		return fmt.Errorf("flushing task %s: %w", t.name, err)
	}
	t.deps.env.crashPoint("changelog-produced")
	if k := t.deps.env.knobs.FlushProduced; k != nil {
		k(t.partition, t.out.cycleRecords)
	}
	t.out.pending.Wait()
	if err := ctx.Err(); err != nil {
		// Past the shutdown grace period: what was produced may be partial;
		// the store and offsets stay behind, and the next start restores the
		// changelog tail and skips what it already reflects.
		return fmt.Errorf("flushing task %s: %w", t.name, err)
	}
	if errp := t.out.produceErr.Swap(nil); errp != nil {
		// Nothing of this cycle is written to the store or committed: fold
		// it again from the last committed offsets, after a backoff.
		t.log.Warn(fmt.Sprintf("task [%s] A record of the commit cycle failed to produce; nothing of the cycle is committed", t.name), zap.Error(*errp))
		t.rewind(*errp, "folding its input again from the last committed offsets")
		return nil
	}
	t.deps.env.crashPoint("changelog-flushed")
	b := stalledBatch{updates: updates, maxOffset: maxOffset.Load(), inputNext: t.in.inputNext, repartNext: t.in.repartNext, report: true}
	if err := t.apply(updates, b.maxOffset, b.inputNext); err != nil {
		// The input offsets are not reported: nothing is committed past
		// what the store holds.
		return t.stallOn(b, err)
	}
	t.deps.env.crashPoint("store-written")
	t.reportOffsets(b)
	t.produced()
	if len(updates) > 0 {
		t.deps.env.metrics.commitSeconds.Observe(time.Since(began).Seconds())
	}
	return nil
}

// rewind (at-least-once) makes the task fold its input again from the
// offsets it last reported for commit (or the first it read), after a cycle
// whose records failed to produce: the cycle's changes are dropped
// (the store never had them), the batches dispatched before the poll loop
// moves the partitions' position back (applyRewinds) are dropped wherever
// they are folded (see current), and the task pauses for a backoff.
func (t *task) rewind(err error, next string) {
	t.dropDirty()
	t.in.inputNext, t.in.repartNext = t.totals.cp.InputOffset, -1
	t.retry.wantEpoch = t.retry.rewindEpoch.Load() + 1
	t.cycleFailed(err, next)
	t.deps.rewind(t)
}

// rewindTo returns the offsets to fold again from, per topic (input,
// repartition; -1: none read).
func (t *task) rewindTo() [2]int64 {
	out := t.in.first
	for i, r := range t.in.reported {
		if r >= 0 {
			out[i] = r
		}
	}
	return out
}
