package stream

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// TestTaskDrivenAlone drives one at-least-once task with nothing but what it
// uses (its config, topology, a client, a committer, a membership check): no
// runtime, no group. It folds a batch, writes nothing while the coordinator
// does not confirm the member, and then writes the cycle it kept: the
// changelog, the store and the offsets reported for commit agree.
func TestTaskDrivenAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	l.refuse.Store(true)

	// Events of products this partition owns, at input offsets 0..n-1.
	want := map[string]int64{}
	var recs []*kgo.Record
	for i := 0; len(recs) < 30; i++ {
		p := fmt.Sprintf("product%d", i%40)
		if sales.Partition([]byte(p), 3) != 0 {
			continue
		}
		v := int64(len(recs)*10 + 5)
		want[p] += v
		recs = append(recs, &kgo.Record{Topic: l.cfg.InputTopic, Partition: 0, Offset: int64(len(recs)),
			Key: []byte(p), Value: fmt.Appendf(nil, `{"product":%q,"value":%d}`, p, v)})
	}
	if err := l.task.processBatch(ctx, batch{topic: l.cfg.InputTopic, recs: recs, hwm: int64(len(recs)), epoch: 0}); err != nil {
		t.Fatal(err)
	}
	if err := l.task.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if l.asked != 1 {
		t.Fatalf("the membership check was asked %d times, want 1", l.asked)
	}
	if got := changelogTotals(t, ctx, l.seed, l.cfg.ChangelogTopic()); len(got) != 0 {
		t.Fatalf("an unconfirmed member wrote the changelog: %v", got)
	}
	if len(l.task.totals.dirty) != len(want) {
		t.Fatalf("the refused cycle kept %d products, want %d", len(l.task.totals.dirty), len(want))
	}

	l.refuse.Store(false)
	l.task.retry.memberUnknownAt = time.Time{} // the once-a-second gate, passed
	if err := l.task.flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := changelogTotals(t, ctx, l.seed, l.cfg.ChangelogTopic())
	for p, v := range want {
		if got[p] != v {
			t.Errorf("changelog %s = %d, want %d", p, got[p], v)
		}
		if en, ok, err := l.store.Get(p); err != nil || !ok || en.Total != v {
			t.Errorf("store %s = %v %v %v, want %d", p, en.Total, ok, err, v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("changelog holds %d products, want %d", len(got), len(want))
	}
	l.com.mu.Lock()
	next := l.com.pending[l.cfg.InputTopic][0].Offset
	l.com.mu.Unlock()
	if next != int64(len(recs)) {
		t.Fatalf("offset reported for commit %d, want %d", next, len(recs))
	}
}

// lone is a task of partition 0 with what it uses and nothing else, on an
// in-process broker; refuse makes its membership check fail.
type lone struct {
	cfg     config.Config
	cluster *kfake.Cluster
	seed    []kgo.Opt
	task    *task
	store   *state.Store
	com     *committer
	refuse  atomic.Bool
	asked   int
}

func newLone(t *testing.T, ctx context.Context) *lone {
	t.Helper()
	l := &lone{}
	cfg := config.Default()
	cfg.ApplicationID = "alone"
	cfg.ProcessingGuarantee = config.AtLeastOnce
	cfg.StateDir = t.TempDir()
	l.cfg = cfg
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(3, cfg.InputTopic, cfg.ChangelogTopic(), cfg.NotificationTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l.cluster = c
	l.seed = []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	cl, err := kgo.NewClient(l.seed...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ids, err := kadm.NewClient(cl).ListTopics(ctx, cfg.InputTopic, cfg.ChangelogTopic())
	if err != nil {
		t.Fatal(err)
	}
	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	log := zaptest.NewLogger(t)
	e := &env{cfg: cfg, log: log, dir: dir, metrics: newInstruments(cfg.ProcessingGuarantee),
		blockCache: state.NewBlockCache(cfg.StoreCacheBytes)}
	t.Cleanup(e.blockCache.Close)
	topo := topology{partitions: 3, notificationPartitions: 3,
		inputID: [16]byte(ids[cfg.InputTopic].ID), changelogID: [16]byte(ids[cfg.ChangelogTopic()].ID)}
	l.com = &committer{kick: make(chan struct{}, 1)}
	l.task = newTask(taskDeps{
		env: e, topo: topo, client: cl, committer: l.com,
		member: func(context.Context) error {
			l.asked++
			if l.refuse.Load() {
				return errNotMember
			}
			return nil
		},
		rewind:   func(*task) {},
		restored: func(*task) {},
		cameFrom: func(int32) string { return "" },
	}, 0)
	if l.store, err = e.openStore(0, log); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.store.Close() })
	l.task.totals.store.Store(l.store)
	return l
}

// changelogTotals reads partition 0 of a changelog: each product's latest
// total.
func changelogTotals(t *testing.T, ctx context.Context, client []kgo.Opt, topic string) map[string]int64 {
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
	out := map[string]int64{}
	err = changelog.Scan(ctx, client, topic, 0, 0, ends[0], func(r *kgo.Record) {
		u, err := changelog.Update(r)
		if err != nil {
			t.Errorf("offset %d: %v", r.Offset, err)
			return
		}
		out[u.Product] = u.Entry.Total
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
