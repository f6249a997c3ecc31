//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestWindowsOnApacheKafka: with 1h and 24h windows, events spread over six hours of record
// timestamps (some keyless, some on a partition that does not own them) fold into every window
// of both sizes exactly, in the window changelogs and over HTTP; a restart restores no window
// record and a lost volume rebuilds every window from its changelog.
func TestWindowsOnApacheKafka(t *testing.T) {
	rng, appID, input, notif := begin(t, "windows", 0x77696e64)
	events := harness.GenEvents(rng, "wn", 20, 600)
	harness.Scatter(rng, events, harness.ScalePartitions)
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var recs []*kgo.Record
	for i, e := range events {
		r := e.Record(input)
		r.Timestamp = base.Add(time.Duration(i) * 36 * time.Second)
		recs = append(recs, r)
	}
	// A grace of a day: an event forwarded through the repartition topic
	// arrives after its task's stream time moved on, never past the grace.
	cfg := harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(t.TempDir(), "state"), Input: input, Notif: notif,
		Flags: []string{"--windows.sizes", "1h,24h", "--windows.grace.ms", "86400000"}}
	svc := startService(t, cfg)
	svc.WaitRestored(t, 90*time.Second)
	harness.Produce(t, newClient(t, kgo.RecordPartitioner(harness.HeaderPartitioner{})), recs...)
	svc.WaitTotals(t, harness.TotalsOf(events), 90*time.Second)

	in, err := harness.ReadTopic(bootstrap, input, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sizes := []time.Duration{time.Hour, 24 * time.Hour}
	truth := map[time.Duration]map[string]int64{}
	for _, size := range sizes {
		truth[size] = harness.WindowTruth(in.Records, size)
		topic := sales.ChangelogTopic(appID, sales.WindowStoreName(sales.StoreName, size))
		harness.WaitFor(t, 30*time.Second, "the "+topic+" windows to be exact", func() error {
			got, err := harness.ReadWindows(bootstrap, topic)
			if err != nil {
				return err
			}
			return harness.DiffTotals("window changelog "+topic, got, truth[size])
		})
	}
	if n := len(truth[time.Hour]); n < 100 {
		t.Fatalf("only %d hourly windows: the events did not spread over the hours", n)
	}
	// Over HTTP from the owner or forwarded: every hourly window of a few products.
	checkHTTP := func(svc *harness.Service) {
		t.Helper()
		checkWindowsHTTP(t, svc, "wn", base, truth[time.Hour])
	}
	checkHTTP(svc)
	svc.Terminate(t)

	stores := []string{sales.WindowStoreName(sales.StoreName, time.Hour), sales.WindowStoreName(sales.StoreName, 24*time.Hour)}
	lines := harness.ScalePartitions * (1 + len(sizes))
	svc = startService(t, cfg)
	svc.WaitReady(t, 90*time.Second)
	if sum := svc.RestoredTasks(t, lines); sum.Total != 0 {
		t.Fatalf("restart on the same volume restored %v, want 0 records in every store", sum.ByStore)
	}
	checkHTTP(svc)
	svc.Terminate(t)

	if err := os.RemoveAll(cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	svc = startService(t, cfg)
	svc.WaitReady(t, 90*time.Second)
	sum := svc.RestoredTasks(t, lines)
	for _, s := range stores {
		if sum.ByStore[s] == 0 {
			t.Fatalf("a lost volume restored %v: nothing of %s", sum.ByStore, s)
		}
	}
	checkHTTP(svc)
	svc.WaitTotals(t, harness.TotalsOf(events), 30*time.Second)
	svc.Terminate(t)
}

// checkWindowsHTTP checks the 1h windows of products <prefix>000 to <prefix>002 over six hours
// from base, read from svc's HTTP, against truth ("product@start" -> total): the same windows,
// each exact.
func checkWindowsHTTP(t *testing.T, svc *harness.Service, prefix string, base time.Time, truth map[string]int64) {
	t.Helper()
	for i := range 3 {
		p := fmt.Sprintf("%s%03d", prefix, i)
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
				t.Fatalf("GET %s: window %d = %d, want %d", path, w.Start, w.Total, tw)
			}
		}
	}
}

// TestWindowsInStreamsGroup: under group.protocol streams an event is forwarded as its amount
// alone (Kafka Streams' repartition format), so the forwarder reads its windows.time.field and
// sends it in a header. Events whose JSON time differs from their record timestamp
// (some keyless, some on a partition that does not own them) fold into the hourly windows by
// their JSON time, exactly, in the window changelog; the totals are exact and events were
// forwarded.
func TestWindowsInStreamsGroup(t *testing.T) {
	rng, appID, input, notif := begin(t, "winsg", 0x77696e73)
	events := harness.GenEvents(rng, "ws", 20, 400)
	harness.Scatter(rng, events, harness.ScalePartitions)
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var recs, truthRecs []*kgo.Record
	for i, e := range events {
		at := base.Add(time.Duration(i) * 36 * time.Second)
		r := e.Record(input)
		r.Value = fmt.Appendf(nil, `{"product":%q,"value":%d,"ts":%d}`, e.Product, e.Value, at.UnixMilli())
		recs = append(recs, r)
		truthRecs = append(truthRecs, &kgo.Record{Key: r.Key, Value: r.Value, Timestamp: at})
	}
	svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(t.TempDir(), "state"), Input: input, Notif: notif,
		Flags: []string{"--group.protocol", "streams", "--windows.sizes", "1h", "--windows.time.field", "ts", "--windows.grace.ms", "86400000"}})
	svc.WaitRestored(t, 90*time.Second)
	harness.Produce(t, newClient(t, kgo.RecordPartitioner(harness.HeaderPartitioner{})), recs...)
	svc.WaitTotals(t, harness.TotalsOf(events), 90*time.Second)

	truth := harness.WindowTruth(truthRecs, time.Hour)
	topic := sales.ChangelogTopic(appID, sales.WindowStoreName(sales.StoreName, time.Hour))
	harness.WaitFor(t, 30*time.Second, "the "+topic+" windows to be exact by the events' JSON time", func() error {
		got, err := harness.ReadWindows(bootstrap, topic)
		if err != nil {
			return err
		}
		return harness.DiffTotals("window changelog "+topic, got, truth)
	})
	if c, err := svc.Counters(); err != nil || c.Forwarded == 0 || c.Bad != 0 {
		t.Fatalf("counters %+v, %v: want events forwarded and none bad", c, err)
	}
	svc.Terminate(t)
}
