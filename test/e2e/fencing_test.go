//go:build e2e

package e2e

import (
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPausedInstanceIsFenced: exactly-once on Apache Kafka: instance A is paused (SIGSTOP) past its session timeout while B takes its partitions; when A resumes it is fenced and writes nothing that commits: the committed changelog and notifications stay exact.
func TestPausedInstanceIsFenced(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	appID, input, notif := testNames("fence")
	createTopic(t, input, 3, nil)
	cl := newClient(t)
	var all []event
	send := func(n int) {
		t.Helper()
		// Positive values only: a product's committed notifications must then rise strictly.
		evs := genEvents(rng, "fp", 12, n)
		recs := make([]*kgo.Record, len(evs))
		for i, e := range evs {
			if e.value <= 0 {
				evs[i].value = 1 - e.value
			}
			recs[i] = evs[i].record(input)
		}
		produce(t, cl, recs...)
		all = append(all, evs...)
	}
	extra := []string{"--processing.guarantee", "exactly_once_v2", "--session.timeout.ms", "6000"}
	base := serviceConfig{appID: appID, input: input, notif: notif, commitMs: 200, extra: extra}
	cfgA, cfgB := base, base
	cfgA.stateDir = filepath.Join(t.TempDir(), "a")
	cfgB.stateDir = filepath.Join(t.TempDir(), "b")

	a := startService(t, cfgA)
	a.waitReady(t, 90*time.Second)
	send(600)
	waitFor(t, 60*time.Second, "A's totals", func() error { return a.checkTotals(totalsOf(all)) })

	send(300) // A polls some of these into its open transaction, then stops
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	b := startService(t, cfgB)
	b.waitReady(t, 120*time.Second) // after A's session expired
	send(300)
	waitFor(t, 90*time.Second, "B's totals", func() error { return b.checkTotals(totalsOf(all)) })

	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	send(300)
	want := totalsOf(all)
	waitFor(t, 90*time.Second, "exact committed changelog", func() error { return checkChangelog(changelogTopic(appID), want) })
	c, err := readTopic(notif, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	for _, r := range c.records {
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
	t.Logf("%d committed notifications, each product's rising; A alive after resuming: %v", len(c.records), a.alive())
}
