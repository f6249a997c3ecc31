package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// broker is the Kafka broker of the benchmark: one started by
// test/kafka/kafka.sh in a temp dir, or the one given with --bootstrap.
type broker struct {
	addr     string
	kafkaDir string // "" when external
	script   string
	version  string
}

// startBroker runs `kafka.sh up` with KAFKA_DIR under tmp; the bootstrap
// address is the last line of its stdout.
func startBroker(ctx context.Context, repo, tmp string) (*broker, error) {
	b := &broker{kafkaDir: filepath.Join(tmp, "kafka"), script: filepath.Join(repo, "test", "kafka", "kafka.sh")}
	logf("starting a Kafka broker: KAFKA_DIR=%s %s up", b.kafkaDir, b.script)
	cmd := exec.CommandContext(ctx, b.script, "up")
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+b.kafkaDir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return b, fmt.Errorf("kafka.sh up: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	b.addr = strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(b.addr, "127.0.0.1:") {
		return b, fmt.Errorf("kafka.sh up printed %q as its last line, want a 127.0.0.1:PORT address", b.addr)
	}
	if log, err := os.ReadFile(filepath.Join(b.kafkaDir, "broker.log")); err == nil {
		if m := regexp.MustCompile(`Kafka version: (\S+)`).FindSubmatch(log); m != nil {
			b.version = string(m[1])
		}
	}
	return b, nil
}

// down stops the broker started by startBroker (always, with its own timeout).
func (b *broker) down() {
	if b == nil || b.kafkaDir == "" {
		return
	}
	logf("stopping the Kafka broker (kafka.sh down)")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.script, "down")
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+b.kafkaDir)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		logf("kafka.sh down: %v", err)
	}
}

func newAdmin(addr string) (*kgo.Client, *kadm.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return nil, nil, err
	}
	return cl, kadm.NewClient(cl), nil
}

// brokerVersionGuess asks the broker for its API versions (for --bootstrap).
func brokerVersionGuess(ctx context.Context, adm *kadm.Client) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	vs, err := adm.ApiVersions(ctx)
	if err != nil {
		return ""
	}
	for _, v := range vs {
		if v.Err == nil {
			return "guess: " + v.VersionGuess()
		}
	}
	return ""
}

func createTopic(ctx context.Context, adm *kadm.Client, topic string, parts int) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, int32(parts), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	return nil
}

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

// committedAtEnd reports whether the group's committed offsets of topic
// reached ends on every partition, and how many offsets are committed.
func committedAtEnd(ctx context.Context, adm *kadm.Client, group, topic string, ends map[int32]int64) (bool, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false, 0, err
	}
	at := true
	var sum int64
	for p, end := range ends {
		o, ok := offs.Lookup(topic, p)
		if !ok || o.Err != nil || o.At < 0 {
			at = false
			continue
		}
		sum += o.At
		if o.At < end {
			at = false
		}
	}
	return at, sum, nil
}

func productKey(i int) string { return "product-" + strconv.Itoa(i) }

func eventValue(product string) []byte {
	return []byte(`{"product":"` + product + `","value":1}`)
}

func newProducer(addr, topic string) (*kgo.Client, error) {
	return kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(1<<20),
		kgo.MaxBufferedRecords(200_000),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
}

// preload produces products events, one per product product-0 …
// product-<n-1>, with franz-go's default partitioner (murmur2 on the key, as
// the Java client), and returns the input's end offsets.
func preload(ctx context.Context, addr, topic string, n int, adm *kadm.Client) (map[int32]int64, time.Duration, error) {
	cl, err := newProducer(addr, topic)
	if err != nil {
		return nil, 0, err
	}
	defer cl.Close()
	t0 := time.Now()
	var (
		failed  = make(chan error, 1)
		lastLog = t0
	)
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return nil, 0, context.Cause(ctx)
		}
		p := productKey(i)
		cl.Produce(ctx, &kgo.Record{Key: []byte(p), Value: eventValue(p)}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		})
		if now := time.Now(); now.Sub(lastLog) >= 5*time.Second {
			lastLog = now
			logf("preload: produced %d of %d products", i+1, n)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		return nil, 0, fmt.Errorf("flushing the preload producer: %w", err)
	}
	select {
	case err := <-failed:
		return nil, 0, fmt.Errorf("producing the preload to %s: %w", topic, err)
	default:
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
	cl, err := newProducer(addr, topic)
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

// deleteRun deletes the topics with the given prefix and the groups (bounded).
func deleteRun(adm *kadm.Client, prefix string, groups []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(groups) > 0 {
		_, _ = adm.DeleteGroups(ctx, groups...)
	}
	tds, err := adm.ListTopics(ctx)
	if err != nil {
		logf("cleanup: listing topics: %v", err)
		return
	}
	var del []string
	for _, t := range tds.Names() {
		if strings.HasPrefix(t, prefix) {
			del = append(del, t)
		}
	}
	if len(del) > 0 {
		if _, err := adm.DeleteTopics(ctx, del...); err != nil {
			logf("cleanup: deleting topics %v: %v", del, err)
		}
	}
}

// warmGroupCoordinator commits an offset for a throw-away group, so that the
// broker creates __consumer_offsets before the first run.
func warmGroupCoordinator(ctx context.Context, adm *kadm.Client, group, topic string) error {
	var os kadm.Offsets
	os.AddOffset(topic, 0, 0, -1)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		err := adm.CommitAllOffsets(ctx, group, os)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
