//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestWindowsMatchKafkaStreams: the Kafka Streams reference with the same 1h and 24h windows
// (windowedBy(TimeWindows.ofSizeAndGrace).aggregate into PRODUCT_AGGREGATED_SALES-<size>) folds
// events spread over six hours; its window changelogs hold every window's exact total as
// salesagg reads them. salesagg then takes the application over, restores every record of
// those changelogs, answers the windows over HTTP and folds six more hours into them; the
// reference takes it back, restores salesagg's records and folds six more. Each changelog holds
// every window's exact total at each step.
func TestWindowsMatchKafkaStreams(t *testing.T) {
	buildReference(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	appID, input, notif := testNames("ksw")
	createTopic(t, input, 3, nil)
	createTopic(t, notif, 3, nil)
	// Event times of the last day: Kafka Streams creates its window changelogs
	// compact,delete with a retention of the store's plus a day, and the
	// broker would delete records of older event times.
	base := time.Now().Add(-20 * time.Hour).Truncate(24 * time.Hour)
	if time.Since(base) > 40*time.Hour {
		base = base.Add(24 * time.Hour)
	}
	var sent []*kgo.Record
	batch := func(from time.Duration) []*kgo.Record {
		evs := harness.GenEvents(rng, "kw", 20, 600)
		var recs []*kgo.Record
		for i, e := range evs {
			// Keyless events are re-keyed by product by both; keyed ones go to
			// their product's partition (Kafka Streams folds a keyed event
			// where it arrives, salesagg where its product lives).
			e.NoKey = rng.IntN(5) == 0
			r := e.Record(input)
			r.Timestamp = base.Add(from + time.Duration(i)*36*time.Second)
			recs = append(recs, r)
		}
		return recs
	}
	cl := newClient(t)
	send := func(recs []*kgo.Record) {
		harness.Produce(t, cl, recs...)
		sent = append(sent, recs...)
	}
	sizes := []time.Duration{time.Hour, 24 * time.Hour}
	topics := map[time.Duration]string{}
	for _, size := range sizes {
		topics[size] = sales.ChangelogTopic(appID, sales.WindowStoreName(sales.StoreName, size))
	}
	// exact waits until every window changelog holds the windows of what was sent.
	exact := func(who string) {
		t.Helper()
		for _, size := range sizes {
			want := harness.WindowTruth(sent, size)
			harness.WaitFor(t, 2*time.Minute, who+"'s "+topics[size]+" to hold every window", func() error {
				got, err := harness.ReadWindows(bootstrap, topics[size])
				if err != nil {
					return err
				}
				return harness.DiffTotals(topics[size], got, want)
			})
		}
	}
	records := func() (n int) {
		t.Helper()
		for _, topic := range []string{sales.ChangelogTopic(appID, sales.StoreName), topics[time.Hour], topics[24*time.Hour]} {
			c, err := readTopic(topic, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			n += len(c.Records)
		}
		return n
	}
	windowArgs := []string{"--windows", "1h,24h", "--windows-grace-ms", "86400000"}
	dir := t.TempDir()

	ref := startReference(t, appID, filepath.Join(dir, "reference-1"), input, notif, windowArgs...)
	ref.waitRunning(t, 3*time.Minute)
	send(batch(0))
	exact("the reference")
	ref.terminate(t)

	n := records()
	svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "salesagg"), Input: input, Notif: notif,
		Flags: []string{"--windows.sizes", "1h,24h", "--windows.grace.ms", "86400000"}})
	sum := svc.WaitRestored(t, 2*time.Minute)
	if sum.Total != int64(n) {
		t.Errorf("salesagg restored %d records %v, want the %d records of the reference's three changelogs", sum.Total, sum.ByStore, n)
	}
	truth := harness.WindowTruth(sent, time.Hour)
	for i := range 3 {
		p := fmt.Sprintf("kw%03d", i)
		var got struct {
			Windows []struct{ Start, Total int64 } `json:"windows"`
		}
		path := fmt.Sprintf("/v1/products/%s/windows?size=1h&from=%d&to=%d", p, base.UnixMilli(), base.Add(6*time.Hour).UnixMilli())
		if code, err := svc.GetJSON(path, &got); err != nil || code != 200 {
			t.Fatalf("GET %s = %d, %v", path, code, err)
		}
		want := 0
		for k := range truth {
			if strings.HasPrefix(k, p+"@") {
				want++
			}
		}
		if len(got.Windows) != want {
			t.Fatalf("GET %s: %d windows, want %d", path, len(got.Windows), want)
		}
		for _, w := range got.Windows {
			if tw := truth[fmt.Sprintf("%s@%d", p, w.Start)]; tw != w.Total {
				t.Fatalf("GET %s: window %d = %d, want %d (restored from the reference's changelog)", path, w.Start, w.Total, tw)
			}
		}
	}
	send(batch(6 * time.Hour))
	exact("salesagg")
	svc.Terminate(t)

	n = records()
	ref = startReference(t, appID, filepath.Join(dir, "reference-2"), input, notif, windowArgs...)
	if restored := ref.waitRunning(t, 3*time.Minute); restored != int64(n) {
		t.Errorf("the reference restored %d records, want the %d records of the three changelogs", restored, n)
	}
	send(batch(12 * time.Hour))
	exact("the reference, again")
	ref.terminate(t)
}
