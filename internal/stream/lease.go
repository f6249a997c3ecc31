package stream

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// This member's hold on its tasks: the time until which the group
// coordinator cannot have given them to another member, kept from the
// coordinator's own answers and never from the group client's view alone.
//
// The classic protocol's coordinator expires a member session.timeout.ms
// after the last heartbeat (or join) it received, and completes a
// rebalance without a member that has not rejoined within the rebalance
// timeout. A member cut off from the coordinator (the coordinator's broker
// paused or unreachable, the coordinator moved to a broker this member
// does not reach) learns of either only when a request comes back, which
// can be long after another member was given its tasks: both would then
// run them. So the session probes the coordinator with a heartbeat of its
// own every heartbeat interval and keeps a deadline:
//
//   - a heartbeat answered without error, sent at T: the coordinator
//     held the session, stable, at some time after T: nobody can be given
//     this member's tasks before T + session.timeout.ms;
//   - REBALANCE_IN_PROGRESS, sent at T: the session holds until
//     T + session.timeout.ms, but the rebalance may complete without this
//     member once the rebalance timeout has passed since it began, which
//     is after the last stable answer;
//   - an assignment (SyncGroup): the join this member just took part in
//     completed before its response came, and reset every member's
//     session; the response's arrival stands for that time;
//   - any other answer, or none: the deadline stays.
//
// The deadline is kept a margin short of those bounds (the tasks take a
// moment to stop). When it passes while tasks are held, the lease lapses:
// every task is dropped without committing, exactly as when the group
// session is lost, and the member rejoins; the next assignment restarts
// the tasks from their checkpoints, the input read again from what is
// committed.

// leaseState is where the lease is in its lifecycle.
type leaseState int

const (
	// leaseIdle: no assignment held (before the first, after a loss).
	leaseIdle leaseState = iota
	// leaseHeld: an assignment is held until the deadline.
	leaseHeld
	// leaseLapsed: the deadline passed; the tasks were dropped and the
	// member waits for its next assignment.
	leaseLapsed
)

func (s leaseState) String() string {
	switch s {
	case leaseIdle:
		return "idle"
	case leaseHeld:
		return "held"
	case leaseLapsed:
		return "lapsed"
	}
	return fmt.Sprintf("leaseState(%d)", int(s))
}

// leaseMoves are the lease's allowed moves.
var leaseMoves = map[leaseState][]leaseState{
	leaseIdle:   {leaseHeld},
	leaseHeld:   {leaseHeld, leaseLapsed, leaseIdle},
	leaseLapsed: {leaseHeld, leaseIdle},
}

// lease is one group session's lease. Its fields are guarded by mu, but
// for rebalanceTimeout and lapseDelay, set when it is made.
type lease struct {
	rebalanceTimeout time.Duration
	// lapseDelay is how long past its deadline expire lapses the lease
	// (0 but in tests: see Knobs.LeaseLapseDelay).
	lapseDelay time.Duration

	mu sync.Mutex
	// sessionTimeout is the group's session timeout the lease runs by,
	// and margin how long before it the lease lapses.
	sessionTimeout, margin time.Duration
	state                  leaseState
	// alive is the latest time the coordinator is known to have held this
	// member's session, stable is the latest at which it also was not
	// rebalancing; joined is when the latest JoinGroup response arrived.
	alive, stable, joined time.Time
	// until is the deadline while held; lapsedAt when it lapsed; heldAt
	// when the latest assignment held it again (its deadline can already
	// be past then: a SyncGroup answered long after its join).
	until, lapsedAt, heldAt time.Time
	// lapsed are the tasks dropped when the lease lapsed: when they run
	// again here, the input is read again from what is committed.
	lapsed map[int32]bool
	// gate is the produce gate of the current hold (see produceGate): made
	// when asked for while the lease holds and the last one is closed,
	// closed when the lease lapses or is lost, or found past its deadline.
	gate *produceGate
}

// newLease returns an idle lease for a session timeout and a rebalance
// timeout. The margin is an eighth of the session timeout, within
// [250 ms, 3 s].
func newLease(sessionTimeout, rebalanceTimeout time.Duration) *lease {
	l := &lease{rebalanceTimeout: rebalanceTimeout}
	l.setSessionTimeout(sessionTimeout)
	return l
}

// setSessionTimeout makes the lease run by the group's session timeout d
// (the streams protocol's is the group's configuration, which the member
// reads after the lease is made).
func (l *lease) setSessionTimeout(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sessionTimeout, l.margin = d, min(max(d/8, 250*time.Millisecond), 3*time.Second)
}

// move changes the state, refusing a move leaseMoves does not allow.
// Called with mu held.
func (l *lease) move(to leaseState) bool {
	for _, ok := range leaseMoves[l.state] {
		if ok == to {
			l.state = to
			return true
		}
	}
	return false
}

// joinAnswered records that a JoinGroup response arrived at at.
func (l *lease) joinAnswered(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if at.After(l.joined) {
		l.joined = at
	}
}

// assigned records an assignment received at now: the lease is held again
// from the join that led to it, and it returns the tasks dropped by the
// last lapse (their input is to be read again from what is committed);
// the caller restarts the ones it holds.
func (l *lease) assigned(now time.Time) (lapsed map[int32]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := now
	if !l.joined.IsZero() && !l.joined.After(now) {
		from = l.joined
	}
	if l.state != leaseHeld || from.After(l.alive) {
		l.alive = from
	}
	if from.After(l.stable) {
		l.stable = from
	}
	l.move(leaseHeld)
	l.heldAt = now
	l.until = l.alive.Add(l.sessionTimeout - l.margin)
	lapsed, l.lapsed = l.lapsed, nil
	return lapsed
}

// answered records the coordinator's answer to a heartbeat sent at sent:
// err is the request's error or the response's error code.
func (l *lease) answered(sent time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != leaseHeld {
		return
	}
	switch {
	case err == nil:
		if sent.After(l.alive) {
			l.alive = sent
		}
		if sent.After(l.stable) {
			l.stable = sent
		}
		if until := l.alive.Add(l.sessionTimeout - l.margin); until.After(l.until) {
			l.until = until
		}
	case errors.Is(err, kerr.RebalanceInProgress):
		if sent.After(l.alive) {
			l.alive = sent
		}
		until := l.alive.Add(l.sessionTimeout)
		if bound := l.stable.Add(l.rebalanceTimeout); bound.Before(until) {
			until = bound
		}
		if until = until.Add(-l.margin); until.After(l.until) {
			l.until = until
		}
	}
}

// expire lapses the lease when it is held and its deadline has passed at
// now; it reports whether it did, and for how long the coordinator has not
// been heard from. held are the tasks it drops, kept to be read again.
func (l *lease) expire(now time.Time, held []int32) (silent time.Duration, lapsed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != leaseHeld || now.Before(l.until.Add(l.lapseDelay)) {
		return 0, false
	}
	l.move(leaseLapsed)
	l.gate.close()
	l.lapsedAt = now
	if l.lapsed == nil {
		l.lapsed = map[int32]bool{}
	}
	for _, p := range held {
		l.lapsed[p] = true
	}
	return now.Sub(l.alive), true
}

// overdue reports whether any task still here is past the lease: held
// past its deadline at now (the coordinator may have given them away, and
// the lease loop is about to drop them), lapsed (the lease loop is
// dropping them), or lost (the session ended or the coordinator fenced
// this member: they are being dropped, and may already run elsewhere).
// Their goroutines end when their stop is through; nothing is handed to
// them meanwhile, and they are not reported running. An assignment holds
// the lease again before it starts any task, so no task runs on an idle
// lease but one being dropped.
func (l *lease) overdue(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state != leaseHeld || !now.Before(l.until)
}

// lost records that the group session was lost (every task dropped, the
// client rejoins from scratch): nothing is held.
func (l *lease) lost() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.move(leaseIdle)
	l.gate.close()
}

// snapshot returns the state, the deadline and when it lapsed.
func (l *lease) snapshot() (st leaseState, until, lapsedAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, l.until, l.lapsedAt
}

// lateBy is how long after its deadline the latest lapse was seen, counted
// from the assignment that held the lease when that came after the
// deadline: the time the lease loop took to notice.
func (l *lease) lateBy() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := l.until
	if l.heldAt.After(from) {
		from = l.heldAt
	}
	return max(0, l.lapsedAt.Sub(from))
}

// timeout returns the session timeout the lease runs by.
func (l *lease) timeout() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessionTimeout
}

// lapseReason says why the process is not ready while the lease is lapsed,
// "" otherwise.
func (l *lease) lapseReason() string {
	st, _, at := l.snapshot()
	if st != leaseLapsed {
		return ""
	}
	return fmt.Sprintf("the group coordinator answered no heartbeat within session.timeout.ms (%s); tasks dropped at %s, waiting to rejoin the group",
		l.timeout(), at.UTC().Format("2006-01-02 15:04:05Z"))
}

// At-least-once has no fencing (see cutoff.go): a record the client writes
// to a broker is appended whenever it arrives. A task checks its membership
// before it produces (checkMembership), and the lease drops its tasks
// before the coordinator can give them away, cutting them off (every
// record the client holds fails); but between the two, records wait in the
// client's buffer, behind a request in flight to a slow or paused leader,
// for as long as that takes. A process paused then (SIGSTOP, a frozen VM,
// a long GC stop) and resumed after the group gave its tasks to another
// member would, on resuming, send them at once: franz-go's goroutines run
// before the lease loop sees that the deadline passed. They would land
// after the new owner restored the changelog, and a product's total would
// go down for a reader of it (seen in a 30-minute torture run, seed 9:
// changelog records of a member paused 12 s, landing 4 s after the next
// owner's restore).
//
// So every record a task produces at-least-once carries the produce gate
// of the lease's current hold as its context (kgo.Record.Context), and
// franz-go fails a batch whose first record's context is done before it
// writes it to a broker. The gate is done once the lease has passed its
// deadline, lapsed or was lost: its Done checks the deadline itself each
// time it is called, so a resumed process fails what its client holds
// before any of its own goroutines noticed the time. What a broker already
// has (written before the deadline) arrives within the lease's margin.

// errLeasePassed fails a record whose produce gate closed before franz-go
// wrote it.
var errLeasePassed = errors.New("stream: the group lease passed before the record was sent; nothing more of this hold is produced")

// produceGate is a context.Context done once the lease hold it was taken
// from is over (see above). Its channel is closed by the lease when it
// lapses or is lost, or by Done when it finds the deadline passed.
type produceGate struct {
	l    *lease
	done chan struct{}
	once sync.Once
}

var _ context.Context = (*produceGate)(nil)

// produceGate returns the produce gate of the current hold: a new one when
// the last was closed (the lease lapsed, or passed its deadline and was
// extended by a late answer: what was buffered across it fails, what is
// produced now may go), one already closed when the lease does not hold at
// now.
func (l *lease) produceGate(now time.Time) *produceGate {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.holdsAt(now) {
		g := &produceGate{l: l, done: make(chan struct{})}
		g.close()
		return g
	}
	if l.gate == nil || l.gate.closed() {
		l.gate = &produceGate{l: l, done: make(chan struct{})}
	}
	return l.gate
}

// holdsAt tells whether the lease holds at now; l.mu is held.
func (l *lease) holdsAt(now time.Time) bool { return l.state == leaseHeld && now.Before(l.until) }

// closed tells whether g is closed.
func (g *produceGate) closed() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

// close closes the gate; a nil gate is fine.
func (g *produceGate) close() {
	if g != nil {
		g.once.Do(func() { close(g.done) })
	}
}

// over tells whether g's hold is over at now.
func (l *lease) over(g *produceGate, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gate != g || !l.holdsAt(now)
}

func (g *produceGate) Done() <-chan struct{} {
	if !g.closed() && g.l.over(g, time.Now()) {
		g.close()
	}
	return g.done
}

func (g *produceGate) Err() error {
	select {
	case <-g.Done():
		return errLeasePassed
	default:
		return nil
	}
}

// Deadline: none fixed, the lease's deadline moves with each answer.
func (g *produceGate) Deadline() (time.Time, bool) { return time.Time{}, false }

func (g *produceGate) Value(any) any { return nil }

// leaseHook feeds the lease the arrival of JoinGroup responses.
type leaseHook struct{ l *lease }

var _ kgo.HookBrokerE2E = leaseHook{}

func (h leaseHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key == (*kmsg.JoinGroupRequest)(nil).Key() && e2e.Err() == nil {
		h.l.joinAnswered(time.Now())
	}
}

// errNotMemberYet is a heartbeat not sent: the member has no id yet.
var errNotMemberYet = errors.New("not a group member yet")

// heartbeat sends one Heartbeat with this member's id, generation and
// instance id, and returns the coordinator's answer (nil, or the error of
// its error code, or why none came).
func (s *session) heartbeat(ctx context.Context, cl *kgo.Client) (gen int32, err error) {
	member, gen := cl.GroupMetadata()
	if member == "" || gen < 0 {
		return gen, errNotMemberYet
	}
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = s.env.cfg.ApplicationID
	req.MemberID = member
	req.Generation = gen
	req.InstanceID = &s.env.instanceID
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return gen, err
	}
	return gen, kerr.ErrorForCode(resp.ErrorCode)
}

// leaseLoop keeps the lease until ctx is done: a heartbeat every heartbeat
// interval (one at a time, each given at most the interval), and the
// deadline checked every leaseCheckEvery.
func (s *session) leaseLoop(ctx context.Context) {
	interval := heartbeatInterval(s.env.cfg.SessionTimeout)
	check := time.NewTicker(leaseCheckEvery)
	defer check.Stop()
	var next time.Time
	answers := make(chan struct{}, 1)
	inFlight := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-answers:
			inFlight = false
		case now := <-check.C:
			if silent, ok := s.lease.expire(now, s.reg.partitions()); ok {
				s.lapse(silent)
			}
			if cl := s.kc(); cl != nil && !inFlight && !now.Before(next) {
				if st, _, _ := s.lease.snapshot(); st == leaseHeld {
					inFlight, next = true, now.Add(interval)
					s.goroutine(func() {
						defer func() { answers <- struct{}{} }()
						hctx, cancel := context.WithTimeout(ctx, interval)
						defer cancel()
						_, sent, err := s.proto.heartbeat(hctx)
						s.lease.answered(sent, err)
						s.heartbeatAnswered(ctx, err)
					})
				}
			}
		}
	}
}

// heartbeatAnswered opens or closes the wait for the group coordinator
// from a heartbeat's outcome. Any error code but the coordinator's own
// (moved, loading, unavailable) is an answer; no answer, or one of those, is
// a wait; a shutdown, or a member not in the group yet, is neither.
func (s *session) heartbeatAnswered(ctx context.Context, err error) {
	var code *kerr.Error
	switch {
	case ctx.Err() != nil, errors.Is(err, errNotMemberYet):
	case errors.Is(err, kerr.CoordinatorNotAvailable), errors.Is(err, kerr.NotCoordinator),
		errors.Is(err, kerr.CoordinatorLoadInProgress):
		s.env.waits.failed(groupWait, "the group coordinator of "+s.env.cfg.ApplicationID+" (heartbeats answered: it moved or is loading)", -1, err)
	case err == nil, errors.As(err, &code):
		s.env.waits.answered(groupWait)
	default:
		s.env.waits.failed(groupWait, "the group coordinator of "+s.env.cfg.ApplicationID+" (heartbeats unanswered)", -1, err)
	}
}

// leaseCheckEvery is how often the lease's deadline is checked.
const leaseCheckEvery = 50 * time.Millisecond

// leaseLateWarn is how far past its deadline a lapse is said to be late:
// twenty checks.
const leaseLateWarn = 20 * leaseCheckEvery

// heartbeatInterval is the group's heartbeat interval for a session
// timeout: a third of it (as Kafka advises), at most the 3 s default, so
// that a short session does not expire between heartbeats.
func heartbeatInterval(session time.Duration) time.Duration {
	return min(3*time.Second, session/3)
}

// rebalanceTimeout is the group client's rebalance timeout (franz-go's
// default, set explicitly so that the lease knows it).
const rebalanceTimeout = 60 * time.Second

// lapse drops every task when the lease lapsed: the coordinator has not
// been heard from for silent, and may give them to another member at any
// moment. The member then rejoins.
func (s *session) lapse(silent time.Duration) {
	ps := s.reg.partitions()
	s.reg.mu.Lock()
	s.reg.mu.held = make(map[int32]uint8)
	s.reg.mu.Unlock()
	if len(ps) > 0 {
		// late is how long after the deadline the loop saw it pass: more
		// than a few checks means the loop was held up, and the tasks ran
		// that long past the point where the group could give them away.
		late := s.lease.lateBy()
		s.env.log.Warn("No heartbeat answered by the group coordinator within the session timeout; dropping the tasks without committing before the group can give them to another member, then rejoining",
			zap.Strings("tasks", taskNames(ps)), zap.Duration("silent_for", silent.Round(time.Millisecond)),
			zap.Duration("session_timeout", s.env.cfg.SessionTimeout), zap.Duration("past_deadline", late.Round(time.Millisecond)))
		if late > leaseLateWarn {
			s.env.log.Warn(fmt.Sprintf("The lease's deadline passed %s before the lease loop saw it: the loop was held up, and the tasks ran past the point where the group could give them to another member", late.Round(time.Millisecond)),
				zap.Duration("past_deadline", late))
		}
		cl := s.kc()
		// Nothing more of theirs is fetched before they run again.
		cl.PauseFetchPartitions(s.env.topicsOf(ps))
		s.cutOff(ps)
		s.g.dropped(ps)
		if err := s.stopTasks(ps, false, "dropped: no heartbeat answered within the session timeout, nothing committed"); err != nil {
			s.env.log.Warn("Dropping tasks", zap.Error(err))
		}
		// Not on the lease loop, which must keep checking meanwhile.
		s.proto.rejoin("the lease lapsed")
	}
	s.reconcileStandbys()
}

// rereadLapsed tells the guarantee to read the input of the tasks that ran
// again here after the lease lapsed from what is committed (the client's
// position is past what they folded before they were dropped).
func (s *session) rereadLapsed(lapsed map[int32]bool) {
	var again []int32
	for p := range lapsed {
		if s.reg.task(p) != nil {
			again = append(again, p)
		}
	}
	if len(again) == 0 {
		return
	}
	sort.Slice(again, func(i, j int) bool { return again[i] < again[j] })
	s.g.replaced(again)
}
