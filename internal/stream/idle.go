package stream

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

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

// inputEnds tells the exactly-once poll loop whether its input is at its
// end: every partition polled with records within the last forget had its
// last records reach the end its fetch saw (fetchCaughtUp). The loop runs
// its pause commit (commit.idle.ms) only then: a poll that comes back
// empty in the middle of a backlog (the fetch fell behind the tasks) is
// not a pause, and committing on it would run a transaction per fetch
// instead of one per interval. A partition not polled with records for
// forget (revoked, or its producers stopped while it was behind, which
// the interval's cycle commits) is forgotten. Owned by the poll loop.
type inputEnds struct {
	forget time.Duration
	parts  map[topicPartition]inputEnd
}

// inputEnd is a partition's last poll with records: whether it reached
// the end, and when.
type inputEnd struct {
	atEnd bool
	at    time.Time
}

// newInputEnds returns a tracker that forgets a partition not polled with
// records for forget (the commit interval).
func newInputEnds(forget time.Duration) *inputEnds {
	return &inputEnds{forget: forget, parts: map[topicPartition]inputEnd{}}
}

// polled records where each partition's polled records end, at now.
func (e *inputEnds) polled(fetches kgo.Fetches, now time.Time) {
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		e.parts[topicPartition{p.Topic, p.Partition}] = inputEnd{atEnd: fetchCaughtUp(p.FetchPartition), at: now}
	})
}

// atEnd reports whether every partition polled with records within forget
// of now reached its end; it forgets the older ones.
func (e *inputEnds) atEnd(now time.Time) bool {
	at := true
	for k, v := range e.parts {
		if now.Sub(v.at) >= e.forget {
			delete(e.parts, k)
			continue
		}
		at = at && v.atEnd
	}
	return at
}

// fetchCaughtUp reports whether p's records reach the end of its
// partition as the fetch saw it: the last stable offset when the fetch
// gave one (read_committed), else the high watermark. A transactional
// input's commit marker takes the offset after its last record, so such
// a partition never counts as at its end (its pause commits on the
// interval).
func fetchCaughtUp(p kgo.FetchPartition) bool {
	if len(p.Records) == 0 {
		return false
	}
	end := p.HighWatermark
	if p.LastStableOffset >= 0 {
		end = p.LastStableOffset
	}
	if end < 0 {
		return false
	}
	return p.Records[len(p.Records)-1].Offset+1 >= end
}
