package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestReplacedTaskWaitsForTheCopyItsPredecessorTookOver(t *testing.T) {
	// Scenario: a standby copy holds store 0 here and is slow to close; task 0 starts here, takes
	// the copy over and waits for it; before the copy closed, that task is stopped as replaced
	// (its partitions reported as newly added) and a second task 0 starts. The second task waits
	// for the closing copy too: no quarantine, no failed restore attempt, it restores only what
	// the copy lacked (nothing: the copy was at the changelog end), and every total is exact.
	// Before, the copy was forgotten once its first taker stopped: the second task opened the
	// store at once, Pebble refused the lock held by this process, that was reported as
	// corruption, and the live store was quarantined (on every retry until the copy closed),
	// then restored in full.
	cfg := config.Default()
	cfg.ApplicationID = "handover"
	cfg.ProcessingGuarantee = config.AtLeastOnce
	cfg.CommitInterval = 100 * time.Millisecond
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
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel)).Core()))

	// The copy of task 0, once asked to stop, keeps its store open until
	// release is closed.
	copyHolding, release := make(chan struct{}), make(chan struct{})
	var holdOnce, releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	knobs := Knobs{beforeCopyClose: func(ctx context.Context, p int32) {
		if p != 0 {
			return
		}
		holdOnce.Do(func() { close(copyHolding) })
		select {
		case <-release:
		case <-ctx.Done():
		}
	}}
	rt := New(cfg, log, dir, knobs)
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
		p := fmt.Sprintf("h%d", i%30)
		want[p] += int64(i%7 + 1)
		recs = append(recs, &kgo.Record{Key: []byte(p), Value: fmt.Appendf(nil, `{"product":%q,"value":%d}`, p, i%7+1)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	exact := func() error {
		for p, w := range want {
			if got, _, err := rt.Total(p); err != nil || got != w {
				return fmt.Errorf("%s = %d (%v), want %d", p, got, err, w)
			}
		}
		return nil
	}
	th.WaitFor(t, 30*time.Second, "exact totals", exact)

	// Task 0 is revoked here (flushed, committed) without the group
	// taking its partitions: the next assignment starts it again.
	s := rt.current.Load()
	s.g.revoked(ctx, s.kc(), []int32{0})
	if s.reg.task(0) != nil {
		t.Fatal("task 0 still runs after its revoke")
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, cfg.ChangelogTopic())
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(cfg.ChangelogTopic(), 0)
	if end.Offset <= 0 {
		t.Fatalf("changelog partition 0 ends at %d: the scenario needs records there", end.Offset)
	}

	// A copy of task 0 takes the store and tails the changelog to its end.
	s.reg.mu.Lock()
	sb := newStandby(s.copyDeps(), 0, kindStandby, nil)
	s.reg.mu.standbys[0] = sb
	s.reg.mu.Unlock()
	s.goroutine(func() {
		ctx, cancel := untilClosed(s.workDone)
		defer cancel()
		sb.run(ctx)
	})
	th.WaitFor(t, 30*time.Second, "the copy of task 0 at the changelog end", th.Holds(func() bool {
		return sb.State() == copyTailing && sb.pos.position.Load() == end.Offset
	}))

	// Task 0 starts here and takes the copy over; the copy is slow to close.
	s.proto.(classicGroup).assigned(ctx, s.kc(), map[string][]int32{})
	first := s.reg.task(0)
	if first == nil || first.handover.from != sb {
		t.Fatalf("task 0 = %v did not take the copy over", first)
	}
	<-copyHolding

	// Before the copy closed, the task is replaced: its partitions come
	// back as newly added.
	s.proto.(classicGroup).assigned(ctx, s.kc(), map[string][]int32{cfg.InputTopic: {0}, cfg.RepartitionTopic(): {0}})
	second := s.reg.task(0)
	if second == nil || second == first {
		t.Fatalf("task 0 was not replaced: %v", second)
	}
	th.WaitFor(t, 30*time.Second, "the second task 0 to wait for the copy (or to fail opening its store)", func() error {
		if w, _, _, _, _ := second.trouble.snapshot(time.Hour); strings.Contains(w, "standby copy") {
			return nil
		}
		if n := logs.FilterMessageSnippet("Store is corrupted").Len() + logs.FilterMessageSnippet("task [0_0] Restore failed").Len(); n > 0 {
			return nil
		}
		return errors.New("neither waiting nor failed")
	})
	releaseOnce.Do(func() { close(release) })
	th.WaitFor(t, 30*time.Second, "the second task 0 to run", th.Holds(func() bool { return second.State() == taskRunning }))
	th.WaitFor(t, 30*time.Second, "exact totals after the handover", exact)

	for _, what := range []string{"Store is corrupted", "task [0_0] Restore failed"} {
		for _, e := range logs.FilterMessageSnippet(what).All() {
			t.Errorf("logged %q: %v", e.Message, e.ContextMap()["error"])
		}
	}
	if _, err := os.Stat(filepath.Join(dir.Path(), "quarantine")); err == nil {
		t.Errorf("a store was quarantined: %s exists", filepath.Join(dir.Path(), "quarantine"))
	}
	var restores []int64
	for _, e := range logs.FilterMessageSnippet(fmt.Sprintf("Finished restoring changelog %s-0 ", cfg.ChangelogTopic())).All() {
		restores = append(restores, e.ContextMap()["records"].(int64))
	}
	// The first restore of task 0 (at the start) and the second task's.
	if len(restores) != 2 || restores[1] != 0 {
		t.Errorf("restores of task 0: %v records; want the second to replay nothing (the copy was at offset %d, the end)", restores, end.Offset)
	}
	if got := second.stats.restored.Load(); got != 0 {
		t.Errorf("the second task 0 reports %d records restored, want 0 (the changelog has %d)", got, end.Offset)
	}
}
