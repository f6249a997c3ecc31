package stream

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

func TestStoppingTaskStalledInItsDrainFoldsNothingMore(t *testing.T) {
	// Scenario (at-least-once): a task is stopped with a flush (revoked, SIGTERM) with two batches
	// in its inbox: one of as many products as it keeps changed before it flushes early (maxDirty,
	// lowered to 1,000 here), and one with more events of ten of those products. Draining, the
	// task folds the first batch and flushes early: the cycle is produced, but the store refuses
	// the write (disk full) and the task stalls. The store takes writes again right after. The
	// drain folds nothing more and the stop does not flush: a fold on a store that lacks the
	// stalled cycle counts the ten products without its events, and its write would report input
	// offsets past them. No input offset past what the store holds is reported for commit, and
	// the next owner, reading the input from the offset reported, ends with every event in its
	// store and its changelog.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	const bound = 1000
	l.task.deps.env.knobs.maxDirty = bound
	var writes atomic.Int32
	l.task.deps.env.knobs.StoreWritable = func(int32) error {
		if writes.Add(1) == 1 {
			return fmt.Errorf("%w: no space left on device (injected)", state.ErrUnwritable)
		}
		return nil
	}
	l.running()

	want := map[string]int64{}
	var large, after []*kgo.Record
	for i := 0; len(large) < bound; i++ {
		p := fmt.Sprintf("many-%d", i)
		if sales.Partition([]byte(p), 3) != 0 {
			continue
		}
		want[p] = 1
		large = append(large, &kgo.Record{Topic: l.cfg.InputTopic, Partition: 0, Offset: int64(len(large)),
			Key: []byte(p), Value: fmt.Appendf(nil, `{"product":%q,"value":1}`, p)})
	}
	for i, r := range large[:10] {
		want[string(r.Key)] += 5
		after = append(after, &kgo.Record{Topic: l.cfg.InputTopic, Partition: 0, Offset: int64(bound + i),
			Key: r.Key, Value: fmt.Appendf(nil, `{"product":%q,"value":5}`, r.Key)})
	}
	end := int64(bound + len(after))
	l.task.mail.inbox <- batch{topic: l.cfg.InputTopic, recs: large, hwm: end}
	l.task.mail.inbox <- batch{topic: l.cfg.InputTopic, recs: after, hwm: end}
	if err := l.task.close(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	if writes.Load() == 0 {
		t.Fatal("the drain wrote nothing: the scenario did not flush early")
	}

	from := l.reported()
	if from > 0 {
		t.Errorf("the stop reported input offset %d for commit, past the stalled cycle (offsets 0 to %d) the store does not hold", from, bound-1)
	}
	next := l.successor(t)
	var again []*kgo.Record
	for _, r := range append(append([]*kgo.Record(nil), large...), after...) {
		if r.Offset >= from {
			again = append(again, r)
		}
	}
	if err := next.processBatch(ctx, batch{topic: l.cfg.InputTopic, recs: again, hwm: end}); err != nil {
		t.Fatal(err)
	}
	if err := next.flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkStore(t, next.totals.store.Load(), want)
	got := changelogTotals(t, ctx, l.seed, l.cfg.ChangelogTopic())
	var diffs []string
	for p, v := range want {
		if got[p] != v {
			diffs = append(diffs, fmt.Sprintf("%s = %d, want %d", p, got[p], v))
		}
	}
	if len(diffs) > 0 {
		t.Errorf("changelog: %d of %d products wrong: %v", len(diffs), len(want), diffs[:min(len(diffs), 5)])
	}
	if got := l.reported(); got != end {
		t.Errorf("offset reported for commit %d after the next owner's cycle, want %d", got, end)
	}
}

func TestStopStalledInItsDrainSaysSo(t *testing.T) {
	// Scenario (at-least-once): a task stopped with a flush stalls in its drain (an early flush
	// the store refuses). Stopping -> stalled is an allowed move, the stalled task then closes,
	// and its Closed line says nothing was flushed, not the session's "flushed and committed".
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	core, logs := observer.New(zap.InfoLevel)
	l.task.log = zap.New(core)
	l.task.deps.env.knobs.maxDirty = 10
	l.task.deps.env.knobs.StoreWritable = func(int32) error {
		return fmt.Errorf("%w: no space left on device (injected)", state.ErrUnwritable)
	}
	l.running()
	var recs []*kgo.Record
	for i := 0; len(recs) < 10; i++ {
		p := fmt.Sprintf("p-%d", i)
		if sales.Partition([]byte(p), 3) != 0 {
			continue
		}
		recs = append(recs, &kgo.Record{Topic: l.cfg.InputTopic, Partition: 0, Offset: int64(len(recs)),
			Key: []byte(p), Value: fmt.Appendf(nil, `{"product":%q,"value":1}`, p)})
	}
	l.task.mail.inbox <- batch{topic: l.cfg.InputTopic, recs: recs, hwm: int64(len(recs))}
	if err := l.task.close(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	if got := l.task.State(); got != taskStalled {
		t.Fatalf("after a drain that stalled the task is %s, want stalled", got)
	}
	l.task.setState(taskClosed) // as run does once close returns
	if got := l.task.State(); got != taskClosed {
		t.Errorf("the stalled task did not close: it is %s", got)
	}
	l.task.logClosed("flushed and committed")
	for _, e := range logs.FilterMessageSnippet("Refusing").All() {
		t.Errorf("logged %q", e.Message)
	}
	closed := logs.FilterMessageSnippet("Closed").All()
	if len(closed) != 1 {
		t.Fatalf("%d Closed lines, want 1", len(closed))
	}
	if got := closed[0].Message; !strings.Contains(got, "Closed while stalled") || !strings.Contains(got, "nothing flushed") ||
		strings.Contains(got, "flushed and committed") {
		t.Errorf("the stop of a task stalled in its drain logged %q", got)
	}
}
