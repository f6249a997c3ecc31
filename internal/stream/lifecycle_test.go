package stream

import "testing"

func TestTaskMoves(t *testing.T) {
	// Scenario: a task moves only along the table: every pair of states is tried, the allowed
	// ones move, the others leave the state as it was; closed and failed are final.
	all := []taskState{taskCreated, taskRestoring, taskRunning, taskStopping, taskClosed, taskFailed, taskStalled}
	want := map[[2]taskState]bool{
		{taskCreated, taskRestoring}:  true,
		{taskRestoring, taskRunning}:  true,
		{taskRestoring, taskStopping}: true,
		{taskRestoring, taskClosed}:   true,
		{taskRestoring, taskFailed}:   true,
		{taskRunning, taskStalled}:    true,
		{taskRunning, taskStopping}:   true,
		{taskRunning, taskFailed}:     true,
		{taskStalled, taskRunning}:    true,
		{taskStalled, taskStopping}:   true,
		{taskStalled, taskClosed}:     true,
		{taskStalled, taskFailed}:     true,
		{taskStopping, taskStalled}:   true,
		{taskStopping, taskClosed}:    true,
		{taskStopping, taskFailed}:    true,
	}
	for _, from := range all {
		for _, to := range all {
			l := newLifecycle()
			l.state.Store(int32(from))
			_, ok := l.move(to)
			if from == to {
				if !ok || l.get() != from {
					t.Errorf("%s -> %s (staying) refused", from, to)
				}
				continue
			}
			if ok != want[[2]taskState{from, to}] || (ok && l.get() != to) || (!ok && l.get() != from) {
				t.Errorf("%s -> %s: moved %v, now %s; want moved %v", from, to, ok, l.get(), want[[2]taskState{from, to}])
			}
		}
	}
}

func TestCopyMoves(t *testing.T) {
	// Scenario: a standby copy moves only along its table; a stop closes it from any state but
	// closed, which is final; the status names are those of the task states they resemble.
	all := []copyState{copyCreated, copyOpening, copyTailing, copyRetrying, copyClosed}
	want := map[[2]copyState]bool{
		{copyCreated, copyOpening}:  true,
		{copyCreated, copyClosed}:   true,
		{copyOpening, copyTailing}:  true,
		{copyOpening, copyRetrying}: true,
		{copyOpening, copyClosed}:   true,
		{copyTailing, copyRetrying}: true,
		{copyTailing, copyClosed}:   true,
		{copyRetrying, copyOpening}: true,
		{copyRetrying, copyClosed}:  true,
	}
	for _, from := range all {
		for _, to := range all {
			var c atomicCopyState
			c.v.Store(int32(from))
			_, ok := c.move(to)
			if from == to {
				continue
			}
			if ok != want[[2]copyState{from, to}] || (ok && c.get() != to) || (!ok && c.get() != from) {
				t.Errorf("%s -> %s: moved %v, now %s", from, to, ok, c.get())
			}
		}
	}
	for s, name := range map[copyState]string{copyOpening: "restoring", copyTailing: "running", copyRetrying: "failed", copyClosed: "closed"} {
		if s.String() != name {
			t.Errorf("%d is %q, want %q (the status's names)", s, s.String(), name)
		}
	}
}
