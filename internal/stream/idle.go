package stream

import "time"

// idleFlush tells an at-least-once task when its input paused: the last
// batch it received reached its partition's high watermark, and nothing
// arrived for commit.idle.ms since. The task then flushes without waiting
// for the commit interval, so a total whose events stopped coming is
// committed (and answered) within commit.idle.ms of its last event instead
// of up to commit.interval.ms. While the input flows the timer is re-armed
// by every batch and never fires; while the task lags behind its partition
// it is not armed. Owned by the task goroutine.
type idleFlush struct {
	after time.Duration // 0: off
	timer *time.Timer   // nil until first armed
	armed bool          // timer runs and its fire has not been taken
}

// newIdleFlush returns the task's pause detector: off when idle is 0, not
// below the commit interval (the interval's flush comes first), or under
// exactly-once (on is false).
func newIdleFlush(idle, interval time.Duration, on bool) *idleFlush {
	if !on || idle <= 0 || idle >= interval {
		return &idleFlush{}
	}
	return &idleFlush{after: idle}
}

// received arms the timer after a batch that reached its partition's end,
// and disarms it after one that did not (more is on its way).
func (f *idleFlush) received(b batch) {
	if f.after == 0 {
		return
	}
	if !b.caughtUp() {
		f.disarm()
		return
	}
	if f.timer == nil {
		f.timer = time.NewTimer(f.after)
	} else {
		f.timer.Reset(f.after)
	}
	f.armed = true
}

// c is the timer's channel while armed, nil otherwise.
func (f *idleFlush) c() <-chan time.Time {
	if !f.armed {
		return nil
	}
	return f.timer.C
}

// fired takes the pause (or a flush of the interval, which makes it moot).
func (f *idleFlush) fired() { f.disarm() }

func (f *idleFlush) disarm() {
	if f.armed {
		f.timer.Stop()
		f.armed = false
	}
}

func (f *idleFlush) stop() {
	if f.timer != nil {
		f.timer.Stop()
	}
}

// caughtUp reports whether b ends at its partition's high watermark as the
// fetch saw it (an unknown watermark counts as not caught up).
func (b batch) caughtUp() bool {
	if len(b.recs) == 0 || b.hwm < 0 {
		return false
	}
	return b.recs[len(b.recs)-1].Offset+1 >= b.hwm
}
