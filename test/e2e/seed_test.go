//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestSeedWalkthrough: sample_events.txt gives the documented totals (HTTP, changelog, notifications); a clean restart restores 0 records, a restart without the state dir restores the whole changelog, totals unchanged.
func TestSeedWalkthrough(t *testing.T) {
	appID, input, notif := testNames("seed")
	stateDir := filepath.Join(t.TempDir(), "state")
	cfg := harness.ServiceConfig{AppID: appID, StateDir: stateDir, Input: input, Notif: notif}

	// The service creates its topics (input, changelog, repartition,
	// notifications) on a broker that does not auto-create them.
	svc := startService(t, cfg)
	first := svc.WaitRestored(t, 90*time.Second)
	t.Logf("first start: %s; restored %d records", first.TookLine, first.Total)
	if first.Total != 0 {
		t.Errorf("first start on an empty changelog restored %d records, want 0", first.Total)
	}

	recs := sampleRecords(t, input)
	if len(recs) != 100 {
		t.Errorf("sample_events.txt has %d events, want 100", len(recs))
	}
	harness.Produce(t, newClient(t), recs...)
	t.Logf("produced %d sample events to %s", len(recs), input)

	harness.WaitFor(t, 60*time.Second, "the seed totals over HTTP", func() error { return svc.CheckTotals(harness.SampleTotals) })
	cl := sales.ChangelogTopic(appID, sales.StoreName)
	harness.WaitFor(t, 30*time.Second, "the seed totals in the changelog", func() error { return checkChangelog(cl, harness.SampleTotals) })

	// Notifications: {"sku": product, "value": total} keyed by product, each
	// at or above the threshold (2000); every product's final total is
	// above it, so its latest notification carries that total.
	harness.WaitFor(t, 30*time.Second, "a notification of each final total", func() error {
		c, err := readTopic(notif, 30*time.Second)
		if err != nil {
			return err
		}
		latest := map[string]int64{}
		for _, r := range c.Records {
			var n struct {
				SKU   *string `json:"sku"`
				Value *int64  `json:"value"`
			}
			if err := json.Unmarshal(r.Value, &n); err != nil || n.SKU == nil || n.Value == nil {
				t.Fatalf("notification %s-%d@%d: value %q is not {\"sku\",\"value\"}: %v", r.Topic, r.Partition, r.Offset, r.Value, err)
			}
			if *n.SKU != string(r.Key) {
				t.Fatalf("notification %s-%d@%d: sku %q but key %q", r.Topic, r.Partition, r.Offset, *n.SKU, r.Key)
			}
			if *n.Value < 2000 {
				t.Fatalf("notification %s-%d@%d: value %d is below the threshold 2000", r.Topic, r.Partition, r.Offset, *n.Value)
			}
			latest[*n.SKU] = *n.Value
		}
		if err := harness.DiffTotals("latest notifications", latest, harness.SampleTotals); err != nil {
			return fmt.Errorf("%w (%d notifications read)", err, len(c.Records))
		}
		t.Logf("%d notifications read; the latest of each product carries its final total", len(c.Records))
		return nil
	})

	// A clean stop checkpoints everything: the next start restores 0.
	svc.Terminate(t)
	svc = startService(t, cfg)
	again := svc.WaitRestored(t, 90*time.Second)
	t.Logf("restart after SIGTERM: %s; restored %d records %v", again.TookLine, again.Total, again.Partitions)
	if again.Total != 0 {
		t.Errorf("restart after a clean stop restored %d records (%v), want 0", again.Total, again.Partitions)
	}
	if len(again.Partitions) != 3 {
		t.Errorf("restart logged \"Finished restoring\" for partitions %v, want 3 partitions", again.Partitions)
	}
	harness.WaitFor(t, 30*time.Second, "the seed totals over HTTP after the restart", func() error { return svc.CheckTotals(harness.SampleTotals) })
	svc.Terminate(t)

	// Without the state dir, the whole changelog is restored.
	c, err := readTopic(cl, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	inChangelog := int64(len(c.Records))
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	svc = startService(t, cfg)
	full := svc.WaitRestored(t, 90*time.Second)
	t.Logf("restart without state dir: %s; restored %d records %v; the changelog holds %d", full.TookLine, full.Total, full.Partitions, inChangelog)
	if full.Total != inChangelog {
		t.Errorf("restart without the state dir restored %d records (%v), want the %d records of the changelog", full.Total, full.Partitions, inChangelog)
	}
	harness.WaitFor(t, 30*time.Second, "the seed totals over HTTP after a full restore", func() error { return svc.CheckTotals(harness.SampleTotals) })
	if err := checkChangelog(cl, harness.SampleTotals); err != nil {
		t.Error(err)
	}
	svc.Terminate(t)
}
