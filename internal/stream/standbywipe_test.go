package stream

import (
	"context"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/state"
)

func TestWipedCopyReportsNoPositionAtOnce(t *testing.T) {
	// Scenario: a warm-up copy of task 0_1 at changelog offset 500, caught up (its probe recent)
	// and its store last closed at 500, is wiped (the changelog start moved past it:
	// ErrOutOfRange). From then on, before it starts over after standbyRetry, the offsets this
	// member reports for 0_1 are none: neither its old position, nor its probe's, nor the
	// checkpoint its store was closed with, so a rebalance meanwhile cannot take it for caught up.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	local := newLocalStores()
	sb := newStandby(copyDeps{env: l.task.deps.env, topo: l.task.deps.topo, local: local}, 1, kindWarmup, nil)
	sb.pos.position.Store(500)
	sb.pos.end.Store(500)
	sb.probe.at, sb.probe.offset, sb.probe.end = time.Now(), 500, 500
	local.note(1, state.Checkpoint{ChangelogOffset: 500, InputOffset: -1, ChangelogTopicID: l.task.deps.topo.changelogID})

	if err := sb.wipe(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if st := sb.store.Swap(nil); st != nil {
			_ = st.Close()
		}
	})
	if pos, end := sb.reported(); pos >= 0 {
		t.Errorf("the wiped copy reports offset %d (end %d), want none", pos, end)
	}
	if off, ok := local.offsets(l.task.deps.topo.changelogID)[1]; ok {
		t.Errorf("the member reports checkpoint %d for the wiped store of 0_1, want none", off)
	}
	if lag := sb.lag(); lag >= 0 {
		t.Errorf("the wiped copy's lag is %d, want unknown", lag)
	}
}

func TestCopyReportsWhatItsWindowsLack(t *testing.T) {
	// Scenario: a warm-up copy of task 0_1 whose totals are caught up (offset 500 of 500) and
	// which keeps 1h windows. While the windows' lag is unknown, and while they are
	// acceptable.recovery.lag + 10 records behind their changelog, the copy reports its offset
	// against an end that much further (an unknown lag counts as acceptable.recovery.lag + 1), so
	// that the leader's lag (end - offset) is the whole restore's, and asks for no rebalance;
	// once the windows catch up it reports 500 of 500 and asks.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	probes := 0
	sb := newStandby(copyDeps{env: l.task.deps.env, topo: l.task.deps.topo, local: newLocalStores(),
		probe: func(string) bool { probes++; return true }, spawn: func(f func()) { f() }}, 1, kindWarmup, nil)
	f := newWindowFollower(newWindowAgg(time.Hour, 0, 24*time.Hour, "w-1h-changelog", "w-1h", [16]byte{}))
	sb.windows = append(sb.windows, f)
	sb.pos.position.Store(500)
	sb.pos.end.Store(500)
	acceptable := l.task.deps.env.cfg.AcceptableRecoveryLag

	sb.checkCaughtUp()
	if pos, end := sb.reported(); pos != 500 || end != 500+acceptable+1 || probes != 0 {
		t.Fatalf("windows' lag unknown: reported %d of %d after %d probes, want 500 of %d and none", pos, end, probes, 500+acceptable+1)
	}
	f.pos.position.Store(100)
	f.pos.end.Store(100 + acceptable + 10)
	sb.checkCaughtUp()
	if pos, end := sb.reported(); pos != 500 || end != 500+acceptable+10 || probes != 0 {
		t.Fatalf("windows %d behind: reported %d of %d after %d probes, want 500 of %d and none", acceptable+10, pos, end, probes, 500+acceptable+10)
	}
	f.pos.position.Store(100 + acceptable + 10)
	sb.checkCaughtUp()
	if pos, end := sb.reported(); pos != 500 || end != 500 || probes != 1 {
		t.Fatalf("windows caught up: reported %d of %d after %d probes, want 500 of 500 and one probe", pos, end, probes)
	}
}
