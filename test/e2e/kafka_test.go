//go:build e2e

package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// changelogTopic is the changelog salesagg and the reference share.
func changelogTopic(appID string) string { return appID + "-PRODUCT_AGGREGATED_SALES-changelog" }

// testNames returns an application id and input and notification topics
// unique to this test and this run, so that tests (and reruns against a
// long-lived broker) never share a topic or a consumer group.
func testNames(short string) (appID, input, notif string) {
	appID = fmt.Sprintf("e2e-%s-%s-%04d", short, time.Now().Format("150405"), rand.IntN(10000))
	return appID, appID + "-sales", appID + "-notifications"
}

// newClient returns a franz-go client for the broker, closed when the test
// ends. Producing uses the default partitioner: murmur2 of the key, as the
// Java producer does.
func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bootstrap, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func newAdmin(t *testing.T) *kadm.Client { return kadm.NewClient(newClient(t)) }

// createTopic creates topic with partitions and configs (replication 1).
func createTopic(t *testing.T, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := newAdmin(t).CreateTopic(ctx, partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

// event is one sales event: its record key and JSON value.
type event struct {
	product string
	value   int64
	// noKey sends it with an empty key (the service groups it by the
	// value's product).
	noKey bool
	// misroute sends it to partition to, whatever its key, with a producer
	// using headerPartitioner.
	misroute bool
	to       int32
}

func (e event) record(topic string) *kgo.Record {
	v, _ := json.Marshal(map[string]any{"product": e.product, "value": e.value})
	r := &kgo.Record{Topic: topic, Key: []byte(e.product), Value: v}
	if e.noKey {
		r.Key = nil
	}
	if e.misroute {
		r.Headers = []kgo.RecordHeader{{Key: "to", Value: []byte{byte(e.to)}}}
	}
	return r
}

// headerPartitioner sends a record with a "to" header to the partition it
// names, others as the Java producer does (murmur2 of the key; sticky for
// an empty key).
type headerPartitioner struct{}

func (headerPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
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

// keyPartition is the partition the Java producer picks for key among n:
// murmur2, as the service's owner rule.
func keyPartition(key string, n int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(key)}, n))
}

// totalsOf sums events per product, as the service must.
func totalsOf(evs ...[]event) map[string]int64 {
	out := map[string]int64{}
	for _, es := range evs {
		for _, e := range es {
			out[e.product] += e.value
		}
	}
	return out
}

// genEvents returns n events over products product-001 … with values in
// [1, 1000] (a few negative), from rng.
func genEvents(rng *rand.Rand, prefix string, products, n int) []event {
	out := make([]event, n)
	for i := range out {
		v := int64(1 + rng.IntN(1000))
		if rng.IntN(20) == 0 {
			v = -v / 10
		}
		out[i] = event{product: fmt.Sprintf("%s%03d", prefix, rng.IntN(products)), value: v}
	}
	return out
}

// produce sends recs and waits for all of them to be acknowledged.
func produce(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing %d records: %v", len(recs), err)
	}
}

// pacedProducer sends events in batches of batch every interval, each batch
// acknowledged before the next one (so it rides out a broker outage: the
// client retries until it is back). Run it in a goroutine; it never calls
// t.Fatal.
type pacedProducer struct {
	cl       *kgo.Client
	topic    string
	events   []event
	batch    int
	interval time.Duration

	sent atomic.Int64 // events acknowledged
	done chan struct{}
	err  error // set before done is closed
}

func startPacedProducer(t *testing.T, cl *kgo.Client, topic string, events []event, batch int, interval time.Duration) *pacedProducer {
	pp := &pacedProducer{cl: cl, topic: topic, events: events, batch: batch, interval: interval, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); <-pp.done })
	go pp.run(ctx)
	return pp
}

func (pp *pacedProducer) run(ctx context.Context) {
	defer close(pp.done)
	tick := time.NewTicker(pp.interval)
	defer tick.Stop()
	for i := 0; i < len(pp.events); i += pp.batch {
		recs := make([]*kgo.Record, 0, pp.batch)
		for _, e := range pp.events[i:min(i+pp.batch, len(pp.events))] {
			recs = append(recs, e.record(pp.topic))
		}
		// Generous: a broker restart takes seconds; the client retries
		// within this time and the idempotent producer never duplicates.
		bctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		err := pp.cl.ProduceSync(bctx, recs...).FirstErr()
		cancel()
		if err != nil {
			pp.err = fmt.Errorf("producing events %d..%d: %w", i, i+len(recs), err)
			return
		}
		pp.sent.Add(int64(len(recs)))
		select {
		case <-ctx.Done():
			pp.err = ctx.Err()
			return
		case <-tick.C:
		}
	}
}

// wait waits up to timeout for the producer to finish and fails the test if
// it did not, or failed.
func (pp *pacedProducer) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-pp.done:
	case <-time.After(timeout):
		t.Fatalf("producer not done after %s (%d of %d events sent)", timeout, pp.sent.Load(), len(pp.events))
	}
	if pp.err != nil {
		t.Fatal(pp.err)
	}
}

func (pp *pacedProducer) finished() bool {
	select {
	case <-pp.done:
		return true
	default:
		return false
	}
}

// topicContent is what readTopic found.
type topicContent struct {
	records []*kgo.Record
	// start and end are each partition's log start and end offsets when
	// the read began; records holds what lay between them.
	start, end map[int32]int64
}

// written is the number of offsets ever written to the topic (the sum of
// the end offsets): without transactions, one per record produced.
func (c topicContent) written() int64 {
	var n int64
	for _, e := range c.end {
		n += e
	}
	return n
}

// readTopic reads every committed record of topic from the log start to the
// last stable offset each partition has now (transaction markers are read
// to pass them, and left out of records).
func readTopic(topic string, timeout time.Duration) (topicContent, error) {
	c := topicContent{start: map[int32]int64{}, end: map[int32]int64{}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...))
	if err != nil {
		return c, err
	}
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	var ends kadm.ListedOffsets
	if err == nil {
		ends, err = adm.ListCommittedOffsets(ctx, topic)
	}
	if err == nil {
		err = ends.Error()
	}
	cl.Close()
	if err != nil {
		return c, fmt.Errorf("listing offsets of %s: %w", topic, err)
	}
	if len(ends[topic]) == 0 {
		return c, fmt.Errorf("topic %s has no partitions", topic)
	}
	from := map[int32]kgo.Offset{}
	pending := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		s := starts[topic][o.Partition].Offset
		c.start[o.Partition], c.end[o.Partition] = s, o.Offset
		if o.Offset > s {
			from[o.Partition] = kgo.NewOffset().At(s)
			pending[o.Partition] = o.Offset
		}
	})
	if len(pending) == 0 {
		return c, nil
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return c, err
	}
	defer cons.Close()
	for len(pending) > 0 {
		fetches := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			return c, fmt.Errorf("reading %s: %w (partitions not read to their end: %v)", topic, ctx.Err(), pending)
		}
		if err := fetches.Err(); err != nil {
			return c, fmt.Errorf("reading %s: %w", topic, err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			end, ok := pending[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			if r.Offset+1 >= end {
				delete(pending, r.Partition)
			}
			if !r.Attrs.IsControl() {
				c.records = append(c.records, r)
			}
		})
	}
	return c, nil
}

// latestTotals folds a changelog: the latest value of each key (records of
// a key are in one partition, in offset order); a null value deletes it.
func latestTotals(recs []*kgo.Record) (map[string]int64, error) {
	out := map[string]int64{}
	for _, r := range recs {
		if r.Value == nil {
			delete(out, string(r.Key))
			continue
		}
		if len(r.Value) != 8 {
			return nil, fmt.Errorf("changelog record %s-%d@%d: value has %d bytes, want 8", r.Topic, r.Partition, r.Offset, len(r.Value))
		}
		out[string(r.Key)] = int64(binary.BigEndian.Uint64(r.Value))
	}
	return out, nil
}

// checkChangelog returns nil when the changelog's latest totals equal want
// exactly (no other keys either).
func checkChangelog(topic string, want map[string]int64) error {
	c, err := readTopic(topic, 30*time.Second)
	if err != nil {
		return err
	}
	got, err := latestTotals(c.records)
	if err != nil {
		return err
	}
	return diffTotals("changelog "+topic, got, want)
}

func diffTotals(what string, got, want map[string]int64) error {
	var diffs []string
	for _, p := range sortedKeys(want) {
		if g, ok := got[p]; !ok {
			diffs = append(diffs, p+": missing")
		} else if g != want[p] {
			diffs = append(diffs, fmt.Sprintf("%s: got %d want %d", p, g, want[p]))
		}
	}
	for _, p := range sortedKeys(got) {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: unexpected (%d)", p, got[p]))
		}
	}
	if err := summarize(diffs); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
