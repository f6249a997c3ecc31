//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// seedTotals are the totals sample_events.txt must give.
var seedTotals = map[string]int64{
	"product1": 9200, "product2": 8150, "product3": 7350, "product4": 11700, "product5": 6000,
	"product6": 8750, "product7": 9150, "product8": 12150, "product9": 7550, "product10": 3450,
}

// TestSeedWalkthrough: sample_events.txt gives the documented totals (HTTP, changelog, notifications); a clean restart restores 0 records, a restart without the state dir restores the whole changelog, totals unchanged.
func TestSeedWalkthrough(t *testing.T) {
	appID, input, notif := testNames("seed")
	stateDir := filepath.Join(t.TempDir(), "state")
	cfg := serviceConfig{appID: appID, stateDir: stateDir, input: input, notif: notif}

	// The service creates its topics (input, changelog, repartition,
	// notifications) on a broker that does not auto-create them.
	svc := startService(t, cfg)
	first := svc.waitReady(t, 90*time.Second)
	t.Logf("first start: %s; restored %d records", first.tookLine, first.total)
	if first.total != 0 {
		t.Errorf("first start on an empty changelog restored %d records, want 0", first.total)
	}

	lines := scanLines(t, filepath.Join("..", "..", "sample_events.txt"))
	if len(lines) != 100 {
		t.Errorf("sample_events.txt has %d events, want 100", len(lines))
	}
	recs := make([]*kgo.Record, len(lines))
	for i, kv := range lines {
		recs[i] = &kgo.Record{Topic: input, Key: []byte(kv[0]), Value: []byte(kv[1])}
	}
	produce(t, newClient(t), recs...)
	t.Logf("produced %d sample events to %s", len(recs), input)

	waitFor(t, 60*time.Second, "the seed totals over HTTP", func() error { return svc.checkTotals(seedTotals) })
	cl := changelogTopic(appID)
	waitFor(t, 30*time.Second, "the seed totals in the changelog", func() error { return checkChangelog(cl, seedTotals) })

	// Notifications: {"sku": product, "value": total} keyed by product, each
	// at or above the threshold (2000); every product's final total is
	// above it, so its latest notification carries that total.
	waitFor(t, 30*time.Second, "a notification of each final total", func() error {
		c, err := readTopic(notif, 30*time.Second)
		if err != nil {
			return err
		}
		latest := map[string]int64{}
		for _, r := range c.records {
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
		if err := diffTotals("latest notifications", latest, seedTotals); err != nil {
			return fmt.Errorf("%w (%d notifications read)", err, len(c.records))
		}
		t.Logf("%d notifications read; the latest of each product carries its final total", len(c.records))
		return nil
	})

	// A clean stop checkpoints everything: the next start restores 0.
	svc.terminate(t)
	svc = startService(t, cfg)
	again := svc.waitReady(t, 90*time.Second)
	t.Logf("restart after SIGTERM: %s; restored %d records %v", again.tookLine, again.total, again.partitions)
	if again.total != 0 {
		t.Errorf("restart after a clean stop restored %d records (%v), want 0", again.total, again.partitions)
	}
	if len(again.partitions) != 3 {
		t.Errorf("restart logged \"Finished restoring\" for partitions %v, want 3 partitions", again.partitions)
	}
	waitFor(t, 30*time.Second, "the seed totals over HTTP after the restart", func() error { return svc.checkTotals(seedTotals) })
	svc.terminate(t)

	// Without the state dir, the whole changelog is restored.
	c, err := readTopic(cl, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	inChangelog := int64(len(c.records))
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	svc = startService(t, cfg)
	full := svc.waitReady(t, 90*time.Second)
	t.Logf("restart without state dir: %s; restored %d records %v; the changelog holds %d", full.tookLine, full.total, full.partitions, inChangelog)
	if full.total != inChangelog {
		t.Errorf("restart without the state dir restored %d records (%v), want the %d records of the changelog", full.total, full.partitions, inChangelog)
	}
	waitFor(t, 30*time.Second, "the seed totals over HTTP after a full restore", func() error { return svc.checkTotals(seedTotals) })
	if err := checkChangelog(cl, seedTotals); err != nil {
		t.Error(err)
	}
	svc.terminate(t)
}
