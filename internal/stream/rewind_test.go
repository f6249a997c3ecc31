package stream

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

func TestRewoundTaskStoppingFoldsNoOlderBatch(t *testing.T) {
	// Scenario (at-least-once): a task folds 10 events, one of them bad (dead-lettered), and the
	// cycle's produce fails (the broker answers INVALID_RECORD): the task rewinds. A batch the
	// poll loop read before the rewind is still in its inbox when the task is stopped with a
	// flush (revoked, SIGTERM). The stop does not fold it: no input offset past the failed cycle
	// is reported for commit, and the next owner, reading the input from the offset reported,
	// ends with every event in its store and the dead letter written.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	dlq := l.withDeadLetters(t, ctx)
	var failing atomic.Bool
	failProduces(l.cluster, &failing)
	l.running()

	recs, want := ownedEvents(l.cfg.InputTopic, 0, 20, 3)
	failing.Store(true)
	if err := l.task.processBatch(ctx, batch{topic: l.cfg.InputTopic, recs: recs[:10], hwm: 20}); err != nil {
		t.Fatal(err)
	}
	if err := l.task.flush(ctx); err != nil {
		t.Fatal(err)
	}
	l.mustHaveFailed(t)
	failing.Store(false)
	// Dispatched before the rewind, as the poll loop does while the
	// failed cycle is produced.
	l.task.mail.inbox <- batch{topic: l.cfg.InputTopic, recs: recs[10:], hwm: 20}
	if err := l.task.close(ctx, true, nil); err != nil {
		t.Fatal(err)
	}

	from := l.reported()
	if from > 0 {
		t.Errorf("the stop reported input offset %d for commit, past the failed cycle (offsets 0 to 9): its events are never read again", from)
	}
	// The next owner: the store as the stop left it, the input read again
	// from the offset reported (the start when none).
	next := l.successor(t)
	if err := next.processBatch(ctx, batch{topic: l.cfg.InputTopic, recs: recs[max(from, 0):], hwm: 20}); err != nil {
		t.Fatal(err)
	}
	if err := next.flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkStore(t, next.totals.store.Load(), want)
	if got := l.reported(); got != 20 {
		t.Errorf("offset reported for commit %d after the next owner's cycle, want 20", got)
	}
	if got := topicValues(t, ctx, l.seed, dlq, 0); len(got) != 1 || got[0] != string(recs[3].Value) {
		t.Errorf("dead-letter topic holds %q, want the bad event %q once", got, recs[3].Value)
	}
}

func TestRewoundTaskCatchingUpFoldsNoOlderBatch(t *testing.T) {
	// Scenario (at-least-once): the store stops taking writes, so the task stalls with its cycle
	// (10 events, produced) and holds the batches it receives next: one of as many products as
	// the task keeps changed before it flushes early (maxDirty, lowered to 1,000 here), and one
	// more. The store takes writes again while the broker answers INVALID_RECORD: catching up,
	// the task writes its stalled cycle, folds the large batch, and its early flush fails and
	// rewinds. The batch after it, read before the rewind, is not folded: no input offset past
	// the failed cycle is reported, the partition stays paused for the backoff, and once the
	// input is dispatched again from the position the poll loop moved back to, the store holds
	// every event.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	const bound = 1000
	l.task.deps.env.knobs.maxDirty = bound
	var full, failing atomic.Bool
	l.task.deps.env.knobs.StoreWritable = func(int32) error {
		if full.Load() {
			return fmt.Errorf("%w: no space left on device (injected)", state.ErrUnwritable)
		}
		return nil
	}
	failProduces(l.cluster, &failing)
	l.running()

	stalled, want := ownedEvents(l.cfg.InputTopic, 0, 10, -1)
	var large []*kgo.Record
	for i := 0; len(large) < bound; i++ {
		p := fmt.Sprintf("many-%d", i)
		if sales.Partition([]byte(p), 3) != 0 {
			continue
		}
		want[p] = 1
		large = append(large, &kgo.Record{Topic: l.cfg.InputTopic, Partition: 0, Offset: int64(10 + len(large)),
			Key: []byte(p), Value: fmt.Appendf(nil, `{"product":%q,"value":1}`, p)})
	}
	after, more := ownedEvents(l.cfg.InputTopic, 10+bound, 10, -1)
	for p, v := range more {
		want[p] += v
	}
	end := int64(10 + bound + 10)

	full.Store(true)
	if err := l.task.processBatch(ctx, batch{topic: l.cfg.InputTopic, recs: stalled, hwm: end}); err != nil {
		t.Fatal(err)
	}
	if err := l.task.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if s := l.task.State(); s != taskStalled {
		t.Fatalf("task %s with its store refusing writes, want stalled", s)
	}
	for _, recs := range [][]*kgo.Record{large, after} {
		if err := l.task.receive(ctx, batch{topic: l.cfg.InputTopic, recs: recs, hwm: end}); err != nil {
			t.Fatal(err)
		}
	}
	full.Store(false)
	failing.Store(true)
	if err := l.task.retryStalled(ctx); err != nil {
		t.Fatal(err)
	}
	l.mustHaveFailed(t)
	failing.Store(false)
	if err := l.task.flush(ctx); err != nil { // the next commit tick
		t.Fatal(err)
	}

	from := l.reported()
	if from != 10 {
		t.Errorf("input offset %d reported for commit, want 10: the stalled cycle written, nothing past the failed one (offsets 10 to %d)", from, 10+bound-1)
	}
	if paused := l.task.deps.client.PauseFetchPartitions(nil); l.task.retry.resumeAt.IsZero() || !slices.Contains(paused[l.cfg.InputTopic], 0) {
		t.Errorf("paused partitions %v (backoff until %v), want the input's paused for the backoff after the failed cycle", paused, l.task.retry.resumeAt)
	}
	// The poll loop moves the position back and dispatches from there.
	l.task.retry.rewindEpoch.Add(1)
	var again []*kgo.Record
	for _, r := range append(append(append([]*kgo.Record(nil), stalled...), large...), after...) {
		if r.Offset >= from {
			again = append(again, r)
		}
	}
	if err := l.task.receive(ctx, batch{topic: l.cfg.InputTopic, recs: again, hwm: end, epoch: l.task.retry.rewindEpoch.Load()}); err != nil {
		t.Fatal(err)
	}
	if err := l.task.flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkStore(t, l.store, want)
	if got := l.reported(); got != end {
		t.Errorf("offset reported for commit %d after the input was folded again, want %d", got, end)
	}
}

// ownedEvents returns n input events of partition 0 from offset from on, of
// a few products partition 0 owns (the one at offset from+bad, when bad is
// not negative, not JSON), and the totals they make.
func ownedEvents(topic string, from int64, n int, bad int) ([]*kgo.Record, map[string]int64) {
	var products []string
	for i := 0; len(products) < 4; i++ {
		if p := fmt.Sprintf("product%d", i); sales.Partition([]byte(p), 3) == 0 {
			products = append(products, p)
		}
	}
	want := map[string]int64{}
	var recs []*kgo.Record
	for i := range n {
		p := products[i%len(products)]
		r := &kgo.Record{Topic: topic, Partition: 0, Offset: from + int64(i), Key: []byte(p)}
		if i == bad {
			r.Value = []byte("not json")
		} else {
			v := from + int64(i)*10 + 5
			want[p] += v
			r.Value = fmt.Appendf(nil, `{"product":%q,"value":%d}`, p, v)
		}
		recs = append(recs, r)
	}
	return recs, want
}

// failProduces answers INVALID_RECORD to every partition of every produce
// request while on is set.
func failProduces(c *kfake.Cluster, on *atomic.Bool) {
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.InvalidRecord.Code
				sp.BaseOffset, sp.LogStartOffset = -1, -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// withDeadLetters creates a dead-letter topic and configures the task with
// it; it returns its name.
func (l *lone) withDeadLetters(t *testing.T, ctx context.Context) string {
	t.Helper()
	const dlq = "sales-dead-letters"
	cl, err := kgo.NewClient(l.seed...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, dlq); err != nil {
		t.Fatal(err)
	}
	l.cfg.DLQTopic = dlq
	l.task.deps.env.cfg.DLQTopic = dlq
	l.task.deps.topo.dlqPartitions = 3
	return dlq
}

// running moves the task to running, as its restore does.
func (l *lone) running() {
	l.task.setState(taskRestoring)
	l.task.setState(taskRunning)
}

// mustHaveFailed checks that the task's last cycle failed to produce.
func (l *lone) mustHaveFailed(t *testing.T) {
	t.Helper()
	if _, err, _, _, _ := l.task.trouble.snapshot(time.Hour); !strings.Contains(err, kerr.InvalidRecord.Message) {
		t.Fatalf("the cycle did not fail to produce as set up: the task's trouble is %q", err)
	}
}

// reported is the input offset the task last reported for commit (-1:
// none).
func (l *lone) reported() int64 {
	l.com.mu.Lock()
	defer l.com.mu.Unlock()
	if eo, ok := l.com.pending[l.cfg.InputTopic][0]; ok {
		return eo.Offset
	}
	return -1
}

// successor is the task's next owner: a task with the same dependencies,
// on the store the task left.
func (l *lone) successor(t *testing.T) *task {
	t.Helper()
	next := newTask(l.task.deps, 0)
	st, err := l.task.deps.env.openStore(0, next.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cp, _, err := st.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	next.totals.cp = cp
	next.totals.store.Store(st)
	next.setState(taskRestoring)
	next.setState(taskRunning)
	return next
}

// checkStore compares the store's totals with want, reporting the first
// few differences and their count.
func checkStore(t *testing.T, st *state.Store, want map[string]int64) {
	t.Helper()
	var diffs []string
	for p, v := range want {
		e, ok, err := st.Get(p)
		if err != nil {
			t.Fatal(err)
		}
		if !ok || e.Total != v {
			diffs = append(diffs, fmt.Sprintf("%s = %d (found %v), want %d", p, e.Total, ok, v))
		}
	}
	if len(diffs) > 0 {
		t.Errorf("store: %d of %d products wrong: %s", len(diffs), len(want), strings.Join(diffs[:min(len(diffs), 5)], "; "))
	}
}

// topicValues reads partition p of topic: the values of its records.
func topicValues(t *testing.T, ctx context.Context, client []kgo.Opt, topic string, p int32) []string {
	t.Helper()
	cl, err := kgo.NewClient(client...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := changelog.Ends(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if err := changelog.Scan(ctx, client, topic, p, 0, ends[p], func(r *kgo.Record) { out = append(out, string(r.Value)) }); err != nil {
		t.Fatal(err)
	}
	return out
}
