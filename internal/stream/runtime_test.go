package stream_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestSeedWalkthrough(t *testing.T) {
	// Scenario: first start folds the sample events; a restart restores 0 records; a wiped
	// state dir restores the whole changelog and gives the same totals.
	h := newHarness(t)
	in := h.start(h.cfg)
	in.waitReady()
	if n := in.waitRestored(3); n != 0 {
		t.Fatalf("first start restored %d records", n)
	}
	if got := in.logs.FilterMessageSnippet("did not find checkpoint offset, hence would default to the starting offset at changelog").Len(); got != 3 {
		t.Fatalf("%d 'did not find checkpoint offset' lines, want 3", got)
	}
	// Logged just after the last task's "Finished restoring" line.
	th.WaitFor(t, 10*time.Second, "one 'Restoration took ... for all tasks' line", th.Holds(func() bool {
		return in.logs.FilterMessageSnippet("Restoration took").Len() == 1
	}))
	h.produce(sampleEvents(t)...)
	in.waitTotals(sampleTotals)

	// What a client reads from the topics.
	var clRecords int
	th.WaitFor(t, 10*time.Second, "changelog to hold the totals", th.Holds(func() bool {
		got, n, _ := h.changelog(h.cfg)
		clRecords = n
		for p, w := range sampleTotals {
			if got[p] != w {
				return false
			}
		}
		return len(got) == len(sampleTotals)
	}))
	notes, _ := h.notifications(h.cfg)
	for p, w := range sampleTotals {
		if w >= h.cfg.NotificationThreshold && notes[p] != w {
			t.Errorf("last notification of %s = %d, want %d", p, notes[p], w)
		}
	}
	if len(notes) != len(sampleTotals) { // every sample product ends above 2000
		t.Errorf("notifications for %d products, want %d", len(notes), len(sampleTotals))
	}
	if err := in.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// Restart on the intact state dir: nothing to restore.
	in = h.start(h.cfg)
	in.waitReady()
	if n := in.waitRestored(3); n != 0 {
		t.Fatalf("restart with intact state restored %d records, want 0", n)
	}
	if in.logs.FilterMessageSnippet("did not find checkpoint").Len() != 0 {
		t.Fatal("restart did not find its checkpoint")
	}
	in.waitTotals(sampleTotals)
	if err := in.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// Lose the volume: the whole changelog is restored.
	if err := os.RemoveAll(filepath.Join(h.stateDir, h.cfg.ApplicationID)); err != nil {
		t.Fatal(err)
	}
	in = h.start(h.cfg)
	in.waitReady()
	if n := in.waitRestored(3); n != int64(clRecords) {
		t.Fatalf("restore after wipe: %d records, want the changelog's %d", n, clRecords)
	}
	in.waitTotals(sampleTotals)
}

func TestBadEventsAreSkippedAndCounted(t *testing.T) {
	// Scenario: malformed events between good ones are counted and skipped; the partition keeps flowing.
	h := newHarness(t)
	h.createInput(3)
	in := h.start(h.cfg)
	in.waitReady()
	bad := [][]byte{
		[]byte("not json"), nil, []byte(`[1,2,3]`), []byte(`{"product":"a"}`), []byte(`{"product":"a","value":"10"}`),
		[]byte(`{"product":"a","value":1.5}`), []byte(`{"product":"a","value":null}`), []byte(`{"product":"a","value":123456789012345678901234}`),
		[]byte(`"just a string"`), []byte(`{"value":5,"product":""}`),
	}
	var recs []*kgo.Record
	want := map[string]int64{}
	for i := 0; i < 30; i++ {
		for p := int32(0); p < 3; p++ {
			key := []string{"a", "b", "c"}[p]
			recs = append(recs, event(key, key, 10))
			want[key] += 10
			b := bad[(i+int(p))%len(bad)]
			r := &kgo.Record{Key: []byte(key), Value: b}
			if string(b) == `{"value":5,"product":""}` {
				r.Key = nil // empty key and empty product: no group key
			}
			recs = append(recs, r)
		}
	}
	// Overflow: 2^62 fits; adding 2^62 again would wrap, so both later events are rejected.
	recs = append(recs, event("big", "big", 1<<62), event("big", "big", 1<<62), event("big", "big", 1<<62))
	want["big"] = 1 << 62
	h.produce(recs...)
	in.waitTotals(want)
	if got := in.rt.BadEvents(); got != 92 {
		t.Fatalf("bad events counted: %d, want 92 (90 malformed + 2 overflows)", got)
	}
	if in.logs.FilterMessage("Skipping bad event").Len() == 0 {
		t.Fatal("no bad event logged")
	}
	if logged := in.logs.FilterMessage("Skipping bad event").Len(); logged > 3*6 {
		t.Fatalf("%d bad-event lines: not rate limited", logged)
	}
	// Each line shows the start of the event, quoted.
	for _, e := range in.logs.FilterMessage("Skipping bad event").All() {
		v, ok := e.ContextMap()["value"].(string)
		if !ok || !strings.HasPrefix(v, `"`) {
			t.Fatalf("bad-event line without the event's value: %v", e.ContextMap())
		}
		if _, err := strconv.Unquote(v); err != nil && !strings.HasSuffix(v, "…") {
			t.Fatalf("bad-event value %s is not a quoted snippet: %v", v, err)
		}
	}
	for _, ts := range in.rt.Tasks() {
		if ts.State != "running" {
			t.Fatalf("task %s is %s", ts.Task, ts.State)
		}
	}
}

func TestProductHasOneTotalWhateverItsPartition(t *testing.T) {
	// Scenario: a product's events arrive on every partition (another partitioner, empty keys);
	// it still has one total, kept by the task that owns it, and one changelog partition.
	h := newHarness(t)
	h.createInput(3)
	in := h.start(h.cfg)
	in.waitReady()
	var recs []*kgo.Record
	for i := 0; i < 20; i++ {
		recs = append(recs, eventTo(int32(i%3), "widget", "widget", 100))
		recs = append(recs, eventTo(int32((i+1)%3), "", "gadget", 7))
	}
	h.produce(recs...)
	want := map[string]int64{"widget": 2000, "gadget": 140}
	in.waitTotals(want)
	var forwarded int64
	for _, ts := range in.rt.Tasks() {
		forwarded += ts.Forwarded
	}
	if forwarded == 0 {
		t.Fatal("no event was forwarded to its owner")
	}
	th.WaitFor(t, 10*time.Second, "changelog totals", th.Holds(func() bool {
		got, _, _ := h.changelog(h.cfg)
		return got["widget"] == 2000 && got["gadget"] == 140
	}))
	_, _, parts := h.changelog(h.cfg)
	for p := range want {
		if len(parts[p]) != 1 {
			t.Fatalf("%s written to changelog partitions %v, want one", p, parts[p])
		}
	}
	page, _, err := in.rt.Products("", 10)
	if err != nil || len(page) != 2 {
		t.Fatalf("products %v %v", page, err)
	}
	// Restart: redelivered or not, totals stay exact.
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	in = h.start(h.cfg)
	in.waitReady()
	h.produce(eventTo(2, "", "widget", 1))
	want["widget"] = 2001
	in.waitTotals(want)
}

func TestCheckpointBeyondChangelogEndWipesAndRestores(t *testing.T) {
	// Scenario: a checkpoint the changelog cannot honour (beyond its end) is not trusted:
	// warn, wipe the task, restore from the start, same totals.
	h := newHarness(t)
	h.seedAndStop(t)
	_, clRecords, parts := h.changelog(h.cfg)
	p := int32(-1)
	for _, ps := range parts {
		for q := range ps {
			p = q
		}
	}
	// Forge a checkpoint far beyond the end, and a stale total, in task 0_p.
	path := filepath.Join(h.stateDir, h.cfg.ApplicationID, state.TaskName(p))
	s, err := state.Open(path, zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp, _, _ := s.Checkpoint()
	cp.ChangelogOffset += 1000
	if err := s.Apply([]state.Update{{Product: "product1", Entry: state.Entry{Total: -5}}}, cp); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()

	in := h.start(h.cfg)
	in.waitReady()
	in.waitRestored(3)
	if in.logs.FilterMessageSnippet("is beyond the end offset").Len() != 1 {
		t.Fatal("no warning about the checkpoint beyond the changelog end")
	}
	n, _ := in.restored()
	if n <= 0 || n > int64(clRecords) {
		t.Fatalf("restored %d records, want the changelog partition's records (1..%d)", n, clRecords)
	}
	in.waitTotals(sampleTotals)
	if total, _ := in.total("product1"); total != sampleTotals["product1"] {
		t.Fatalf("stale product1 survived: %d", total)
	}
}

func TestChangelogPartitionMismatchFailsAtStart(t *testing.T) {
	// Scenario: an existing changelog with another partition count is a start-up error naming both counts.
	h := newHarness(t)
	h.createInput(3)
	adm := kadm.NewClient(h.client())
	if _, err := adm.CreateTopic(context.Background(), 2, 1, nil, h.cfg.ChangelogTopic()); err != nil {
		t.Fatal(err)
	}
	in := h.start(h.cfg)
	select {
	case err := <-in.done:
		in.cancel = nil
		in.http.Close()
		_ = in.dir.Close()
		if err == nil || !strings.Contains(err.Error(), "has 2 partitions but input topic sales-events-v1 has 3") {
			t.Fatalf("Run error = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("runtime started despite a mismatched changelog")
	}
}

func TestLongRestoreLogsProgress(t *testing.T) {
	// Scenario: a restore of many records logs progress lines with done, total, rate and ETA,
	// and ends with the exact totals.
	h := newHarness(t)
	h.createInput(1)
	h.createChangelog(1)
	// A changelog as another instance left it: 200,000 updates of 1,000 products.
	var recs []*kgo.Record
	for i := 0; i < 200_000; i++ {
		p := fmt.Sprintf("product%d", i%1000)
		recs = append(recs, &kgo.Record{Topic: h.cfg.ChangelogTopic(), Partition: 0, Key: []byte(p), Value: sales.EncodeTotal(int64(i))})
	}
	h.produce(recs...)
	in := h.startWith(h.cfg, stream.Knobs{RestoreProgressEvery: time.Millisecond})
	if n := in.waitRestored(1); n != 200_000 {
		t.Fatalf("restored %d records, want 200000", n)
	}
	lines := in.logs.FilterMessageSnippet("task [0_0] Restoring changelog").All()
	if len(lines) == 0 {
		t.Fatal("no restore progress line")
	}
	for _, k := range []string{"done", "total", "rate", "eta"} {
		if _, ok := lines[0].ContextMap()[k]; !ok {
			t.Fatalf("progress line lacks %s: %v", k, lines[0].ContextMap())
		}
	}
	in.waitReady()
	in.waitTotals(map[string]int64{"product0": 199_000, "product999": 199_999})
}

func TestBadEventsGoToTheDeadLetterTopic(t *testing.T) {
	// Scenario: with dlq.topic set, every class of bad event reaches the dead-letter topic as read,
	// with headers naming its source and reason; good events around them are all counted.
	h := newHarness(t)
	h.createInput(3)
	cfg := h.cfg
	cfg.DLQTopic = "sales-dead-letters"
	in := h.start(cfg)
	in.waitReady()
	bad := []*kgo.Record{
		{Key: []byte("a"), Value: []byte("not json")},
		{Key: []byte("a"), Value: nil},
		{Key: []byte("a"), Value: []byte(`[1]`)},
		{Key: []byte("a"), Value: []byte(`{"product":"a"}`)},
		{Key: []byte("a"), Value: []byte(`{"product":"a","value":"1"}`)},
		{Key: []byte("a"), Value: []byte(`{"product":"a","value":null}`)},
		{Key: []byte("a"), Value: []byte(`{"product":"a","value":1e400}`)},
		{Key: []byte("a"), Value: []byte(`{"product":"a","value":99999999999999999999}`)},
		{Key: nil, Value: []byte(`{"product":"","value":1}`)},
		{Key: []byte{0xff, 0xfe}, Value: []byte(`{"value":1}`)},
		{Key: []byte("a"), Value: []byte(`{"value":1,"pad":"` + strings.Repeat("x", sales.MaxEventSize) + `"}`)},
		{Key: []byte("a"), Value: []byte(`"a string"`)},
	}
	var recs []*kgo.Record
	for i, b := range bad {
		recs = append(recs, event("a", "a", 1), b)
		b.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte(fmt.Sprint(i))}}
	}
	h.produce(recs...)
	in.waitTotals(map[string]int64{"a": int64(len(bad))})

	var got []*kgo.Record
	cl := h.client(kgo.ConsumeTopics(cfg.DLQTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(got) < len(bad) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	if len(got) != len(bad) {
		t.Fatalf("dead-letter topic holds %d records, want %d", len(got), len(bad))
	}
	seen := map[string]bool{}
	for _, r := range got {
		hd := map[string]string{}
		for _, x := range r.Headers {
			hd[x.Key] = string(x.Value)
		}
		if hd[sales.DLQTopicHeader] != h.cfg.InputTopic || hd[sales.DLQOffsetHeader] == "" || hd[sales.DLQPartitionHeader] == "" ||
			hd[sales.DLQReasonHeader] == "" || hd[sales.DLQErrorHeader] == "" || hd["trace"] == "" {
			t.Fatalf("dead letter lacks headers: %v", hd)
		}
		i, _ := strconv.Atoi(hd["trace"])
		if string(r.Value) != string(bad[i].Value) || string(r.Key) != string(bad[i].Key) {
			t.Fatalf("dead letter %d is not the record as read: %q", i, r.Value)
		}
		seen[hd[sales.DLQReasonHeader]] = true
	}
	if len(seen) < 8 {
		t.Fatalf("only %d distinct reasons: %v", len(seen), seen)
	}
	if n := in.rt.BadEvents(); n != int64(len(bad)) {
		t.Fatalf("bad events counted %d, want %d", n, len(bad))
	}
}

func TestChangelogRecreatedWipesTheStores(t *testing.T) {
	// Scenario: while the service is stopped the changelog topic is deleted and created anew; the
	// checkpoints refer to a topic that is gone, so each task warns, wipes its store and restores
	// from the new changelog: it serves what the changelog holds, never the stale totals.
	h := newHarness(t)
	h.seedAndStop(t)
	adm := kadm.NewClient(h.client())
	if _, err := adm.DeleteTopics(context.Background(), h.cfg.ChangelogTopic()); err != nil {
		t.Fatal(err)
	}
	th.WaitFor(t, 10*time.Second, "the changelog to be gone", th.Holds(func() bool {
		td, err := adm.ListTopics(context.Background(), h.cfg.ChangelogTopic())
		return err == nil && !td.Has(h.cfg.ChangelogTopic())
	}))

	in := h.start(h.cfg) // creates the changelog again, with a new topic id
	in.waitReady()
	if n := in.logs.FilterMessageSnippet("was recreated since the checkpoint was written; wiping the store").Len(); n != 3 {
		t.Fatalf("%d 'recreated' warnings, want one per task (3)", n)
	}
	if total, code := in.total("product1"); code != 404 {
		t.Fatalf("stale total served after the changelog was recreated: %d (http %d)", total, code)
	}
	h.produce(event("product1", "product1", 11))
	in.waitTotals(map[string]int64{"product1": 11})
	th.WaitFor(t, 10*time.Second, "the new changelog to hold the new total", th.Holds(func() bool {
		got, _, _ := h.changelog(h.cfg)
		return got["product1"] == 11 && len(got) == 1
	}))
}

func TestFullRestoreOfManyProductsIsExact(t *testing.T) {
	// Scenario: an empty store restored from a changelog of 40,000 products (a bulk load: sorted,
	// written once into the last level and ingested with the checkpoint) holds the last record of each product, honours
	// tombstones, then processes events, and the next start restores 0 records.
	h := newHarness(t)
	h.createInput(1)
	h.createChangelog(1)
	var recs []*kgo.Record
	cl := func(p string, v []byte) {
		recs = append(recs, &kgo.Record{Topic: h.cfg.ChangelogTopic(), Partition: 0, Key: []byte(p), Value: v})
	}
	for i := range 40_000 {
		cl(fmt.Sprintf("p%d", i), sales.EncodeTotal(int64(i)))
	}
	for i := range 10_000 {
		cl(fmt.Sprintf("p%d", i), sales.EncodeTotal(int64(1_000_000+i)))
	}
	for i := 10_000; i < 11_000; i++ {
		cl(fmt.Sprintf("p%d", i), nil)
	}
	h.produce(recs...)

	in := h.start(h.cfg)
	if n := in.waitRestored(1); n != 51_000 {
		t.Fatalf("restored %d records, want 51000", n)
	}
	in.waitReady()
	if in.logs.FilterMessageSnippet("task [0_0] Bulk-loaded the restored store").Len() != 1 {
		t.Fatal("the restore of an empty store was not a bulk load (no bulk load line)")
	}
	in.waitTotals(map[string]int64{"p0": 1_000_000, "p9999": 1_009_999, "p11000": 11_000, "p39999": 39_999})
	for _, p := range []string{"p10000", "p10999"} {
		if got, code := in.total(p); code != http.StatusNotFound {
			t.Fatalf("%s after its tombstone: total %d, HTTP %d, want 404", p, got, code)
		}
	}
	h.produce(&kgo.Record{Key: []byte("p0"), Value: []byte(`{"product":"p0","value":5}`)},
		&kgo.Record{Key: []byte("p10000"), Value: []byte(`{"product":"p10000","value":7}`)})
	in.waitTotals(map[string]int64{"p0": 1_000_005, "p10000": 7})
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}

	in = h.start(h.cfg)
	if n := in.waitRestored(1); n != 0 {
		t.Fatalf("restart with the state intact restored %d records, want 0", n)
	}
	in.waitReady()
	in.waitTotals(map[string]int64{"p0": 1_000_005, "p10000": 7, "p39999": 39_999})
}

// createChangelog creates the changelog topic, compacted, with n partitions,
// as another instance would have left it.
func (h *harness) createChangelog(n int32) {
	h.t.Helper()
	adm := kadm.NewClient(h.client())
	compact := "compact"
	if _, err := adm.CreateTopic(context.Background(), n, 1, map[string]*string{"cleanup.policy": &compact}, h.cfg.ChangelogTopic()); err != nil {
		h.t.Fatal(err)
	}
}
