//go:build e2e

package e2e

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// rejoinBound is how soon a restart after SIGKILL must be ready: under the
// 45 s default session timeout a dynamic member would wait out, with room
// for a loaded 2-core machine (a JVM broker beside it).
const rejoinBound = 30 * time.Second

// TestRestartAfterKillNineIsReadyAtOnce: with the default configuration
// (static membership derived from the state dir, 45 s session timeout), a
// service SIGKILLed after it folded events and restarted on the same state
// dir is ready again well before the dead member's session would expire,
// and its totals are exact. The start-to-ready time is logged (README).
func TestRestartAfterKillNineIsReadyAtOnce(t *testing.T) {
	rng, appID, input, notif := begin(t, "rejoin", 0x72656a6e)
	events := harness.GenEvents(rng, "rj", 20, 600)
	cfg := harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(t.TempDir(), "state"), Input: input, Notif: notif}

	svc := startService(t, cfg)
	svc.WaitRestored(t, 90*time.Second)
	var recs []*kgo.Record
	for _, e := range events {
		recs = append(recs, e.Record(input))
	}
	harness.Produce(t, newClient(t), recs...)
	harness.WaitFor(t, 60*time.Second, "the service to fold events", func() error {
		c, err := svc.Counters()
		if err == nil && c.Processed == 0 {
			err = errors.New("nothing processed yet")
		}
		return err
	})
	svc.Kill()

	for round := 1; round <= 3; round++ {
		began := time.Now()
		svc = startService(t, cfg)
		harness.WaitFor(t, 60*time.Second, "the restarted service to be ready", svc.Ready)
		took := time.Since(began)
		t.Logf("restart after SIGKILL #%d: ready in %s", round, took.Round(time.Millisecond))
		if took > rejoinBound {
			t.Errorf("restart #%d was ready after %s, want within %s (static membership replaces the dead member at once)", round, took, rejoinBound)
		}
		if err := harness.Poll(30*time.Second, func() error { return svc.CheckTotals(harness.TotalsOf(events)) }); err != nil {
			t.Fatal(err)
		}
		if round < 3 {
			svc.Kill()
		}
	}
	svc.Terminate(t)
}
