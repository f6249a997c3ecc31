package stream

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/salesagg/salesagg/internal/config"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestStableOffsetWaitSeesAFirstPendingCommit(t *testing.T) {
	// Scenario: exactly-once, the previous owner of task 0 commits the first input offset of
	// partition 0 in a transaction whose EndTxn has not come yet (the group has a committed offset
	// of another partition only). Task 0's wait for stable offsets sees partition 0 as unstable
	// and waits, showing it in the task's status, until the transaction commits; then it returns.
	// Before, it asked for all of the group's offsets: the broker lists only partitions that have
	// a committed offset, so partition 0 was missing from the answer, looked stable, and the
	// restore read the changelog end below the open transaction.
	cfg := config.Default()
	cfg.ApplicationID = "stable"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, cfg.InputTopic, cfg.RepartitionTopic()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The group exists with a committed offset of input partition 1.
	var committed kadm.Offsets
	committed.AddOffset(cfg.InputTopic, 1, 3, -1)
	if err := adm.CommitAllOffsets(ctx, cfg.ApplicationID, committed); err != nil {
		t.Fatal(err)
	}
	// The previous owner's transaction commits input partition 0's first
	// offset and has not ended.
	txn, err := th.OpenTxnOffsetCommit(ctx, cl, cfg.ApplicationID+"-previous-owner", time.Minute, cfg.ApplicationID, cfg.InputTopic, c.TopicInfo(cfg.InputTopic).TopicID, 0, 5)
	if err != nil {
		t.Fatal(err)
	}

	e := &env{cfg: cfg, log: zaptest.NewLogger(t), admin: adm, metrics: newInstruments(cfg.ProcessingGuarantee)}
	task := newTask(taskDeps{env: e, topo: topology{partitions: 3}, client: cl}, 0)
	res := make(chan error, 1)
	go func() { res <- task.waitStableOffsets(ctx) }()
	th.WaitFor(t, 30*time.Second, "task 0 to wait for stable offsets", func() error {
		select {
		case err := <-res:
			t.Fatalf("the wait returned (%v) while the first offset commit of partition 0 is pending in an open transaction", err)
		default:
		}
		if w, _, _, _, _ := task.trouble.snapshot(time.Hour); !strings.Contains(w, "stable committed offsets") {
			return fmt.Errorf("waiting for %q", w)
		}
		return nil
	})

	if err := txn.End(ctx, true); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the wait after the transaction committed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end after the transaction committed")
	}
	if w, _, _, _, _ := task.trouble.snapshot(time.Hour); w != "" {
		t.Fatalf("task 0 still shows a wait: %q", w)
	}
	offs, err := adm.FetchOffsets(ctx, cfg.ApplicationID)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(cfg.InputTopic, 0); !ok || o.At != 5 {
		t.Fatalf("committed offset of input partition 0 after the transaction: %+v %v, want 5", o, ok)
	}
}
