package stream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	th "github.com/salesagg/salesagg/test/harness"
)

// windowBase is a window boundary of every size the tests use (a UTC
// midnight).
var windowBase = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// at returns an event of product (keyed by it) at windowBase + offset.
func at(product string, value int64, offset time.Duration) *kgo.Record {
	r := event(product, product, value)
	r.Timestamp = windowBase.Add(offset)
	return r
}

// waitWindows waits until product's 1h windows from windowBase to
// windowBase+span read through in's runtime are want.
func (in *instance) waitWindows(product string, span time.Duration, want []state.WindowTotal) {
	in.h.t.Helper()
	var got []state.WindowTotal
	var err error
	th.WaitFor(in.h.t, 30*time.Second, fmt.Sprintf("the 1h windows of %s to be %v", product, want), func() error {
		got, err = in.rt.ProductWindows(product, time.Hour, windowBase.UnixMilli(), windowBase.Add(span).UnixMilli())
		if err != nil || !reflect.DeepEqual(got, want) {
			return fmt.Errorf("got %v, %v", got, err)
		}
		return nil
	})
}

func win(product string, offset time.Duration, total int64) state.WindowTotal {
	return state.WindowTotal{Product: product, Start: windowBase.Add(offset).UnixMilli(), Total: total}
}

// windowChangelog reads the 1h window changelog: the last value per
// window ("product@start"), tombstones as -1.
func (h *harness) windowChangelog(topic string) map[string]int64 {
	h.t.Helper()
	out := map[string]int64{}
	h.readCommitted(topic, func(r *kgo.Record) {
		p, start, err := sales.DecodeWindowKey(r.Key)
		if err != nil {
			h.t.Fatalf("window changelog record at %d: %v", r.Offset, err)
		}
		k := fmt.Sprintf("%s@%s", p, time.UnixMilli(start).UTC().Sub(windowBase))
		if r.Value == nil {
			out[k] = -1
			return
		}
		v, err := sales.DecodeTotal(r.Value)
		if err != nil {
			h.t.Fatalf("window changelog record at %d: %v", r.Offset, err)
		}
		out[k] = v
	})
	return out
}

func TestWindowedTotals(t *testing.T) {
	// Scenario: with 1h windows (grace 10m), events fold into the window of their record
	// timestamp beside the product's total; an event of a window closed by the stream time of its
	// task counts in the total only (late); a restart on the same state dir restores 0 window
	// records, a lost volume rebuilds the windows from their changelog; a stream time 24h past a
	// window's start deletes it, from the store and with a tombstone from the changelog, and a
	// lost volume restored after that holds only the windows kept.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		h.cfg.Windows.Sizes = []string{"1h"}
		h.cfg.Windows.Grace = 10 * time.Minute
		cfg := h.instanceCfg("a")
		in := h.start(cfg)
		in.waitReady()
		const p1, p2 = "wp1", "wp2"
		h.produce(at(p1, 10, 5*time.Minute), at(p1, 20, 50*time.Minute), at(p2, 7, 10*time.Minute))
		h.produce(at(p1, 5, 70*time.Minute))
		in.waitTotals(map[string]int64{p1: 35, p2: 7})
		in.waitWindows(p1, 2*time.Hour, []state.WindowTotal{win(p1, 0, 30), win(p1, time.Hour, 5)})
		in.waitWindows(p2, 2*time.Hour, []state.WindowTotal{win(p2, 0, 7)})
		page, unavailable, err := in.rt.WindowPage(time.Hour, windowBase.UnixMilli(), "", 10)
		if want := []state.Total{{Product: p1, Total: 30}, {Product: p2, Total: 7}}; err != nil || len(unavailable) > 0 || !reflect.DeepEqual(page, want) {
			t.Fatalf("window 0 = %v (unavailable %v), %v; want %v", page, unavailable, err, want)
		}

		// p1's task is at stream time 70m: window 0 closed (end 60m + grace 10m).
		h.produce(at(p1, 100, 30*time.Minute))
		in.waitTotals(map[string]int64{p1: 135, p2: 7})
		th.WaitFor(t, 10*time.Second, "the late event to be counted", th.Holds(func() bool {
			return in.logs.FilterMessageSnippet("Event left out of its window").Len() == 1
		}))
		in.waitWindows(p1, 2*time.Hour, []state.WindowTotal{win(p1, 0, 30), win(p1, time.Hour, 5)})
		var late int64
		for _, ts := range in.rt.Tasks() {
			for _, w := range ts.Windows {
				if w.Size != "1h" || w.StreamTime < 0 && ts.Processed > 0 {
					t.Fatalf("task %s shows window %+v", ts.Task, w)
				}
				late += w.Late
			}
		}
		if late != 1 {
			t.Fatalf("the tasks show %d late events, want 1", late)
		}
		// An unknown size is refused, naming the configured ones.
		if _, err := in.rt.ProductWindows(p1, 24*time.Hour, 0, 1); err == nil {
			t.Fatal("a 24h query answered without 24h windows configured")
		}
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		topic := cfg.WindowChangelogTopic(time.Hour)
		if got, want := h.windowChangelog(topic), map[string]int64{p1 + "@0s": 30, p1 + "@1h0m0s": 5, p2 + "@0s": 7}; !reflect.DeepEqual(got, want) {
			t.Fatalf("window changelog = %v, want %v", got, want)
		}

		// A restart on the same volume restores no window record; a lost volume rebuilds them.
		in = h.start(cfg)
		in.waitReady()
		if n, lines := windowRestored(in, topic); n != 0 || lines != 3 {
			t.Fatalf("restart restored %d window records in %d lines, want 0 in 3", n, lines)
		}
		in.waitWindows(p1, 2*time.Hour, []state.WindowTotal{win(p1, 0, 30), win(p1, time.Hour, 5)})
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(cfg.StateDir); err != nil {
			t.Fatal(err)
		}
		in = h.start(cfg)
		in.waitReady()
		if n, _ := windowRestored(in, topic); n < 3 {
			t.Fatalf("a lost volume restored %d window records, want at least 3", n)
		}
		in.waitWindows(p1, 2*time.Hour, []state.WindowTotal{win(p1, 0, 30), win(p1, time.Hour, 5)})
		in.waitWindows(p2, 2*time.Hour, []state.WindowTotal{win(p2, 0, 7)})
		// The stream time kept: window 0 of p1 is still closed after the rebuild.
		h.produce(at(p1, 1000, 40*time.Minute))
		in.waitTotals(map[string]int64{p1: 1135})
		in.waitWindows(p1, 2*time.Hour, []state.WindowTotal{win(p1, 0, 30), win(p1, time.Hour, 5)})

		// 24h past the start of windows 0 and 1h, p1's task deletes them.
		h.produce(at(p1, 1, 25*time.Hour+30*time.Minute))
		in.waitTotals(map[string]int64{p1: 1136})
		in.waitWindows(p1, 26*time.Hour, []state.WindowTotal{win(p1, 25*time.Hour, 1)})
		in.waitWindows(p2, 2*time.Hour, []state.WindowTotal{win(p2, 0, 7)}) // another task's stream time
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		got := h.windowChangelog(topic)
		if want := map[string]int64{p1 + "@0s": -1, p1 + "@1h0m0s": -1, p1 + "@25h0m0s": 1, p2 + "@0s": 7}; !reflect.DeepEqual(got, want) {
			t.Fatalf("window changelog after expiry = %v, want %v", got, want)
		}

		// A lost volume restores the changelog with the expired windows' records and their
		// tombstones: the expired windows are not in the rebuilt store, the others are.
		if err := os.RemoveAll(cfg.StateDir); err != nil {
			t.Fatal(err)
		}
		in = h.start(cfg)
		in.waitReady()
		in.waitWindows(p1, 26*time.Hour, []state.WindowTotal{win(p1, 25*time.Hour, 1)})
		in.waitWindows(p2, 2*time.Hour, []state.WindowTotal{win(p2, 0, 7)})
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
	})
}

// windowRestored sums the records of the restore lines of the window
// changelog topic.
func windowRestored(in *instance, topic string) (records int64, lines int) {
	for _, e := range in.logs.FilterMessageSnippet("Finished restoring changelog " + topic + "-").All() {
		records += e.ContextMap()["records"].(int64)
		lines++
	}
	return records, lines
}

// getJSON reads GET url into v and returns the status code.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

func TestWindowQueriesFromAnyInstance(t *testing.T) {
	// Scenario: two instances split the tasks; a product's windows are answered by either (the
	// other forwards to the owner), one window's products are gathered from both, and a query
	// for a size that is not configured, without a size, or with an unknown parameter is a 400
	// that says what is wrong.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.Windows.Sizes = []string{"1h"}
	a := h.start(h.instanceCfg("a"))
	a.waitReady()
	b := h.start(h.instanceCfg("b"))
	waitSpread(t, a, b)
	var products []string
	for p := range int32(3) {
		name := productOn("hw", p, 3)
		products = append(products, name)
		h.produce(at(name, int64(p+1)*10, 20*time.Minute), at(name, 1, 90*time.Minute))
	}
	want := map[string]int64{}
	for i, p := range products {
		want[p] = int64(i+1)*10 + 1
	}
	a.waitTotals(want)
	base := windowBase.UnixMilli()
	for _, in := range []*instance{a, b} {
		for i, p := range products {
			var got struct {
				Product string `json:"product"`
				Size    string `json:"size"`
				Windows []struct {
					Start, End, Total int64
				} `json:"windows"`
			}
			url := fmt.Sprintf("%s/v1/products/%s/windows?size=1h&from=%d&to=%d", in.http.URL, p, base, base+2*3_600_000)
			th.WaitFor(t, 10*time.Second, "GET "+url, func() error {
				if code := getJSON(t, url, &got); code != http.StatusOK {
					return fmt.Errorf("answered %d", code)
				}
				if got.Product != p || got.Size != "1h" || len(got.Windows) != 2 || got.Windows[0].Total != int64(i+1)*10 || got.Windows[1].Total != 1 ||
					got.Windows[0].Start != base || got.Windows[0].End != base+3_600_000 || got.Windows[1].Start != base+3_600_000 {
					return fmt.Errorf("answered %+v", got)
				}
				return nil
			})
		}
		var page struct {
			Start, End  int64
			Products    []state.Total `json:"products"`
			Unavailable []string      `json:"unavailable_tasks"`
		}
		url := in.http.URL + "/v1/windows?size=1h&start=" + windowBase.Add(30*time.Minute).Format(time.RFC3339)
		if code := getJSON(t, url, &page); code != http.StatusOK || page.Start != base || page.End != base+3_600_000 || len(page.Products) != 3 || len(page.Unavailable) > 0 {
			t.Fatalf("GET %s = %d %+v", url, code, page)
		}
		for _, pt := range page.Products {
			if pt.Total != want[pt.Product]-1 {
				t.Fatalf("GET %s: %s = %d, want %d", url, pt.Product, pt.Total, want[pt.Product]-1)
			}
		}
		// The window starts, gathered from both instances, paged by from.
		var starts struct {
			Starts []int64 `json:"starts"`
			Next   *int64  `json:"next"`
		}
		url = in.http.URL + "/v1/windows/starts?size=1h&limit=1"
		if code := getJSON(t, url, &starts); code != http.StatusOK || !slices.Equal(starts.Starts, []int64{base}) || starts.Next == nil || *starts.Next != base+1 {
			t.Fatalf("GET %s = %d %+v, want [%d] and next %d", url, code, starts, base, base+1)
		}
		starts.Starts, starts.Next = nil, nil
		url = fmt.Sprintf("%s/v1/windows/starts?size=1h&from=%d", in.http.URL, base+1)
		if code := getJSON(t, url, &starts); code != http.StatusOK || !slices.Equal(starts.Starts, []int64{base + 3_600_000}) || starts.Next != nil {
			t.Fatalf("GET %s = %d %+v, want [%d] and no next", url, code, starts, base+3_600_000)
		}
		var top struct {
			Products []state.Total `json:"products"`
			Sort     string        `json:"sort"`
		}
		url = fmt.Sprintf("%s/v1/windows?size=1h&start=%d&sort=total&limit=2", in.http.URL, base)
		if code := getJSON(t, url, &top); code != http.StatusOK || top.Sort != "total" ||
			!reflect.DeepEqual(top.Products, []state.Total{{Product: products[2], Total: 30}, {Product: products[1], Total: 20}}) {
			t.Fatalf("GET %s = %d %+v", url, code, top)
		}
		for _, c := range []struct{ path, says string }{
			{"/v1/windows?size=1h&sort=total&after=x", "after pages by product"},
			{"/v1/products/" + products[0] + "/windows?size=24h", "windows.sizes: 1h"},
			{"/v1/products/" + products[0] + "/windows", "size is required"},
			{"/v1/products/" + products[0] + "/windows?size=1h&form=1", "unknown query parameter(s) form"},
			{"/v1/products/" + products[0] + "/windows?size=1h&from=10&to=5", "after to"},
			{"/v1/windows?size=1h&limit=0", "limit must be"},
			{"/v1/windows?size=2h", "windows.sizes: 1h"},
			{"/v1/windows/starts?size=1h&start=1", "unknown query parameter(s) start"},
		} {
			var e struct {
				Error string `json:"error"`
			}
			if code := getJSON(t, in.http.URL+c.path, &e); code != http.StatusBadRequest || !strings.Contains(e.Error, c.says) {
				t.Fatalf("GET %s = %d %q, want 400 saying %q", c.path, code, e.Error, c.says)
			}
		}
	}
}

// windowFinals reads the committed windowed notifications of cfg's
// notification topic: "product@offset-from-windowBase" -> values, in order.
func (h *harness) windowFinals(topic string) map[string][]int64 {
	h.t.Helper()
	out := map[string][]int64{}
	h.readCommitted(topic, func(r *kgo.Record) {
		windowed := false
		for _, hd := range r.Headers {
			windowed = windowed || hd.Key == sales.WindowHeader
		}
		if !windowed {
			return
		}
		var n sales.WindowNotification
		if err := json.Unmarshal(r.Value, &n); err != nil || !n.Final {
			h.t.Fatalf("windowed notification %q: %v, want a final one", r.Value, err)
		}
		k := fmt.Sprintf("%s@%s", n.SKU, time.UnixMilli(n.Start).UTC().Sub(windowBase))
		out[k] = append(out[k], n.Value)
	})
	return out
}

func TestFinalWindowNotifications(t *testing.T) {
	// Scenario: with windows.notify final, a window's total is notified once, when its task's
	// stream time closes it (end + grace), and only at or above the threshold; a restart on the
	// same volume and one on a lost volume write no final twice, and close the next window.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		h.cfg.Windows.Sizes = []string{"1h"}
		h.cfg.Windows.Grace = 10 * time.Minute
		h.cfg.Windows.Notify = "final"
		h.cfg.NotificationThreshold = 2000
		cfg := h.instanceCfg("a")
		in := h.start(cfg)
		in.waitReady()
		const p1 = "fp1"
		p2 := productOn("fp", (sales.Partition([]byte(p1), 3)+1)%3, 3)
		h.produce(at(p1, 1500, 5*time.Minute), at(p1, 700, 50*time.Minute), at(p2, 500, 10*time.Minute))
		in.waitTotals(map[string]int64{p1: 2200, p2: 500})
		if got := h.windowFinals(cfg.NotificationTopic); len(got) != 0 {
			t.Fatalf("finals before any window closed: %v", got)
		}
		// 75m: p1's window 0 closed (60m + 10m); p2's task is still at 10m.
		h.produce(at(p1, 100, 75*time.Minute))
		in.waitTotals(map[string]int64{p1: 2300})
		th.WaitFor(t, 10*time.Second, "p1's final of window 0", func() error {
			if got := h.windowFinals(cfg.NotificationTopic); !reflect.DeepEqual(got, map[string][]int64{p1 + "@0s": {2200}}) {
				return fmt.Errorf("finals %v", got)
			}
			return nil
		})
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		in = h.start(cfg)
		in.waitReady()
		h.produce(at(p1, 2000, 80*time.Minute))
		in.waitTotals(map[string]int64{p1: 4300})
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(cfg.StateDir); err != nil {
			t.Fatal(err)
		}
		in = h.start(cfg)
		in.waitReady()
		// 130m closes window 1h (120m + 10m): 100 + 2000.
		h.produce(at(p1, 5, 130*time.Minute))
		in.waitTotals(map[string]int64{p1: 4305})
		th.WaitFor(t, 10*time.Second, "p1's final of window 1h", func() error {
			want := map[string][]int64{p1 + "@0s": {2200}, p1 + "@1h0m0s": {2100}}
			if got := h.windowFinals(cfg.NotificationTopic); !reflect.DeepEqual(got, want) {
				return fmt.Errorf("finals %v, want %v", got, want)
			}
			return nil
		})
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
	})
}

// waitWindowCopiesAtEnd waits until every standby copy on ins has applied
// the window changelog topic up to its committed end.
func (h *harness) waitWindowCopiesAtEnd(topic string, ins ...*instance) {
	h.t.Helper()
	adm := kadm.NewClient(h.client())
	th.WaitFor(h.t, 30*time.Second, "the standby copies at the end of "+topic, func() error {
		ends, err := adm.ListCommittedOffsets(context.Background(), topic)
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			return err
		}
		for _, in := range ins {
			for task, ts := range in.copies() {
				end, ok := ends.Lookup(topic, ts.Partition)
				if !ok || len(ts.Windows) != 1 || ts.Windows[0].Checkpoint != end.Offset {
					return fmt.Errorf("%s's copy of %s shows windows %+v, the changelog ends at %d", in.rt.InstanceID(), task, ts.Windows, end.Offset)
				}
			}
		}
		return nil
	})
}

func TestStandbyCopiesKeepWindows(t *testing.T) {
	// Scenario: with 1h windows and num.standby.replicas=1, each standby copy tails its task's
	// window changelog beside the totals' into the same store. While an owner's HTTP server is
	// down, the other instance answers the owner's products' windows from its copies, marked
	// stale; when the owner stops, the other takes its tasks over and restores no window record
	// (its copies were at the changelog's end), with every window exact.
	h := newHarness(t)
	h.cfg.Windows.Sizes = []string{"1h"}
	_, _, a, b := h.startPairWithStandbys()
	waitSpread(t, a, b)
	want := map[string][]state.WindowTotal{}
	totals := map[string]int64{}
	var first, then []*kgo.Record // a task's stream time passes 1h only after every event of window 0
	for p := range int32(3) {
		for i := range 4 {
			name := productOn(fmt.Sprintf("sw%d-%d-", p, i), p, 3)
			v := int64(i+1) * 10
			first = append(first, at(name, v, 10*time.Minute), at(name, v, 20*time.Minute))
			then = append(then, at(name, 1, 70*time.Minute))
			want[name] = []state.WindowTotal{win(name, 0, 2*v), win(name, time.Hour, 1)}
			totals[name] = 2*v + 1
		}
	}
	h.produce(first...)
	h.produce(then...)
	a.waitTotals(totals)
	topic := h.cfg.WindowChangelogTopic(time.Hour)
	h.waitCopiesAtEnd(a, b)
	h.waitWindowCopiesAtEnd(topic, a, b)

	a.http.Close()
	aTasks := strings.Join(a.runningTasks(), ",")
	base := windowBase.UnixMilli()
	checked := 0
	for p, ws := range want {
		task := a.rt.TaskOf(p)
		if !strings.Contains(aTasks, task) {
			continue
		}
		var got struct {
			Product string `json:"product"`
			Stale   bool   `json:"stale"`
			Windows []struct {
				Start, Total int64
			} `json:"windows"`
		}
		url := fmt.Sprintf("%s/v1/products/%s/windows?size=1h&from=%d&to=%d", b.http.URL, p, base, base+2*3_600_000)
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		served := resp.Header.Get("X-Served-By")
		if err != nil || resp.StatusCode != http.StatusOK || !got.Stale || served != b.rt.InstanceID()+"; task="+task+"; standby" ||
			len(got.Windows) != 2 || got.Windows[0].Total != ws[0].Total || got.Windows[1].Total != ws[1].Total || got.Windows[1].Start != ws[1].Start {
			t.Fatalf("GET %s while A's server is down = %d %+v (%v), X-Served-By %q; want 200 %v from B's standby copy", url, resp.StatusCode, got, err, served, ws)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no product of A's tasks was checked")
	}
	// One window's list, by product and by total: A's tasks read from B's copies, listed stale.
	staleWant := a.runningTasks()
	sort.Strings(staleWant)
	window0 := map[string]int64{}
	for p, ws := range want {
		window0[p] = ws[0].Total
	}
	for _, q := range []string{"limit=100", "sort=total&limit=3"} {
		var page struct {
			Products    []state.Total `json:"products"`
			Stale       []string      `json:"stale_tasks"`
			Unavailable []string      `json:"unavailable_tasks"`
		}
		url := fmt.Sprintf("%s/v1/windows?size=1h&start=%d&%s", b.http.URL, base, q)
		if code := getJSON(t, url, &page); code != http.StatusOK || !slices.Equal(page.Stale, staleWant) || len(page.Unavailable) > 0 {
			t.Fatalf("GET %s while A's server is down = %d, stale %v, unavailable %v; want 200, stale %v", url, code, page.Stale, page.Unavailable, staleWant)
		}
		listed := map[string]int64{}
		for _, e := range page.Products {
			listed[e.Product] = e.Total
		}
		if q == "limit=100" && !maps.Equal(listed, window0) {
			t.Fatalf("GET %s while A's server is down listed %v, want %v", url, listed, window0)
		}
		if q != "limit=100" && !slices.Equal(page.Products, topOf(window0, 3)) {
			t.Fatalf("GET %s while A's server is down = %v, want %v", url, page.Products, topOf(window0, 3))
		}
	}

	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	th.WaitFor(t, 30*time.Second, "B to run all three tasks", th.Holds(func() bool { return len(b.runningTasks()) == 3 }))
	b.waitTotals(totals)
	for p, ws := range want {
		b.waitWindows(p, 2*time.Hour, ws)
	}
	for _, task := range strings.Split(aTasks, ",") {
		p := strings.TrimPrefix(task, "0_")
		lines := b.logs.FilterMessageSnippet(fmt.Sprintf("Finished restoring changelog %s-%s ", topic, p)).All()
		if len(lines) == 0 {
			t.Fatalf("B logged no restore of %s-%s taking %s over", topic, p, task)
		}
		if n := lines[len(lines)-1].ContextMap()["records"].(int64); n != 0 {
			t.Fatalf("B restored %d window records taking %s over from its copy, want 0", n, task)
		}
	}
}

func TestLostVolumeBulkLoadsTheWindows(t *testing.T) {
	// Scenario: with 1h windows, 72,000 windows (6,000 products × 12 hours, about 24,000 per
	// task, past the bulk restore's 20,000) fold into the window changelog; on a lost volume the restart bulk-loads the size's empty key space (it logs
	// "Bulk-loaded the restored store PRODUCT_AGGREGATED_SALES-1h") instead of replaying it in
	// batches, and every window is exact; a restart on that volume restores 0 window records.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.Windows.Sizes = []string{"1h"}
	cfg := h.instanceCfg("a")
	in := h.start(cfg)
	in.waitReady()
	const products, hours = 6000, 12
	var recs []*kgo.Record
	for hr := range hours {
		for p := range products {
			recs = append(recs, at(fmt.Sprintf("bw%04d", p), int64(hr+1), time.Duration(hr)*time.Hour+time.Minute))
		}
	}
	h.produce(recs...)
	totals := map[string]int64{}
	for p := range products {
		totals[fmt.Sprintf("bw%04d", p)] = hours * (hours + 1) / 2
	}
	in.waitTotals(totals)
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	in = h.start(cfg)
	in.waitReady()
	topic := cfg.WindowChangelogTopic(time.Hour)
	if n, _ := windowRestored(in, topic); n < products*hours {
		t.Fatalf("the lost volume restored %d window records, want at least %d", n, products*hours)
	}
	if lines := in.logs.FilterMessageSnippet("Bulk-loaded the restored store PRODUCT_AGGREGATED_SALES-1h").Len(); lines != 3 {
		t.Fatalf("%d tasks bulk-loaded their 1h windows, want 3", lines)
	}
	for _, p := range []string{"bw0000", "bw3049", "bw5999"} {
		want := make([]state.WindowTotal, hours)
		for hr := range hours {
			want[hr] = win(p, time.Duration(hr)*time.Hour, int64(hr+1))
		}
		in.waitWindows(p, hours*time.Hour, want)
	}
	var sum, n int64
	for s := range int64(hours) {
		page, unavailable, err := in.rt.WindowPage(time.Hour, windowBase.Add(time.Duration(s)*time.Hour).UnixMilli(), "", 1000)
		for len(page) > 0 && err == nil {
			for _, e := range page {
				if e.Total != s+1 {
					t.Fatalf("window %dh of %s = %d, want %d", s, e.Product, e.Total, s+1)
				}
				n++
				sum += e.Total
			}
			page, unavailable, err = in.rt.WindowPage(time.Hour, windowBase.Add(time.Duration(s)*time.Hour).UnixMilli(), page[len(page)-1].Product, 1000)
		}
		if err != nil || len(unavailable) > 0 {
			t.Fatalf("window %dh: %v (unavailable %v)", s, err, unavailable)
		}
	}
	if n != products*hours || sum != products*hours*(hours+1)/2 {
		t.Fatalf("the store holds %d windows summing to %d, want %d summing to %d", n, sum, products*hours, products*hours*(hours+1)/2)
	}
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	in = h.start(cfg)
	in.waitReady()
	if restored, lines := windowRestored(in, topic); restored != 0 || lines != 3 {
		t.Fatalf("a restart on the rebuilt volume restored %d window records in %d lines, want 0 in 3", restored, lines)
	}
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
}
