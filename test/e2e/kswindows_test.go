//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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
	base := pastEventTimes(18 * time.Hour)
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
	// Restored from the reference's changelog, answered over HTTP.
	checkWindowsHTTP(t, svc, "kw", base, harness.WindowTruth(sent, time.Hour))
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

// TestFinalWindowsMatchKafkaStreams: with windows.notify final, salesagg writes each 1h window's
// final total once its task's stream time closes it, as the Kafka Streams reference does with
// suppress(untilWindowCloses) (--windows-notify final). Both read the same input, exactly
// once, in their own application: six hours of keyed events, some later than their window's
// end plus the 10-minute grace (left out of the window) and some late within it (folded). The
// two notification topics hold the same finals, record by record, and those are the truth
// computed from the input.
func TestFinalWindowsMatchKafkaStreams(t *testing.T) {
	buildReference(t)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 29))
	t.Logf("seed %d", seed)
	appKS, input, notifKS := testNames("ksf")
	appSA, _, notifSA := testNames("saf")
	createTopic(t, input, 3, nil)
	createTopic(t, notifKS, 3, nil)
	createTopic(t, notifSA, 3, nil)
	const (
		size      = time.Hour
		grace     = 10 * time.Minute
		threshold = 4000
	)
	base := pastEventTimes(6 * time.Hour)
	// Keyed events only, each in its product's partition, so that both fold a partition's
	// events in the order they were sent and agree on what is late.
	var recs []*kgo.Record
	late := 0
	evs := harness.GenEvents(rng, "kf", 10, 600)
	for i, e := range evs {
		r := e.Record(input)
		ts := base.Add(time.Duration(i) * 36 * time.Second)
		if rng.IntN(10) == 0 {
			ts = ts.Add(-time.Duration(5+rng.IntN(100)) * time.Minute) // late: some within grace, some past it
			late++
		}
		r.Timestamp = ts
		recs = append(recs, r)
	}
	want := finalsTruth(recs, size, grace, threshold)
	if len(want) < 10 {
		t.Fatalf("the input closes only %d windows at or above %d; the test needs more", len(want), threshold)
	}
	t.Logf("%d events (%d sent late), %d finals expected", len(recs), late, len(want))

	dir := t.TempDir()
	ref := startReference(t, appKS, filepath.Join(dir, "reference"), input, notifKS, "--processing-guarantee", "exactly_once_v2",
		"--windows", "1h", "--windows-grace-ms", strconv.FormatInt(grace.Milliseconds(), 10), "--windows-notify", "final",
		"--threshold", strconv.Itoa(threshold))
	svc := startService(t, harness.ServiceConfig{AppID: appSA, StateDir: filepath.Join(dir, "salesagg"), Input: input, Notif: notifSA,
		Flags: []string{"--processing.guarantee", "exactly_once_v2", "--windows.sizes", "1h", "--windows.grace.ms", strconv.FormatInt(grace.Milliseconds(), 10),
			"--windows.notify", "final", "--notification.threshold", strconv.Itoa(threshold)}})
	ref.waitRunning(t, 3*time.Minute)
	svc.WaitReady(t, 2*time.Minute)
	harness.Produce(t, newClient(t), recs...)

	for _, s := range []struct{ who, topic, group string }{{"salesagg", notifSA, appSA}, {"the reference", notifKS, appKS}} {
		harness.WaitFor(t, 3*time.Minute, s.who+"'s finals in "+s.topic, func() error {
			got, err := readFinals(s.topic)
			if err != nil {
				return err
			}
			return diffFinals(got, want)
		})
		// Every event committed, and still no other final.
		harness.WaitFor(t, time.Minute, s.who+" to commit the whole input", func() error {
			return committedAll(t, s.group, input, int64(len(recs)))
		})
		got, err := readFinals(s.topic)
		if err == nil {
			err = diffFinals(got, want)
		}
		if err != nil {
			t.Fatalf("%s's finals once the input is committed: %v", s.who, err)
		}
	}
	ref.terminate(t)
	svc.Terminate(t)
}

// finalsTruth returns the final notifications a system must write for recs, keyed records in
// their product's partition folded in order: per partition, stream time is the latest record
// timestamp; a record of a window whose end plus grace is at or before the stream time is left
// out; a window is final once its end plus grace is at or before its partition's last stream
// time, notified when its total is at least threshold. Key "product@start" -> total.
func finalsTruth(recs []*kgo.Record, size, grace time.Duration, threshold int64) map[string]int64 {
	sizeMS, graceMS := size.Milliseconds(), grace.Milliseconds()
	streamTime := map[int32]int64{}
	totals := map[string]int64{}
	partitionOf := map[string]int32{}
	for _, r := range recs {
		p := sales.Partition(r.Key, 3)
		ts := r.Timestamp.UnixMilli()
		st, ok := streamTime[p]
		if !ok || ts > st {
			st = ts
		}
		streamTime[p] = st
		start := sales.WindowStart(ts, sizeMS)
		if start+sizeMS+graceMS <= st {
			continue
		}
		var e struct{ Value int64 }
		_ = json.Unmarshal(r.Value, &e)
		k := fmt.Sprintf("%s@%d", r.Key, start)
		totals[k] += e.Value
		partitionOf[k] = p
	}
	want := map[string]int64{}
	for k, total := range totals {
		_, s, _ := strings.Cut(k, "@")
		start, _ := strconv.ParseInt(s, 10, 64)
		if start+sizeMS+graceMS <= streamTime[partitionOf[k]] && total >= threshold {
			want[k] = total
		}
	}
	return want
}

// readFinals reads the windowed notifications (header salesagg.window) of topic: each must be
// a final one; "product@start" -> the totals notified, in order.
func readFinals(topic string) (map[string][]int64, error) {
	c, err := readTopic(topic, 30*time.Second)
	if err != nil {
		return nil, err
	}
	out := map[string][]int64{}
	for _, r := range c.Records {
		windowed := false
		for _, h := range r.Headers {
			windowed = windowed || (h.Key == sales.WindowHeader && string(h.Value) == "1h")
		}
		if !windowed {
			continue
		}
		var n sales.WindowNotification
		if err := json.Unmarshal(r.Value, &n); err != nil || !n.Final || n.Window != "1h" || n.End != n.Start+3_600_000 || n.SKU != string(r.Key) {
			return nil, fmt.Errorf("%s at %d-%d: %q is not a final 1h notification of its key %q (%v)", topic, r.Partition, r.Offset, r.Value, r.Key, err)
		}
		k := fmt.Sprintf("%s@%d", n.SKU, n.Start)
		out[k] = append(out[k], n.Value)
	}
	return out, nil
}

// diffFinals says how got differs from one final per window of want.
func diffFinals(got map[string][]int64, want map[string]int64) error {
	var diffs []string
	for k, w := range want {
		if g := got[k]; len(g) != 1 || g[0] != w {
			diffs = append(diffs, fmt.Sprintf("%s: %v, want [%d]", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: %v, want none", k, g))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return fmt.Errorf("%d of %d finals differ: %s", len(diffs), len(want), strings.Join(diffs[:min(len(diffs), 8)], "; "))
	}
	return nil
}

// committedAll returns nil once group's committed offsets of topic add up to n.
func committedAll(t *testing.T, group, topic string, n int64) error {
	adm := kadm.NewClient(newClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return err
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic {
			sum += o.At
		}
	})
	if sum != n {
		return fmt.Errorf("group %s committed %d of %d offsets of %s", group, sum, n, topic)
	}
	return nil
}

// pastEventTimes returns the start of span hours of event times, on an hour, that end
// at least an hour before now. Both bounds are the broker's and Kafka Streams': a
// record more than log.message.timestamp.after.max.ms (an hour by default) ahead
// of the broker's clock is refused with INVALID_TIMESTAMP, and Kafka Streams creates
// its window changelogs compact,delete with a retention of the store's plus a day, so
// the broker would delete records of event times older than that.
func pastEventTimes(span time.Duration) time.Time {
	return time.Now().Add(-span - time.Hour).Truncate(time.Hour)
}
