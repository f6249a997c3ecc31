package stream_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestRestoreWaitsForTheChangelogsOpenTransactionsToEnd(t *testing.T) {
	// Scenario (exactly-once): a transaction's markers reach its partitions one at a time, so a
	// restore can find the group's committed offsets stable while the changelog still holds,
	// past its last stable offset, records of the same transaction whose commit marker is on its
	// way (the changelog's leader failing over). Stopping the restore at the last stable offset
	// then resumes the input after events the store never saw: their totals are lost. Here a
	// transactional producer's transaction on the task's changelog partition holds a newer total
	// of p1, and the broker says it is committing (PrepareCommit, as a real cluster does while
	// the marker waits for the partition's new leader; the in-process broker writes its markers
	// at once, so its ListTransactions answer is given here). The restore must wait for it (and
	// say so in /v1/tasks, naming it with its state), and once the marker lands the store holds
	// that total. (An open, undecided transaction is waited for too:
	// TestRestoreEndsWhenTheLastRecordsVanish, TestRestoreWaitsForAnOlderOwnersOpenTransaction.)
	h := newHarness(t)
	cfg, p := h.foldP1AndStop(config.ExactlyOnceV2)

	txn := h.client(kgo.TransactionalID("late-marker"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := context.Background()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: cfg.ChangelogTopic(), Partition: p, Key: []byte("p1"), Value: sales.EncodeTotal(25)}
	if err := txn.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}

	pid, _, err := txn.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var committing atomic.Bool
	committing.Store(true)
	h.cluster.ControlKey(kmsg.ListTransactions.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		if !committing.Load() {
			return nil, nil, false
		}
		resp := req.(*kmsg.ListTransactionsRequest).ResponseKind().(*kmsg.ListTransactionsResponse)
		st := kmsg.NewListTransactionsResponseTransactionState()
		st.TransactionalID, st.ProducerID, st.TransactionState = "late-marker", pid, "PrepareCommit"
		resp.TransactionStates = append(resp.TransactionStates, st)
		return resp, nil, true
	})

	a := h.start(cfg)
	task := fmt.Sprintf("0_%d", p)
	th.WaitFor(t, 30*time.Second, "task "+task+" to wait for the open transaction", func() error {
		for _, tk := range a.tasks() {
			if tk.Task == task && tk.Role == "active" {
				if tk.State == "running" {
					return th.ErrGiveUp
				}
				if strings.Contains(tk.Waiting, "transactions open on changelog") && strings.Contains(tk.Waiting, "late-marker (PrepareCommit, open ") {
					return nil
				}
				return fmt.Errorf("%s is %s, waiting for %q", task, tk.State, tk.Waiting)
			}
		}
		return fmt.Errorf("no active task %s", task)
	})
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	committing.Store(false)
	a.waitReady()
	a.waitTotals(map[string]int64{"p1": 25})
	if _, ok := logTime(a.logs, "transactions ended; restoring to offset"); !ok {
		t.Error("the restore did not say the transactions ended")
	}
	h.produce(event("p1", "p1", 5))
	a.waitTotals(map[string]int64{"p1": 30})
}

func TestRestoreReadsTheEndAgainWhenATransactionEndsWhileItLooks(t *testing.T) {
	// Scenario (exactly-once): a restore reads the changelog's last stable offset while a
	// transaction on the partition is open (its records below the high watermark), and the
	// transaction's commit marker lands before the restore asks the partition's leader which
	// transactions are still open there. The answer is none, but the offset read before it is
	// now short of the committed records: a restore that stops there misses their totals for
	// good, while the input resumes past the events they hold (a torture run lost 47 products'
	// totals so, the marker held back by a killed changelog leader). Here the marker lands while
	// the leader's answer is held: once ready, the store must hold the committed total.
	h := newHarness(t)
	cfg, p := h.foldP1AndStop(config.ExactlyOnceV2)
	// A restart's restore brings the store's checkpoint to the changelog's
	// last stable offset (past the commit marker), so the next restore has
	// nothing to read up to the offset it finds: it reads no record at all
	// unless it finds the end past the transaction below.
	a := h.start(cfg)
	a.waitReady()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}

	txn := h.client(kgo.TransactionalID("marker-while-looking"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := context.Background()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: cfg.ChangelogTopic(), Partition: p, Key: []byte("p1"), Value: sales.EncodeTotal(25)}
	if err := txn.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// The restore's first look at the partition's producers waits until
	// the transaction is committed; then the broker answers as it is.
	asked := make(chan struct{})
	committed := make(chan struct{})
	var once atomic.Bool
	h.cluster.ControlKey(kmsg.DescribeProducers.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		if once.CompareAndSwap(false, true) {
			close(asked)
			h.cluster.SleepControl(func() { <-committed })
		}
		return nil, nil, false
	})

	a = h.start(cfg)
	select {
	case <-asked:
	case <-time.After(30 * time.Second):
		t.Fatal("the restore did not look at the changelog's open transactions")
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	close(committed)
	a.waitReady()
	if got, _ := a.total("p1"); got != 25 {
		t.Fatalf("p1 = %d once ready, want 25: the restore stopped at the last stable offset it read before the commit", got)
	}
	h.produce(event("p1", "p1", 5))
	a.waitTotals(map[string]int64{"p1": 30})
}

func TestRestoreWaitsForAnOlderOwnersOpenTransaction(t *testing.T) {
	// Scenario (exactly-once): an older owner of a task, cut off, left a transaction open on the
	// task's changelog partition; a newer owner then ran the task, committed newer totals past
	// that transaction's first record, and lost the task in turn. The last stable offset stays
	// at the open transaction's first record until the coordinator aborts it, so the newer
	// owner's committed totals are not readable yet: a restore that stopped at the last stable
	// offset would miss them for good while the input resumes after their events (a short
	// torture run lost 47 products' totals so). The restore must wait for the open
	// transaction, name it in /v1/tasks, and once it is aborted restore the newer totals.
	h := newHarness(t)
	cfg, p := h.foldP1AndStop(config.ExactlyOnceV2)

	ctx := context.Background()
	older := h.client(kgo.TransactionalID("older-owner"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := older.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := older.ProduceSync(ctx, &kgo.Record{Topic: cfg.ChangelogTopic(), Partition: p, Key: []byte("p1"), Value: sales.EncodeTotal(99)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var aborted atomic.Bool
	t.Cleanup(func() {
		if !aborted.Load() {
			_ = older.EndTransaction(context.Background(), kgo.TryAbort)
		}
	})
	newer := h.client(kgo.TransactionalID("newer-owner"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := newer.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := newer.ProduceSync(ctx, &kgo.Record{Topic: cfg.ChangelogTopic(), Partition: p, Key: []byte("p1"), Value: sales.EncodeTotal(40)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := newer.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	a := h.start(cfg)
	task := fmt.Sprintf("0_%d", p)
	th.WaitFor(t, 30*time.Second, "task "+task+" to wait for the older owner's transaction", func() error {
		for _, tk := range a.tasks() {
			if tk.Task == task && tk.Role == "active" {
				if tk.State == "running" {
					return th.ErrGiveUp
				}
				if strings.Contains(tk.Waiting, "transactions open on changelog") && strings.Contains(tk.Waiting, "older-owner (Ongoing, open ") {
					return nil
				}
				return fmt.Errorf("%s is %s, waiting for %q", task, tk.State, tk.Waiting)
			}
		}
		return fmt.Errorf("no active task %s", task)
	})
	aborted.Store(true)
	if err := older.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	a.waitReady()
	if got, _ := a.total("p1"); got != 40 {
		t.Fatalf("p1 = %d once ready, want 40: the restore missed the newer owner's committed total", got)
	}
	h.produce(event("p1", "p1", 5))
	a.waitTotals(map[string]int64{"p1": 45})
}
