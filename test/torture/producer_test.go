//go:build torture

package torture

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// producer sends events at a steady rate the whole run: idempotent, with
// acks=all (franz-go's defaults, stated), each with a unique id in its
// "id" header. It keeps no totals: the checker computes the truth from the
// input topic itself.
type producer struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
	// sent, ok and failed count records handed to the client, acknowledged
	// and failed.
	sent, ok, failed atomic.Int64

	mu      sync.Mutex
	lastErr error // guarded by mu
}

func startProducer(t *testing.T, bootstrap, topic string, seed uint64) *producer {
	cl, err := kgo.NewClient(kgo.SeedBrokers(splitComma(bootstrap)...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(2*time.Minute), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &producer{cl: cl, cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { p.stop(); cl.Close() })
	rng := rand.New(rand.NewPCG(seed, 99))
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second * batchSize / eventsPerSecond)
		defer tick.Stop()
		var seq int64
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for range batchSize {
				seq++
				product := fmt.Sprintf("p%03d", rng.IntN(products))
				value := 1 + rng.Int64N(50)
				r := &kgo.Record{Topic: topic, Key: []byte(product),
					Value:   []byte(fmt.Sprintf(`{"product":%q,"value":%d}`, product, value)),
					Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(strconv.FormatInt(seq, 10))}}}
				p.sent.Add(1)
				// Produce blocks while the client's buffer is full (a
				// partition without a leader): the rate then catches up.
				cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
					if err != nil {
						p.failed.Add(1)
						p.mu.Lock()
						p.lastErr = err
						p.mu.Unlock()
						return
					}
					p.ok.Add(1)
				})
			}
		}
	}()
	return p
}

// stop stops sending and waits for every record in flight.
func (p *producer) stop() {
	p.cancel()
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_ = p.cl.Flush(ctx)
}

func (p *producer) acked() int64 { return p.ok.Load() }

func (p *producer) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := fmt.Sprintf("%d events sent, %d acknowledged, %d failed", p.sent.Load(), p.ok.Load(), p.failed.Load())
	if p.lastErr != nil {
		s += fmt.Sprintf(" (last error: %v)", p.lastErr)
	}
	return s
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}
