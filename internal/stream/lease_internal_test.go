package stream

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestLeaseMoves(t *testing.T) {
	// Scenario: the lease moves only along its table: every pair of states is tried, the allowed
	// ones move, the others leave the state as it was.
	all := []leaseState{leaseIdle, leaseHeld, leaseLapsed}
	want := map[[2]leaseState]bool{
		{leaseIdle, leaseHeld}:     true,
		{leaseHeld, leaseHeld}:     true,
		{leaseHeld, leaseLapsed}:   true,
		{leaseHeld, leaseIdle}:     true,
		{leaseLapsed, leaseHeld}:   true,
		{leaseLapsed, leaseIdle}:   true,
		{leaseIdle, leaseIdle}:     false,
		{leaseIdle, leaseLapsed}:   false,
		{leaseLapsed, leaseLapsed}: false,
	}
	for _, from := range all {
		for _, to := range all {
			l := newLease(6*time.Second, time.Minute)
			l.state = from
			moved := l.move(to)
			if moved != want[[2]leaseState{from, to}] {
				t.Errorf("%s -> %s: moved %t, want %t", from, to, moved, !moved)
			}
			if !moved && l.state != from {
				t.Errorf("%s -> %s refused but the state is %s", from, to, l.state)
			}
		}
	}
}

func TestLeaseDeadline(t *testing.T) {
	// Scenario: the deadline follows the coordinator's answers as the classic protocol bounds a
	// member's session: from the join before an assignment, from each answered heartbeat's send
	// time, capped by the rebalance timeout while a rebalance is in progress, never moved by an
	// error or no answer; past it the lease lapses once, keeping the dropped tasks to read again.
	session, rebalance := 6*time.Second, 20*time.Second
	l := newLease(session, rebalance)
	margin := l.margin
	if margin != 750*time.Millisecond {
		t.Fatalf("margin %s, want 750ms (an eighth of 6 s)", margin)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, ok := l.expire(t0.Add(time.Hour), []int32{0}); ok {
		t.Fatal("an idle lease lapsed")
	}

	l.joinAnswered(t0)
	l.assigned(t0.Add(100 * time.Millisecond))
	if st, until, _ := l.snapshot(); st != leaseHeld || !until.Equal(t0.Add(session-margin)) {
		t.Fatalf("after the assignment: %s until %s, want held until join + session - margin", st, until)
	}

	l.answered(t0.Add(2*time.Second), nil)
	if _, until, _ := l.snapshot(); !until.Equal(t0.Add(2*time.Second + session - margin)) {
		t.Fatalf("after a heartbeat: until %s", until)
	}
	for _, err := range []error{kerr.NotCoordinator, kerr.UnknownMemberID, kerr.IllegalGeneration, errors.New("i/o timeout")} {
		l.answered(t0.Add(4*time.Second), err)
	}
	if _, until, _ := l.snapshot(); !until.Equal(t0.Add(2*time.Second + session - margin)) {
		t.Fatalf("an error moved the deadline to %s", until)
	}

	// A rebalance in progress: the session holds, but the rebalance may end without this member
	// once the rebalance timeout has passed since the last stable answer (at 2 s).
	for at := 4 * time.Second; at <= 30*time.Second; at += 2 * time.Second {
		l.answered(t0.Add(at), kerr.RebalanceInProgress)
	}
	if _, until, _ := l.snapshot(); !until.Equal(t0.Add(2*time.Second + rebalance - margin)) {
		t.Fatalf("in a rebalance: until %s, want the last stable answer + rebalance timeout - margin", until)
	}

	lapseAt := t0.Add(2*time.Second + rebalance - margin)
	if _, ok := l.expire(lapseAt.Add(-time.Millisecond), []int32{0, 2}); ok {
		t.Fatal("lapsed before the deadline")
	}
	if l.overdue(lapseAt.Add(-time.Millisecond)) || !l.overdue(lapseAt) {
		t.Fatal("held: overdue should be false before the deadline and true from it")
	}
	silent, ok := l.expire(lapseAt, []int32{0, 2})
	if !ok || silent != lapseAt.Sub(t0.Add(30*time.Second)) {
		t.Fatalf("at the deadline: lapsed %t, silent %s", ok, silent)
	}
	if late := l.lateBy(); late != 0 {
		t.Fatalf("a lapse seen at its deadline is %s late", late)
	}
	if _, ok := l.expire(lapseAt.Add(time.Second), []int32{1}); ok {
		t.Fatal("lapsed twice")
	}
	if l.lapseReason() == "" {
		t.Fatal("a lapsed lease gives no reason")
	}
	// Lapsed, the tasks are being stopped: not reported running, whatever the time.
	if !l.overdue(lapseAt.Add(time.Hour)) {
		t.Fatal("a lapsed lease is not overdue: its tasks show running while they are dropped")
	}
	l.answered(lapseAt.Add(time.Second), nil)
	if st, _, _ := l.snapshot(); st != leaseLapsed {
		t.Fatalf("an answered heartbeat moved a lapsed lease to %s; only an assignment does", st)
	}

	l.joinAnswered(lapseAt.Add(2 * time.Second))
	lapsed := l.assigned(lapseAt.Add(3 * time.Second))
	if len(lapsed) != 2 || !lapsed[0] || !lapsed[2] {
		t.Fatalf("the assignment after the lapse returned %v, want tasks 0 and 2 to read again", lapsed)
	}
	if st, until, _ := l.snapshot(); st != leaseHeld || !until.Equal(lapseAt.Add(2*time.Second+session-margin)) {
		t.Fatalf("after the next assignment: %s until %s", st, until)
	}
	if l.lapseReason() != "" {
		t.Fatal("a held lease gives a lapse reason")
	}
	if l.overdue(lapseAt.Add(3 * time.Second)) {
		t.Fatal("held again by an assignment, the lease is still overdue")
	}
	// Seen 2 s past the deadline, the lapse is 2 s late.
	_, until, _ := l.snapshot()
	if _, ok := l.expire(until.Add(2*time.Second), []int32{0}); !ok || l.lateBy() != 2*time.Second {
		t.Fatalf("a lapse seen 2 s past the deadline: lapsed %t, late by %s", ok, l.lateBy())
	}
	// An assignment answered 10 s after its join is past its deadline when it comes: the lapse
	// at the next check is late by the check only, not by the time the SyncGroup took.
	joined := until.Add(5 * time.Second)
	l.joinAnswered(joined)
	l.assigned(joined.Add(10 * time.Second))
	if _, ok := l.expire(joined.Add(10*time.Second+leaseCheckEvery), []int32{0}); !ok || l.lateBy() != leaseCheckEvery {
		t.Fatalf("a lapse at the check after a late assignment: lapsed %t, late by %s, want %s", ok, l.lateBy(), leaseCheckEvery)
	}
	l.lost()
	// Lost (the session ended, or the coordinator fenced this member), the tasks still here are
	// being dropped and may already run elsewhere: not reported running.
	if !l.overdue(joined.Add(10 * time.Second)) {
		t.Fatal("a lost lease is not overdue: its tasks show running while they are dropped")
	}
	if st, _, _ := l.snapshot(); st != leaseIdle {
		t.Fatalf("after a loss: %s", st)
	}
}
