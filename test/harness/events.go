package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

// Event is one sales event: its record key and JSON value.
type Event struct {
	Product string
	Value   int64
	// NoKey sends it with an empty key (the service groups it by the
	// value's product).
	NoKey bool
	// Misroute sends it to partition To, whatever its key, with a producer
	// using HeaderPartitioner.
	Misroute bool
	To       int32
}

// Record is the event as a record for topic.
func (e Event) Record(topic string) *kgo.Record {
	v, _ := json.Marshal(map[string]any{"product": e.Product, "value": e.Value})
	r := &kgo.Record{Topic: topic, Key: []byte(e.Product), Value: v}
	if e.NoKey {
		r.Key = nil
	}
	if e.Misroute {
		r.Headers = []kgo.RecordHeader{{Key: "to", Value: []byte{byte(e.To)}}}
	}
	return r
}

// Records returns the events as records for topic.
func Records(topic string, evs []Event) []*kgo.Record {
	recs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		recs[i] = e.Record(topic)
	}
	return recs
}

// GenEvents returns n events over the products <prefix>000 … with values
// in [1, 1000] (one in twenty negative, a tenth of that), drawn from rng.
func GenEvents(rng *rand.Rand, prefix string, products, n int) []Event {
	out := make([]Event, n)
	for i := range out {
		v := int64(1 + rng.IntN(1000))
		if rng.IntN(20) == 0 {
			v = -v / 10
		}
		out[i] = Event{Product: fmt.Sprintf("%s%03d", prefix, rng.IntN(products)), Value: v}
	}
	return out
}

// Scatter sends about 20% of events with an empty key and 10% to a
// partition (of partitions) that does not own their product, drawn from
// rng: the repartition topic then carries traffic.
func Scatter(rng *rand.Rand, events []Event, partitions int32) {
	for i := range events {
		switch n := rng.IntN(10); {
		case n < 2:
			events[i].NoKey = true
		case n == 2:
			owner := sales.Partition([]byte(events[i].Product), partitions)
			events[i].Misroute = true
			events[i].To = (owner + 1 + int32(rng.IntN(int(partitions)-1))) % partitions
		}
	}
}

// TotalsOf sums events per product, as the service must.
func TotalsOf(evs ...[]Event) map[string]int64 {
	out := map[string]int64{}
	for _, es := range evs {
		for _, e := range es {
			out[e.Product] += e.Value
		}
	}
	return out
}

// HeaderPartitioner sends a record with a "to" header to the partition it
// names, others as the Java producer does (murmur2 of the key; sticky for
// an empty key).
type HeaderPartitioner struct{}

// ForTopic returns the partitioner of topic.
func (HeaderPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return headerTopicPartitioner{kgo.StickyKeyPartitioner(nil).ForTopic(topic)}
}

type headerTopicPartitioner struct{ byKey kgo.TopicPartitioner }

func (headerTopicPartitioner) OnNewBatch()                          {}
func (headerTopicPartitioner) RequiresConsistency(*kgo.Record) bool { return true }
func (p headerTopicPartitioner) Partition(r *kgo.Record, n int) int {
	for _, h := range r.Headers {
		if h.Key == "to" {
			return int(h.Value[0]) % n
		}
	}
	return p.byKey.Partition(r, n)
}

// Producer sends events to a topic in batches, each batch acknowledged
// before the next (so it rides out a broker outage: the client retries until
// the broker is back, and the idempotent producer never duplicates), and
// keeps the totals of the events acknowledged. Its goroutine never calls
// t.Fatal.
type Producer struct {
	cl    *kgo.Client
	topic string
	next  func(i int) (Event, bool)
	total int // events next yields; -1: no end

	sent    atomic.Int64 // events acknowledged
	started bool
	stop    chan struct{}
	done    chan struct{}

	mu     sync.Mutex
	i      int              // guarded by mu: the next event's index
	totals map[string]int64 // guarded by mu
	err    error            // guarded by mu
}

// NewProducer returns a producer of events to topic.
func NewProducer(cl *kgo.Client, topic string, events []Event) *Producer {
	p := newProducer(cl, topic, func(i int) (Event, bool) {
		if i >= len(events) {
			return Event{}, false
		}
		return events[i], true
	})
	p.total = len(events)
	return p
}

// NewEndlessProducer returns a producer to topic of the events gen(0),
// gen(1), …, which sends until stopped.
func NewEndlessProducer(cl *kgo.Client, topic string, gen func(i int) Event) *Producer {
	return newProducer(cl, topic, func(i int) (Event, bool) { return gen(i), true })
}

func newProducer(cl *kgo.Client, topic string, next func(int) (Event, bool)) *Producer {
	return &Producer{cl: cl, topic: topic, next: next, total: -1, stop: make(chan struct{}), done: make(chan struct{}),
		totals: map[string]int64{}}
}

// Send sends the next n events (fewer at the end) and waits for their
// acknowledgement; it reports whether any was left to send.
func (p *Producer) Send(n int) (bool, error) {
	return p.send(context.Background(), n)
}

func (p *Producer) send(ctx context.Context, n int) (bool, error) {
	p.mu.Lock()
	from := p.i
	var evs []Event
	for len(evs) < n {
		e, ok := p.next(p.i)
		if !ok {
			break
		}
		evs = append(evs, e)
		p.i++
	}
	p.mu.Unlock()
	if len(evs) == 0 {
		return false, nil
	}
	// Generous: a broker restart takes seconds; the client retries within
	// this time.
	bctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := p.cl.ProduceSync(bctx, Records(p.topic, evs)...).FirstErr(); err != nil {
		return true, fmt.Errorf("producing events %d..%d: %w", from, from+len(evs), err)
	}
	p.mu.Lock()
	for _, e := range evs {
		p.totals[e.Product] += e.Value
	}
	p.mu.Unlock()
	p.sent.Add(int64(len(evs)))
	return true, nil
}

// Start sends batch events every interval from a goroutine until every
// event is sent, Stop, or the end of the test (which aborts the batch in
// flight). It returns p.
func (p *Producer) Start(t testing.TB, batch int, interval time.Duration) *Producer {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); <-p.done })
	p.started = true
	go p.run(ctx, batch, interval)
	return p
}

func (p *Producer) run(ctx context.Context, batch int, interval time.Duration) {
	defer close(p.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		more, err := p.send(ctx, batch)
		if err != nil {
			p.fail(err)
			return
		}
		if !more {
			return
		}
		select {
		case <-p.stop:
			return
		case <-ctx.Done():
			p.fail(ctx.Err())
			return
		case <-tick.C:
		}
	}
}

func (p *Producer) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

// Stop stops the producer after the batch in flight, waits for it and
// returns the error it stopped with, if any.
func (p *Producer) Stop() error {
	if p.started {
		select {
		case <-p.stop:
		default:
			close(p.stop)
		}
		<-p.done
	}
	return p.Err()
}

// Wait waits up to timeout for the producer to send every event and fails
// the test if it did not, or failed.
func (p *Producer) Wait(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("producer not done after %s (%s events sent)", timeout, p.Progress())
	}
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
}

// Finished reports whether the producer's goroutine has ended.
func (p *Producer) Finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the error the producer stopped with, if any.
func (p *Producer) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Sent is the number of events acknowledged so far.
func (p *Producer) Sent() int64 { return p.sent.Load() }

// Progress is Sent, out of how many when that is known: "1200/6000".
func (p *Producer) Progress() string {
	if p.total < 0 {
		return fmt.Sprint(p.Sent())
	}
	return fmt.Sprintf("%d/%d", p.Sent(), p.total)
}

// Totals returns the totals of the events acknowledged so far.
func (p *Producer) Totals() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.totals)
}
