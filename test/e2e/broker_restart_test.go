//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// TestBrokerRestartWhileEventsFlow: events keep flowing while the broker is stopped for 5 s and started again; the service rides it out without exiting, /readyz returns to 200 and the totals are exact.
func TestBrokerRestartWhileEventsFlow(t *testing.T) {
	requireOwnBroker(t)
	rng, appID, input, notif := begin(t, "brk", 3)
	events := harness.GenEvents(rng, "bp", 30, 6000)
	want := harness.TotalsOf(events)

	svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(t.TempDir(), "state"), Input: input, Notif: notif, CommitMs: 500})
	svc.WaitRestored(t, 90*time.Second)
	// Whatever happens here, the next tests need the broker.
	t.Cleanup(func() {
		if out, err := kafka.Run(3*time.Minute, "start"); err != nil {
			t.Errorf("kafka.sh start (cleanup): %v\n%s", err, out)
		}
	})

	// The producer's client retries through the outage; each batch waits
	// for its acknowledgement (idempotent: no duplicates after retries).
	pp := harness.NewProducer(newClient(t), input, events).Start(t, 30, 100*time.Millisecond)
	harness.WaitFor(t, 60*time.Second, "1,500 events sent before the broker stops", func() error {
		if n := pp.Sent(); n < 1500 {
			return fmt.Errorf("%d events sent", n)
		}
		return nil
	})

	t0 := time.Now()
	if out, err := kafka.Run(2*time.Minute, "stop"); err != nil {
		t.Fatalf("kafka.sh stop: %v\n%s", err, out)
	}
	t.Logf("broker stopped in %s; producer at %d/%d", time.Since(t0).Round(time.Millisecond), pp.Sent(), len(events))
	// The outage itself: the broker stays down this long.
	select {
	case <-time.After(5 * time.Second):
	case <-svc.Done():
		t.Fatalf("%s exited while the broker was down (%s)", svc.Name, svc.DescribeExit())
	}
	_, err := svc.GetJSON("/readyz", nil)
	t.Logf("5 s into the outage: %s alive; /readyz: %v", svc.Name, errString(err))
	t0 = time.Now()
	if out, err := kafka.Run(3*time.Minute, "start"); err != nil {
		t.Fatalf("kafka.sh start: %v\n%s", err, out)
	}
	t.Logf("broker started again in %s; producer at %d/%d", time.Since(t0).Round(time.Millisecond), pp.Sent(), len(events))

	pp.Wait(t, 5*time.Minute)
	harness.WaitFor(t, 2*time.Minute, "/readyz to return to 200", svc.Ready)
	harness.WaitFor(t, 2*time.Minute, "exact totals over HTTP", func() error { return svc.CheckTotals(want) })
	if err := checkChangelog(harness.ChangelogTopic(appID), want); err != nil {
		t.Error(err)
	}
	if !svc.Alive() {
		t.Fatalf("%s exited (%s)", svc.Name, svc.DescribeExit())
	}
	if c, err := svc.Counters(); err == nil {
		t.Logf("%s: %d events processed, %d redelivered events skipped", svc.Name, c.Processed, c.Duplicates)
	}
	svc.Terminate(t)
}

func errString(err error) string {
	if err == nil {
		return "200 OK"
	}
	return err.Error()
}
