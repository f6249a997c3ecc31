package stream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestReplacedTaskFoldsAgainFromTheCommittedOffsets(t *testing.T) {
	// Scenario: at-least-once, the tasks have folded events but committed nothing yet (a long
	// commit interval) when the group's next assignment reports the partitions this member holds
	// as newly added (as a second rebalance did in a benchmark run), so the tasks are replaced and
	// their uncommitted work dropped. The new tasks fold again from the committed offsets: once
	// they commit, every total is exact. Before, they went on from the client's position, past
	// what the dropped tasks had folded: those events were lost for good.
	cfg := config.Default()
	cfg.ApplicationID = "replace"
	cfg.ProcessingGuarantee = config.AtLeastOnce
	cfg.CommitInterval = 3 * time.Second
	cfg.CommitIdle = 0
	cfg.StateDir = t.TempDir()
	cfg.HTTPAddr = "127.0.0.1:0"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, cfg.InputTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg.BootstrapServers = c.ListenAddrs()
	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	rt := New(cfg, zaptest.NewLogger(t), dir, Knobs{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	th.WaitFor(t, 30*time.Second, "readiness", th.Holds(func() bool { ok, _ := rt.Ready(); return ok }))

	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.BootstrapServers...), kgo.DefaultProduceTopic(cfg.InputTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	want := map[string]int64{}
	var recs []*kgo.Record
	for i := range 300 {
		p := fmt.Sprintf("r%d", i%30)
		want[p] += int64(i%7 + 1)
		recs = append(recs, &kgo.Record{Key: []byte(p), Value: fmt.Appendf(nil, `{"product":%q,"value":%d}`, p, i%7+1)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	th.WaitFor(t, 30*time.Second, "the tasks to fold every event", th.Holds(func() bool {
		var n int64
		for _, ts := range rt.Tasks() {
			n += ts.Processed
		}
		return n == int64(len(recs))
	}))
	if _, ok, _ := rt.Total("r0"); ok {
		t.Fatal("a total was committed before the replacement: the scenario needs uncommitted work")
	}

	s := rt.current.Load()
	s.proto.(classicGroup).assigned(ctx, s.kc(), map[string][]int32{cfg.InputTopic: {0, 1, 2}, cfg.RepartitionTopic(): {0, 1, 2}})
	th.WaitFor(t, 60*time.Second, "exact totals from the new tasks", func() error {
		for p, w := range want {
			if got, _, err := rt.Total(p); err != nil || got != w {
				return fmt.Errorf("%s = %d (%v), want %d", p, got, err, w)
			}
		}
		return nil
	})
}
