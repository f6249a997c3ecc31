package stream

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Lifecycles of tasks and standby copies.
//
// Each is a state machine: its states, the moves allowed between them in
// one table, and one function that moves (refusing a move the table does
// not allow). TestTaskMoves and TestCopyMoves walk the tables.

// taskState is where a task is in its life.
type taskState int32

// Task states, in the order a task goes through them.
const (
	taskCreated taskState = iota
	taskRestoring
	taskRunning
	taskStopping
	taskClosed
	taskFailed
	// taskStalled: the store cannot take writes (disk full, read-only);
	// the task stopped processing and checks again every second.
	taskStalled
)

func (s taskState) String() string {
	switch s {
	case taskCreated:
		return "created"
	case taskRestoring:
		return "restoring"
	case taskRunning:
		return "running"
	case taskStopping:
		return "stopping"
	case taskClosed:
		return "closed"
	case taskFailed:
		return "failed"
	case taskStalled:
		return "stalled"
	}
	return fmt.Sprintf("taskState(%d)", int32(s))
}

// taskMoves are the moves a task may make: it restores, then runs (stalling
// while its store cannot take writes), then stops; a stop during the
// restore abandons it (closed); closed and failed are final. A stop's
// drain ends where an early flush stalls the task (stopping -> stalled),
// and the stalled task closes without flushing (stalled -> closed).
var taskMoves = map[taskState][]taskState{
	taskCreated:   {taskRestoring},
	taskRestoring: {taskRunning, taskStopping, taskClosed, taskFailed},
	taskRunning:   {taskStalled, taskStopping, taskFailed},
	taskStalled:   {taskRunning, taskStopping, taskClosed, taskFailed},
	taskStopping:  {taskStalled, taskClosed, taskFailed},
}

// allowed reports whether the table allows from -> to.
func allowed[S comparable](moves map[S][]S, from, to S) bool {
	for _, s := range moves[from] {
		if s == to {
			return true
		}
	}
	return false
}

// lifecycle is a task's state and its stop request. The state is written
// by the task goroutine only and read by anyone.
type lifecycle struct {
	state atomic.Int32
	// visited has bit 1<<s set for each state s the task has been in.
	visited atomic.Uint32
	// quit is closed by requestStop; flushOnStop says how to close: flush
	// before closing (revoked at-least-once, shutdown) or drop (lost, and
	// always exactly-once).
	quit        chan struct{}
	quitOnce    sync.Once
	flushOnStop atomic.Bool
	// done is closed when the task goroutine has ended.
	done chan struct{}
}

func newLifecycle() lifecycle {
	return lifecycle{quit: make(chan struct{}), done: make(chan struct{})}
}

func (l *lifecycle) get() taskState { return taskState(l.state.Load()) }

// move makes the move to s when the table allows it; it reports the state
// it was in and whether it moved. Staying in the same state is a no-op.
func (l *lifecycle) move(s taskState) (taskState, bool) {
	from := l.get()
	if from == s {
		return from, true
	}
	if !allowed(taskMoves, from, s) {
		return from, false
	}
	l.visited.Or(1 << uint32(s))
	l.state.Store(int32(s))
	return from, true
}

// reached reports whether the task has ever been in state s.
func (l *lifecycle) reached(s taskState) bool { return l.visited.Load()&(1<<uint32(s)) != 0 }

func (l *lifecycle) requestStop(flush bool) {
	l.quitOnce.Do(func() {
		l.flushOnStop.Store(flush)
		close(l.quit)
	})
}

// copyState is where a standby copy is in its life.
type copyState int32

// Copy states. Their names in the status are those of the task states
// they resemble (a copy opening its store is "restoring", one tailing the
// changelog "running").
const (
	copyCreated copyState = iota
	copyOpening
	copyTailing
	// copyRetrying: the copy failed and starts over after standbyRetry.
	copyRetrying
	copyClosed
)

func (s copyState) String() string {
	switch s {
	case copyCreated:
		return "created"
	case copyOpening:
		return "restoring"
	case copyTailing:
		return "running"
	case copyRetrying:
		return "failed"
	case copyClosed:
		return "closed"
	}
	return fmt.Sprintf("copyState(%d)", int32(s))
}

// copyMoves are the moves a copy may make: it opens its store and tails the
// changelog; a failure waits and opens again; a stop closes it from any
// state.
var copyMoves = map[copyState][]copyState{
	copyCreated:  {copyOpening, copyClosed},
	copyOpening:  {copyTailing, copyRetrying, copyClosed},
	copyTailing:  {copyRetrying, copyClosed},
	copyRetrying: {copyOpening, copyClosed},
}

// atomicCopyState is a copy's state, written by its goroutine, read by anyone.
type atomicCopyState struct{ v atomic.Int32 }

func (c *atomicCopyState) get() copyState { return copyState(c.v.Load()) }

// move makes the move to s when the table allows it (see lifecycle.move).
func (c *atomicCopyState) move(s copyState) (copyState, bool) {
	from := c.get()
	if from == s {
		return from, true
	}
	if !allowed(copyMoves, from, s) {
		return from, false
	}
	c.v.Store(int32(s))
	return from, true
}
