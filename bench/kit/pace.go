package kit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// WaitTopic waits (bounded) until the broker's metadata shows every
// partition of a just-created topic with a leader: a client that asks
// earlier can be told the topic has no leaders and retry only after its
// metadata min age (5 s in franz-go).
func WaitTopic(ctx context.Context, adm *kadm.Client, topic string, parts int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	status := ""
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			d, ok := md.Topics[topic]
			switch {
			case !ok:
				status = "not in the metadata"
			case d.Err != nil:
				status = d.Err.Error()
			case len(d.Partitions) != parts:
				status = fmt.Sprintf("%d partitions", len(d.Partitions))
			default:
				ready := true
				for _, p := range d.Partitions {
					if p.Err != nil || p.Leader < 0 {
						ready, status = false, fmt.Sprintf("partition %d: leader %d, %v", p.Partition, p.Leader, p.Err)
					}
				}
				if ready {
					return nil
				}
			}
		} else {
			status = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for topic %s to have a leader for each of its %d partitions: %w (last: %s)", topic, parts, context.Cause(ctx), status)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Sleep sleeps d unless ctx ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}

// EndOffsets returns the end offset of every partition of topic.
func EndOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of %s: %w", topic, err)
	}
	out := map[int32]int64{}
	ends.Each(func(lo kadm.ListedOffset) { out[lo.Partition] = lo.Offset })
	return out, nil
}

// Pacer produces records at a steady rate from a goroutine of its own: every
// 10 ms the records due since its start (rate × elapsed), each from next,
// which only that goroutine calls. The client is the caller's until Finish,
// which closes it.
type Pacer struct {
	cl   *kgo.Client
	rate int
	next func() *kgo.Record

	sent, acked, failed atomic.Int64
	behind              atomic.Int64 // records dropped from the schedule after a stall of more than 1 s

	mu       sync.Mutex // guards firstErr, stopped
	firstErr error
	stopped  time.Time

	started time.Time
	stop    chan struct{}
	done    chan struct{}
}

// PacerStats is what a pacer did.
type PacerStats struct {
	RateTarget   int     `json:"rate_target_events_per_s"`
	Sent         int64   `json:"sent"`
	Acked        int64   `json:"acked"`
	Failed       int64   `json:"failed"`
	Skipped      int64   `json:"skipped_after_stalls"`
	DurationMs   int64   `json:"duration_ms"`
	RateAchieved float64 `json:"rate_achieved_events_per_s"`
	FirstError   string  `json:"first_error,omitempty"`
}

// StartPacer starts producing through cl at rate records/s.
func StartPacer(cl *kgo.Client, rate int, next func() *kgo.Record) *Pacer {
	p := &Pacer{cl: cl, rate: rate, next: next, stop: make(chan struct{}), done: make(chan struct{}), started: time.Now()}
	go p.loop()
	return p
}

func (p *Pacer) loop() {
	defer close(p.done)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var scheduled int64 // records due from p.started
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		due := int64(time.Since(p.started).Seconds() * float64(p.rate))
		if due-scheduled > int64(p.rate) {
			// More than 1 s behind (a stall of this process or a full
			// buffer): do not burst, drop the backlog from the schedule.
			p.behind.Add(due - scheduled - int64(p.rate)/100)
			scheduled = due - int64(p.rate)/100
		}
		for ; scheduled < due; scheduled++ {
			p.sent.Add(1)
			// TryProduce never blocks: a full buffer fails the record.
			p.cl.TryProduce(context.Background(), p.next(), p.promise)
		}
	}
}

func (p *Pacer) promise(_ *kgo.Record, err error) {
	if err == nil {
		p.acked.Add(1)
		return
	}
	p.failed.Add(1)
	p.mu.Lock()
	if p.firstErr == nil {
		p.firstErr = err
	}
	p.mu.Unlock()
}

// Finish stops producing, flushes (bounded) and closes the client.
func (p *Pacer) Finish() PacerStats {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.mu.Lock()
	if p.stopped.IsZero() {
		p.stopped = time.Now()
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.cl.Flush(ctx); err != nil {
		p.mu.Lock()
		if p.firstErr == nil {
			p.firstErr = fmt.Errorf("flushing: %w", err)
		}
		p.mu.Unlock()
	}
	p.cl.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.stopped.Sub(p.started)
	st := PacerStats{RateTarget: p.rate, Sent: p.sent.Load(), Acked: p.acked.Load(), Failed: p.failed.Load(),
		Skipped: p.behind.Load(), DurationMs: d.Milliseconds()}
	if d > 0 {
		st.RateAchieved = float64(st.Acked) / d.Seconds()
	}
	if p.firstErr != nil {
		st.FirstError = p.firstErr.Error()
	}
	return st
}
