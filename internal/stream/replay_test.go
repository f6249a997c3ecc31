package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/sales"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestRestoreEndsWhenTheLastRecordsVanish(t *testing.T) {
	// Scenario: the records just below the end a restore reads to are ones the restore consumer
	// is never given. (a) An aborted transaction's records, below another producer's transaction
	// that began before it and stays open: the restore waits for that transaction to end (its
	// records could still commit), says so in /v1/tasks, and once it is aborted restores past
	// both. (b) Records compacted away while the restore runs, their keys written again past its
	// end (it reads on to the new end). Either way the restore ends, the task runs, and the
	// totals are the changelog's.
	t.Run("aborted tail below an open transaction", func(t *testing.T) {
		h := newHarness(t)
		h.createInput(3)
		h.seedAndStop(t)
		cl := h.cfg.ChangelogTopic()
		product := productOn("ghost-", 1, 3)
		txn := func(id string) *kgo.Client {
			c := h.client(kgo.TransactionalID(id), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionTimeout(time.Minute))
			if err := c.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			return c
		}
		aborted, open := txn("aborted-writer"), txn("open-writer")
		var recs []*kgo.Record
		for range 5 {
			recs = append(recs, &kgo.Record{Topic: cl, Partition: 1, Key: []byte(product), Value: sales.EncodeTotal(999_999)})
		}
		if err := aborted.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := open.ProduceSync(context.Background(), &kgo.Record{Topic: cl, Partition: 1, Key: []byte(product), Value: sales.EncodeTotal(888_888)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := aborted.EndTransaction(context.Background(), kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
		var ended atomic.Bool
		t.Cleanup(func() {
			if !ended.Load() {
				_ = open.EndTransaction(context.Background(), kgo.TryAbort)
			}
		})

		in := h.start(h.instanceCfg("restorer")) // no local state: a full restore
		began := time.Now()
		th.WaitFor(t, 30*time.Second, "task 0_1 to wait for the open transaction", func() error {
			for _, tk := range in.tasks() {
				if tk.Task == "0_1" && tk.Role == "active" {
					if tk.State == "running" {
						return th.ErrGiveUp
					}
					if strings.Contains(tk.Waiting, "transactions open on changelog") {
						return nil
					}
					return fmt.Errorf("0_1 is %s, waiting for %q", tk.State, tk.Waiting)
				}
			}
			return errors.New("no active task 0_1")
		})
		ended.Store(true)
		if err := open.EndTransaction(context.Background(), kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
		in.waitRestored(3)
		in.waitReady()
		in.waitTotals(sampleTotals)
		if got, _ := in.total(product); got != -1 {
			t.Fatalf("%s = %d: an aborted or uncommitted total was restored", product, got)
		}
		t.Logf("restored past the aborted tail in %s, once the open transaction was aborted", time.Since(began).Round(time.Millisecond))
	})

	t.Run("compacted while restoring", func(t *testing.T) {
		h := newHarness(t)
		h.createInput(3)
		h.seedAndStop(t)
		cl := h.cfg.ChangelogTopic()
		// The restore's first fetch of partition 1 waits until the records
		// before its end were compacted away.
		var hold, held atomic.Bool
		hold.Store(true)
		release := make(chan struct{})
		id := h.cluster.TopicInfo(cl).TopicID
		h.cluster.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			h.cluster.KeepControl()
			req := kreq.(*kmsg.FetchRequest)
			// The restore consumer fetches its one partition alone.
			if !hold.Load() || len(req.Topics) != 1 || len(req.Topics[0].Partitions) != 1 || (req.Topics[0].Topic != cl && req.Topics[0].TopicID != id) {
				return nil, nil, false
			}
			for _, p := range req.Topics[0].Partitions {
				if p.Partition == 1 {
					held.Store(true)
					h.cluster.SleepControl(func() { <-release })
				}
			}
			return nil, nil, false
		})
		in := h.start(h.instanceCfg("restorer"))
		th.WaitFor(t, 30*time.Second, "the restore of 0_1 to fetch", th.Holds(held.Load))
		// Every key of partition 1 is written again past the restore's end,
		// and the old records compacted away.
		totals, _, partitionOf := h.changelog(h.cfg)
		var again []*kgo.Record
		for p, total := range totals {
			if partitionOf[p][1] {
				again = append(again, &kgo.Record{Topic: cl, Partition: 1, Key: []byte(p), Value: sales.EncodeTotal(total)})
			}
		}
		if len(again) == 0 {
			t.Fatal("no product on partition 1")
		}
		pc := h.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err := pc.ProduceSync(context.Background(), again...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		h.cluster.Compact()
		hold.Store(false)
		close(release)
		in.waitRestored(3)
		in.waitReady()
		in.waitTotals(sampleTotals)
		if in.logs.FilterMessageSnippet("task [0_1] Changelog "+cl+"-1 grew while restoring").Len() != 1 {
			t.Fatal("the restore of 0_1 did not read on past the end it started with")
		}
		t.Logf("restore ended past %d records compacted away below its end", len(again))
	})
}
