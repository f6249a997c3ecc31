package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/bench/kit"
)

// waitTopic waits (bounded) until the broker's metadata shows every
// partition of a just-created topic with a leader: a client that asks
// earlier can be told the topic has no leaders and retry only after its
// metadata min age (5 s in franz-go).
func waitTopic(ctx context.Context, adm *kadm.Client, topic string, parts int) error {
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

// endOffsets returns the end offset of every partition of topic.
func endOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
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

func productKey(i int) string { return "product-" + strconv.Itoa(i) }

func eventValue(product string) []byte {
	return []byte(`{"product":"` + product + `","value":1}`)
}

// preload produces products events, one per product product-0 …
// product-<n-1>, with franz-go's default partitioner (murmur2 on the key, as
// the Java client), and returns the input's end offsets.
func preload(ctx context.Context, addr, topic string, n int, adm *kadm.Client) (map[int32]int64, time.Duration, error) {
	cl, err := kit.NewBulkProducer(addr, topic)
	if err != nil {
		return nil, 0, err
	}
	defer cl.Close()
	t0 := time.Now()
	err = kit.ProduceAll(ctx, cl, n, func(i int) *kgo.Record {
		p := productKey(i)
		return &kgo.Record{Key: []byte(p), Value: eventValue(p)}
	}, logf, "the preload to "+topic, 5*time.Minute)
	if err != nil {
		return nil, 0, err
	}
	took := time.Since(t0)
	ends, err := endOffsets(ctx, adm, topic)
	if err != nil {
		return nil, 0, err
	}
	var sum int64
	for _, o := range ends {
		sum += o
	}
	if len(ends) != partitions || sum != int64(n) {
		return nil, 0, fmt.Errorf("input topic %s holds %d records in %d partitions after the preload, want %d in %d", topic, sum, len(ends), n, partitions)
	}
	return ends, took, nil
}

// pacer produces events at a steady rate from a goroutine: every 10 ms the
// records due since its start (rate × elapsed), keys product-<i> with i
// uniform over the preloaded products, value 1.
type pacer struct {
	cl       *kgo.Client
	rate     int
	products int
	rng      *rand.Rand

	sent, acked, failed atomic.Int64
	behind              atomic.Int64 // records dropped from the schedule after a stall of more than 1 s

	mu       sync.Mutex
	firstErr error
	started  time.Time
	stopped  time.Time

	stop chan struct{}
	done chan struct{}
}

type pacerStats struct {
	RateTarget   int     `json:"rate_target_events_per_s"`
	Sent         int64   `json:"sent"`
	Acked        int64   `json:"acked"`
	Failed       int64   `json:"failed"`
	Skipped      int64   `json:"skipped_after_stalls"`
	DurationMs   int64   `json:"duration_ms"`
	RateAchieved float64 `json:"rate_achieved_events_per_s"`
	FirstError   string  `json:"first_error,omitempty"`
}

func startPacer(addr, topic string, rate, products int, seed uint64) (*pacer, error) {
	cl, err := kit.NewBulkProducer(addr, topic)
	if err != nil {
		return nil, err
	}
	p := &pacer{cl: cl, rate: rate, products: products, rng: rand.New(rand.NewPCG(seed, seed^0x70616365)),
		stop: make(chan struct{}), done: make(chan struct{}), started: time.Now()}
	go p.loop()
	return p, nil
}

func (p *pacer) loop() {
	defer close(p.done)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	base := p.started
	var scheduled int64 // records due from base
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		due := int64(time.Since(base).Seconds() * float64(p.rate))
		if due-scheduled > int64(p.rate) {
			// More than 1 s behind (a stall of this process or a full
			// buffer): do not burst, drop the backlog from the schedule.
			p.behind.Add(due - scheduled - int64(p.rate)/100)
			scheduled = due - int64(p.rate)/100
		}
		for ; scheduled < due; scheduled++ {
			k := productKey(p.rng.IntN(p.products))
			p.sent.Add(1)
			// TryProduce never blocks: a full buffer fails the record.
			p.cl.TryProduce(context.Background(), &kgo.Record{Key: []byte(k), Value: eventValue(k)}, p.promise)
		}
	}
}

func (p *pacer) promise(_ *kgo.Record, err error) {
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

// finish stops producing, flushes (bounded) and closes the client.
func (p *pacer) finish() pacerStats {
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
	st := pacerStats{RateTarget: p.rate, Sent: p.sent.Load(), Acked: p.acked.Load(), Failed: p.failed.Load(),
		Skipped: p.behind.Load(), DurationMs: d.Milliseconds()}
	if d > 0 {
		st.RateAchieved = float64(st.Acked) / d.Seconds()
	}
	if p.firstErr != nil {
		st.FirstError = p.firstErr.Error()
	}
	return st
}
