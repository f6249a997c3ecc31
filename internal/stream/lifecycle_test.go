package stream

import "testing"

func TestTaskMoves(t *testing.T) {
	// Scenario: a task moves only along the table: every pair of states is tried, the allowed
	// ones move, the others leave the state as it was; closed and failed are final.
	all := []TaskState{TaskCreated, TaskRestoring, TaskRunning, TaskStopping, TaskClosed, TaskFailed, TaskStalled}
	want := map[[2]TaskState]bool{
		{TaskCreated, TaskRestoring}:  true,
		{TaskRestoring, TaskRunning}:  true,
		{TaskRestoring, TaskStopping}: true,
		{TaskRestoring, TaskClosed}:   true,
		{TaskRestoring, TaskFailed}:   true,
		{TaskRunning, TaskStalled}:    true,
		{TaskRunning, TaskStopping}:   true,
		{TaskRunning, TaskFailed}:     true,
		{TaskStalled, TaskRunning}:    true,
		{TaskStalled, TaskStopping}:   true,
		{TaskStalled, TaskFailed}:     true,
		{TaskStopping, TaskClosed}:    true,
		{TaskStopping, TaskFailed}:    true,
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
			if ok != want[[2]TaskState{from, to}] || (ok && l.get() != to) || (!ok && l.get() != from) {
				t.Errorf("%s -> %s: moved %v, now %s; want moved %v", from, to, ok, l.get(), want[[2]TaskState{from, to}])
			}
		}
	}
}

func TestCopyMoves(t *testing.T) {
	// Scenario: a standby copy moves only along its table; a stop closes it from any state but
	// closed, which is final; the status names are those of the task states they resemble.
	all := []CopyState{CopyCreated, CopyOpening, CopyTailing, CopyRetrying, CopyClosed}
	want := map[[2]CopyState]bool{
		{CopyCreated, CopyOpening}:  true,
		{CopyCreated, CopyClosed}:   true,
		{CopyOpening, CopyTailing}:  true,
		{CopyOpening, CopyRetrying}: true,
		{CopyOpening, CopyClosed}:   true,
		{CopyTailing, CopyRetrying}: true,
		{CopyTailing, CopyClosed}:   true,
		{CopyRetrying, CopyOpening}: true,
		{CopyRetrying, CopyClosed}:  true,
	}
	for _, from := range all {
		for _, to := range all {
			var c copyState
			c.v.Store(int32(from))
			_, ok := c.move(to)
			if from == to {
				continue
			}
			if ok != want[[2]CopyState{from, to}] || (ok && c.get() != to) || (!ok && c.get() != from) {
				t.Errorf("%s -> %s: moved %v, now %s", from, to, ok, c.get())
			}
		}
	}
	for s, name := range map[CopyState]string{CopyOpening: "restoring", CopyTailing: "running", CopyRetrying: "failed", CopyClosed: "closed"} {
		if s.String() != name {
			t.Errorf("%d is %q, want %q (the status's names)", s, s.String(), name)
		}
	}
}
