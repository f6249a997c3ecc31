//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// TestPausedInstanceIsFenced: exactly-once on Apache Kafka: instance A is paused (SIGSTOP) past its session timeout while B takes its partitions; when A resumes it is fenced and writes nothing that commits: the committed changelog and notifications stay exact.
func TestPausedInstanceIsFenced(t *testing.T) {
	rng, appID, input, notif := begin(t, "fence", 5)
	cl := newClient(t)
	var all []harness.Event
	send := func(n int) {
		t.Helper()
		// Positive values only: a product's committed notifications must then rise strictly.
		evs := harness.GenEvents(rng, "fp", 12, n)
		recs := make([]*kgo.Record, len(evs))
		for i, e := range evs {
			if e.Value <= 0 {
				evs[i].Value = 1 - e.Value
			}
			recs[i] = evs[i].Record(input)
		}
		harness.Produce(t, cl, recs...)
		all = append(all, evs...)
	}
	extra := []string{"--processing.guarantee", "exactly_once_v2", "--session.timeout.ms", "6000"}
	base := harness.ServiceConfig{AppID: appID, Input: input, Notif: notif, CommitMs: 200, Flags: extra}
	cfgA, cfgB := base, base
	// A commits every 10 s: what it folds sits in its open transaction long
	// enough to pause it there.
	cfgA.CommitMs = 10000
	cfgA.Flags = append(append([]string(nil), extra...), "--transaction.timeout.ms", "60000")
	cfgA.StateDir = filepath.Join(t.TempDir(), "a")
	cfgB.StateDir = filepath.Join(t.TempDir(), "b")

	a := startService(t, cfgA)
	a.WaitRestored(t, 90*time.Second)
	send(600)
	harness.WaitFor(t, 60*time.Second, "A's totals", func() error { return a.CheckTotals(harness.TotalsOf(all)) })

	// A folds these into its open transaction, then stops.
	folded, err := a.Counters()
	if err != nil {
		t.Fatal(err)
	}
	send(300)
	harness.WaitFor(t, 30*time.Second, "A to fold the events into its open transaction", func() error {
		c, err := a.Counters()
		if err != nil {
			return err
		}
		if c.Processed < folded.Processed+300 {
			return fmt.Errorf("A folded %d of 300", c.Processed-folded.Processed)
		}
		return nil
	})
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Signal(syscall.SIGCONT) })
	b := startService(t, cfgB)
	b.WaitRestored(t, 120*time.Second) // after A's session expired
	send(300)
	harness.WaitFor(t, 90*time.Second, "B's totals", func() error { return b.CheckTotals(harness.TotalsOf(all)) })

	resumedAt := len(a.Logs())
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// A learns it lost its tasks and drops them with its open transaction.
	harness.WaitFor(t, 60*time.Second, "the resumed A to drop its lost tasks", func() error {
		for _, e := range a.Logs()[resumedAt:] {
			if strings.Contains(e.Msg(), "Closed: dropped") || strings.Contains(e.Msg(), "Closed: revoked; the open transaction is aborted") {
				return nil
			}
		}
		return errors.New("A has not dropped its tasks yet")
	})
	send(300)
	want := harness.TotalsOf(all)
	harness.WaitFor(t, 90*time.Second, "exact committed changelog", func() error { return checkChangelog(harness.ChangelogTopic(appID), want) })
	c, err := readTopic(notif, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	for _, r := range c.Records {
		var n struct {
			SKU   string `json:"sku"`
			Value int64  `json:"value"`
		}
		if err := json.Unmarshal(r.Value, &n); err != nil {
			t.Fatalf("notification %q: %v", r.Value, err)
		}
		if n.Value <= last[n.SKU] {
			t.Fatalf("committed notifications of %s do not rise (%d after %d): a fenced cycle was committed", n.SKU, n.Value, last[n.SKU])
		}
		last[n.SKU] = n.Value
	}
	t.Logf("%d committed notifications, each product's rising; A alive after resuming: %v", len(c.Records), a.Alive())
}
