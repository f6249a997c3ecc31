package stream_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestARestoreWaitsForThisProcesssTransactionInFlight(t *testing.T) {
	// Scenario (exactly-once): instance A runs every task. A commit cycle has produced its
	// changelog records and waits for the broker to acknowledge them (the broker holds them)
	// when the group coordinator stops answering A's heartbeats: A's lease lapses and it drops
	// its tasks; then the coordinator answers that a rebalance is in progress, A rejoins and is
	// given the same tasks (nothing revoked, so the transaction goes on and commits). Their
	// restores must wait for the cycle to end: had one read the changelog's end first, the
	// commit would then add records it never restored while the input moved past their events,
	// and the totals would be short for good. Every total, on A and in the changelog, is exact.
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h := harnessOn(t, c, c.ListenAddrs()[0])
	h.createInput(3)
	h.cfg.ProcessingGuarantee = config.ExactlyOnceV2
	h.cfg.SessionTimeout = 6 * time.Second    // the broker's group.min.session.timeout.ms
	h.cfg.TransactionTimeoutSet = time.Minute // the held cycle outlives the test's waits
	cfg := h.instanceCfg("a")
	cfg.GroupInstanceID = "settle-a"
	// The group's and the transaction's coordinators on different brokers, as in production
	// (franz-go sends heartbeats and EndTxn on one connection per broker).
	var txnID string
	for i := range 100 {
		cfg.ApplicationID = fmt.Sprintf("settle-%d", i)
		dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
		if err != nil {
			t.Fatal(err)
		}
		txnID = cfg.ApplicationID + "-" + dir.ProcessID()
		_ = dir.Close()
		if c.CoordinatorFor(cfg.ApplicationID) != c.CoordinatorFor(txnID) {
			break
		}
	}
	if c.CoordinatorFor(cfg.ApplicationID) == c.CoordinatorFor(txnID) {
		t.Fatal("no application id of 100 has its group and transaction coordinators on different brokers")
	}

	a := h.start(cfg)
	a.waitReady()
	want := map[string]int64{}
	produce := func(value int64) {
		var recs []*kgo.Record
		for i := range 30 {
			p := fmt.Sprintf("product%d", i)
			recs = append(recs, event(p, p, value))
			want[p] += value
		}
		h.produce(recs...)
	}
	produce(10)
	a.waitTotals(want)

	// Hold the next transactional produce to the changelog, then A's heartbeats of its
	// generation at the cut, which are answered REBALANCE_IN_PROGRESS once A's lease lapsed.
	var holdTxn, holdHB atomic.Bool
	held := make(chan struct{})
	releaseTxn, lapsed := make(chan struct{}), make(chan struct{})
	var onceTxn, onceLapse sync.Once
	freeTxn := func() { onceTxn.Do(func() { close(releaseTxn) }) }
	endCut := func() { onceLapse.Do(func() { close(lapsed) }) }
	t.Cleanup(freeTxn)
	t.Cleanup(endCut)
	changelogID := c.TopicInfo(cfg.ChangelogTopic()).TopicID
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		if r.TransactionID == nil || *r.TransactionID != txnID || !holdTxn.Load() {
			return nil, nil, false
		}
		for _, tp := range r.Topics {
			if (tp.Topic == cfg.ChangelogTopic() || tp.TopicID == changelogID) && holdTxn.CompareAndSwap(true, false) {
				close(held)
				c.SleepControl(func() { <-releaseTxn })
				break
			}
		}
		return nil, nil, false
	})
	var cutGen atomic.Int32
	cutGen.Store(-1)
	c.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		hb := req.(*kmsg.HeartbeatRequest)
		if hb.InstanceID == nil || *hb.InstanceID != "settle-a" || !holdHB.Load() {
			return nil, nil, false
		}
		cutGen.CompareAndSwap(-1, hb.Generation)
		if hb.Generation != cutGen.Load() {
			return nil, nil, false
		}
		c.SleepControl(func() { <-lapsed })
		resp := hb.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.RebalanceInProgress.Code
		return resp, nil, true
	})
	holdTxn.Store(true)
	produce(1000)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("A produced no changelog record within 30 s of the events")
	}
	holdHB.Store(true)
	var lapsedAt time.Time
	th.WaitFor(t, 30*time.Second, "A's lease to lapse", th.Holds(func() bool {
		var ok bool
		lapsedAt, ok = logTime(a.logs, "No heartbeat answered by the group coordinator")
		return ok
	}))
	endCut()

	// A is given its tasks again. They either wait for the cycle in progress (the fix), or one
	// restores past it; the records are acknowledged after that.
	th.WaitFor(t, 60*time.Second, "A's tasks to wait for the cycle, or one to restore", th.Holds(func() bool {
		if _, waiting := logTime(a.logs, "Waiting for this process's transaction in progress to be decided before restoring"); waiting {
			return true
		}
		for _, e := range a.logs.FilterMessageSnippet("Restored and ready to run").All() {
			if e.Time.After(lapsedAt) {
				return true
			}
		}
		return false
	}))
	freeTxn()

	produce(5)
	a.waitTotals(want)
	got, _, _ := h.changelog(cfg)
	equalTotals(t, "changelog", got, want)
}
