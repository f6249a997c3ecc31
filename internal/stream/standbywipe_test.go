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
