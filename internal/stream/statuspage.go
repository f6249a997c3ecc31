package stream

import (
	"fmt"

	"github.com/salesagg/salesagg/internal/state"
)

// ScanStore returns up to limit totals of the store of task (an active task
// running on this instance), sorted by product, after the product after (""
// starts at the first). The status page reads the stores with it in bounded
// chunks to find the top products (see httpapi's topProducts); it reads the
// committed totals, as Products does, and never blocks the task for longer
// than one chunk's iteration.
//
// It fails with ErrNotHosted when the task does not run here and with
// ErrNotReady while it is not running (restoring, stalled, stopping).
func (rt *Runtime) ScanStore(task, after string, limit int) ([]state.Total, error) {
	for _, t := range rt.reg.tasks() {
		if t.name != task {
			continue
		}
		s := t.store.Load()
		if st := t.State(); st != TaskRunning || s == nil {
			return nil, fmt.Errorf("%w: task %s is %s", ErrNotReady, task, st)
		}
		return s.Scan(after, limit)
	}
	return nil, fmt.Errorf("%w: task %s", ErrNotHosted, task)
}
