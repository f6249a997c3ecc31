//go:build browser

// The status page in a real browser: headless Chromium (Debian's chromium
// package, /usr/bin/chromium, or $CHROMIUM) driven by chromedp over a pipe,
// against a real runtime on the in-process kfake broker. Run with
// `make test-browser`; screenshots go to $SALESAGG_ARTIFACTS (or the test's
// temporary dir) and their paths are logged.
package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/httpapi/streamview"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
	"github.com/salesagg/salesagg/test/harness"
)

func productOn(prefix string, p, n int32) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s%d", prefix, i)
		if sales.Partition([]byte(name), n) == p {
			return name
		}
	}
}

// batchGate holds a changelog partition's fetches under the test's control:
// each fetch of the partition returns one record batch at most, and only
// once the test has released a batch (or opened the gate for good). A
// restore through it moves exactly as far as the test lets it, however fast
// or slow the browser is; the restore consumer has a fetch connection of its
// own, so nothing else waits.
type batchGate struct {
	tokens chan struct{}
	open   chan struct{}
	once   sync.Once
}

func gateChangelogFetches(c *kfake.Cluster, topic string, p int32) *batchGate {
	g := &batchGate{tokens: make(chan struct{}, 1024), open: make(chan struct{})}
	id := c.TopicInfo(topic).TopicID // not from the control function: it runs on the cluster's goroutine
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		held := false
		for i := range req.Topics {
			rt := &req.Topics[i]
			if rt.Topic != topic && rt.TopicID != id {
				continue
			}
			for j := range rt.Partitions {
				if rt.Partitions[j].Partition == p {
					rt.Partitions[j].PartitionMaxBytes = 1
					held = true
				}
			}
		}
		if held {
			req.MaxBytes = 1
			c.SleepControl(func() {
				select {
				case <-g.tokens:
				case <-g.open:
				}
			})
		}
		return nil, nil, false
	})
	return g
}

// release lets one more fetch through. A fetch the client gave up on (its
// request timed out while held) may take a token and answer nobody: callers
// release by condition, not by count.
func (g *batchGate) release() { g.tokens <- struct{}{} }

// openAll lets every fetch through from now on.
func (g *batchGate) openAll() { g.once.Do(func() { close(g.open) }) }

func chromium(t *testing.T) string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	const p = "/usr/bin/chromium"
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing (apt-get install -y chromium, or set CHROMIUM): %v", p, err)
	}
	return p
}

func artifactDir(t *testing.T) string {
	if d := os.Getenv("SALESAGG_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// eval runs JavaScript in the page and returns its value.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// waitJS polls a JavaScript condition in the page.
func waitJS(t *testing.T, ctx context.Context, timeout time.Duration, what, js string) {
	t.Helper()
	harness.WaitFor(t, timeout, what, harness.Holds(func() bool {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		return err == nil && ok
	}))
}

type restoreBar struct {
	Present bool    `json:"present"`
	Value   float64 `json:"value"`
	Max     float64 `json:"max"`
	Determ  bool    `json:"determinate"`
	Text    string  `json:"text"`
}

func bar(t *testing.T, ctx context.Context, task string) restoreBar {
	t.Helper()
	js := fmt.Sprintf(`(function () {
		var row = document.querySelector('tr[data-task="%s"][data-role="active"]');
		var p = row && row.querySelector("progress");
		if (!p) { return {present: false, value: 0, max: 0, determinate: false, text: row ? row.innerText : ""}; }
		return {present: true, value: p.position < 0 ? 0 : p.value, max: p.max, determinate: p.hasAttribute("value"), text: row.innerText};
	})()`, task)
	return eval[restoreBar](t, ctx, js)
}

// browserScene is what the browser looks at: a runtime on the in-process
// broker behind srv, with task 0_1's restore held until release and task
// 0_2's restore fetching one changelog batch per batches.release, its log
// teed into the status page's ring, and hostile a product with a total
// whose name is markup.
type browserScene struct {
	srv     *httptest.Server
	rt      *stream.Runtime
	batches *batchGate
	release func()
	hostile string
}

// newBrowserScene starts the scene and waits for the hostile product's
// total (with hostile; without, the scene holds realistic data only, for
// the README's screenshot); its cleanups stop the runtime and the broker.
func newBrowserScene(t *testing.T, hostile bool) *browserScene {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	addr := cluster.ListenAddrs()[0]

	cfg := config.Default()
	cfg.BootstrapServers = []string{addr}
	cfg.StateDir = t.TempDir()
	cfg.CommitInterval = 100 * time.Millisecond
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.ApplicationID = "salesagg-browser"

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, cfg.InputTopic); err != nil {
		t.Fatal(err)
	}
	compact := "compact"
	if _, err := adm.CreateTopic(ctx, 3, 1, map[string]*string{"cleanup.policy": &compact}, cfg.ChangelogTopic()); err != nil {
		t.Fatal(err)
	}
	// A changelog for task 0_2 as an earlier instance left it: 2,000 totals in 40 batches.
	for b := range 40 {
		var recs []*kgo.Record
		for i := range 50 {
			p := productOn(fmt.Sprintf("sku-%02d-%02d-", b, i), 2, 3)
			recs = append(recs, &kgo.Record{Topic: cfg.ChangelogTopic(), Partition: 2, Key: []byte(p), Value: sales.EncodeTotal(int64(100 + b*50 + i))})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	batches := gateChangelogFetches(cluster, cfg.ChangelogTopic(), 2)
	t.Cleanup(batches.openAll) // before the runtime's stop (cleanups run last first)
	s := startHeldRuntime(t, cfg)
	s.batches = batches
	s.hostile = produceBrowserEvents(t, cl, cfg, s.srv, hostile)
	return s
}

// startHeldRuntime starts the runtime, task 0_1's restore held until the
// scene's release, behind an httptest server.
func startHeldRuntime(t *testing.T, cfg config.Config) *browserScene {
	ctx := context.Background()
	// The runtime, its log teed into the status page's ring as the service does.
	recent := httpapi.NewRecentLog(100, zapcore.WarnLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel)).WithOptions(zap.WrapCore(recent.Tee))
	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	rt := stream.New(cfg, log, dir, stream.Knobs{BeforeRestore: func(ctx context.Context, p int32) {
		if p == 1 {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
	}})
	srv := httptest.NewServer(httpapi.Handler(streamview.New(rt), httpapi.WithRecentLog(recent)))
	rt.Advertise(srv.Listener.Addr().String())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rt.Run(runCtx) }()
	t.Cleanup(func() {
		release()
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runtime: %v", err)
			}
		case <-time.After(stream.GracePeriod + 10*time.Second):
			t.Error("runtime did not stop")
		}
		srv.Close()
		_ = dir.Close()
	})
	return &browserScene{srv: srv, rt: rt, release: release}
}

// produceBrowserEvents produces the sample file's events, a bad event and,
// with withHostile, a product whose name is markup, and waits for the
// total of the last product produced to task 0_0, which it returns.
func produceBrowserEvents(t *testing.T, cl *kgo.Client, cfg config.Config, srv *httptest.Server, withHostile bool) string {
	ctx := context.Background()
	// Events: the sample file, a hostile product name, a bad event.
	hostile := productOn(`<img src=x onerror="window.pwned=1">&`, 0, 3)
	var recs []*kgo.Record
	f, err := os.Open(filepath.Join("..", "..", "sample_events.txt"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	// The bad event first: its warning is on the page once the last total is.
	recs = append(recs, &kgo.Record{Topic: cfg.InputTopic, Partition: 0, Key: []byte("bad"), Value: []byte("not json")})
	last := ""
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			recs = append(recs, &kgo.Record{Topic: cfg.InputTopic, Partition: sales.Partition([]byte(k), 3), Key: []byte(k), Value: []byte(v)})
			if sales.Partition([]byte(k), 3) == 0 {
				last = k
			}
		}
	}
	f.Close()
	if withHostile {
		hv, _ := json.Marshal(map[string]any{"product": hostile, "value": 20000})
		recs = append(recs, &kgo.Record{Topic: cfg.InputTopic, Partition: 0, Key: []byte(hostile), Value: hv})
		last = hostile
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, fmt.Sprintf("the total of %q", last), harness.Holds(func() bool {
		resp, err := http.Get(srv.URL + "/v1/products/" + url.PathEscape(last))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}))
	return last
}

// newBrowser starts headless Chromium, a fresh profile and no network but
// loopback, with a 90 s deadline. noProblems fails the test when the page
// logged a console error or threw; stop ends the console's listening.
func newBrowser(t *testing.T) (context.Context, func(when string), func()) {
	ctx := context.Background()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	bctx, cancelTimeout := context.WithTimeout(bctx, 90*time.Second)
	t.Cleanup(cancelTimeout)

	var mu sync.Mutex
	var problems []string
	listenCtx, stopListening := context.WithCancel(bctx)
	msgs := chromedp.Console(listenCtx)
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		for m, err := range msgs {
			if err != nil {
				return
			}
			t.Logf("browser console: %s", m)
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				problems = append(problems, m.String()+" at "+m.URL)
				mu.Unlock()
			}
		}
	}()
	noProblems := func(when string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(problems) > 0 {
			t.Fatalf("console errors %s:\n%s", when, strings.Join(problems, "\n"))
		}
	}
	return bctx, noProblems, func() {
		stopListening()
		<-listened
	}
}

// screenshots saves the page's screenshots, on a desktop and on a phone
// (where nothing may be wider than the screen), and sets the desktop's
// viewport back.
func screenshots(t *testing.T, bctx context.Context) {
	dirOut := artifactDir(t)
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	desktop := filepath.Join(dirOut, "status-page.png")
	if err := os.WriteFile(desktop, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", desktop)

	// A phone: nothing wider than the screen.
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, bctx, 5*time.Second, "the page to fit 390 px", `document.documentElement.scrollWidth <= window.innerWidth + 1`)
	if shot, err = chromedp.Run(bctx, chromedp.FullScreenshot(100)); err != nil {
		t.Fatal(err)
	}
	phone := filepath.Join(dirOut, "status-page-phone.png")
	if err := os.WriteFile(phone, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("phone screenshot: %s", phone)
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
}

// watchRestores waits for the page to list the three tasks, with an
// indeterminate bar for 0_1 (held) and a determinate one for 0_2 that moves
// as the page refreshes itself, with a rate and an ETA.
func watchRestores(t *testing.T, bctx context.Context, batches *batchGate) {
	for _, task := range []string{"0_0", "0_1", "0_2"} {
		waitJS(t, bctx, 10*time.Second, "task "+task+" listed",
			fmt.Sprintf(`!!document.querySelector('#tasks tr[data-task="%s"][data-role="active"]')`, task))
	}
	if b := bar(t, bctx, "0_1"); !b.Present || b.Determ {
		t.Fatalf("0_1 (held) has no indeterminate progress bar: %+v", b)
	}
	// 0_2 restores as the test releases its batches: one per render of the
	// page (each render has a new data-generated stamp), so the bar has moved
	// at every refresh and the page can measure a rate, whatever the speed
	// of the browser or the machine.
	generated := func() string {
		return eval[string](t, bctx, `document.querySelector("#instance").getAttribute("data-generated") || ""`)
	}
	lastRender := ""
	releasePerRender := func() {
		if g := generated(); g != lastRender {
			lastRender = g
			batches.release()
		}
	}
	var first restoreBar
	harness.WaitFor(t, 60*time.Second, "a determinate bar for 0_2", harness.Holds(func() bool {
		releasePerRender()
		first = bar(t, bctx, "0_2")
		return first.Present && first.Determ && first.Max > 0 && first.Value > 0
	}))
	var moved restoreBar
	harness.WaitFor(t, 60*time.Second, "0_2's bar to move, with a rate and an ETA", harness.Holds(func() bool {
		releasePerRender()
		moved = bar(t, bctx, "0_2")
		return moved.Present && moved.Value > first.Value && strings.Contains(moved.Text, "ETA") && !strings.Contains(moved.Text, "measuring")
	}))
	if moved.Value >= moved.Max {
		t.Fatalf("0_2's restore ended while the test held it: %+v", moved)
	}
	t.Logf("0_2 restore bar: %.0f then %.0f of %.0f: %q", first.Value, moved.Value, moved.Max, moved.Text)
}

func TestBrowserStatusPage(t *testing.T) {
	// Scenario: with task 0_1's restore held and 0_2 restoring a 2,000-record changelog a batch
	// per page render (both under the test's control), the
	// status page in headless Chromium loads with no console error or exception, lists the three
	// tasks, shows an indeterminate bar for 0_1 and a determinate one for 0_2 that moves as the page
	// refreshes itself (with a rate and an ETA), escapes a hostile product name, fits a phone's
	// width, and once the restores end shows every task running and the instance ready.
	start := time.Now()
	s := newBrowserScene(t, true)
	srv, rt, batches, release, hostile := s.srv, s.rt, s.batches, s.release, s.hostile
	bctx, noProblems, stopListening := newBrowser(t)

	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible("#tasks")); err != nil {
		t.Fatal(err)
	}
	watchRestores(t, bctx, batches)

	// Content: readiness, members, the hostile product as text only, the bad event's warning.
	text := eval[string](t, bctx, `document.body.innerText`)
	for _, want := range []string{"not ready", "task 0_1 is restoring", rt.InstanceID(), srv.Listener.Addr().String(), hostile, "Skipping bad event", "20,000"} {
		if !strings.Contains(text, want) {
			t.Errorf("page text lacks %q", want)
		}
	}
	if eval[bool](t, bctx, `!!document.querySelector("main img") || window.pwned === 1`) {
		t.Fatal("the hostile product name became markup")
	}
	noProblems("while restoring")

	screenshots(t, bctx)

	// Released, the restores end; the refreshed page shows it without a reload.
	release()
	batches.openAll()
	waitJS(t, bctx, 30*time.Second, "every task running and the instance ready",
		`document.querySelectorAll('#tasks tr[data-state="running"]').length === 3 && document.querySelector("#readiness").textContent === "ready" && !document.querySelector("progress")`)
	if nav := eval[float64](t, bctx, `performance.getEntriesByType("navigation").length`); nav != 1 {
		t.Fatalf("%v navigations: the page reloaded instead of refreshing in place", nav)
	}
	noProblems("after the restores")
	stopListening()
	t.Logf("browser test took %s", time.Since(start).Round(time.Millisecond))
}

func TestBrowserReadmeScreenshot(t *testing.T) {
	// Scenario: the README's screenshot of the status page (docs/status-page.png) shows what a user
	// sees, not a test's strings: the same held and moving restores as TestBrowserStatusPage, with
	// the sample file's products only. Every product the page lists is one of them. The screenshot
	// goes to $SALESAGG_ARTIFACTS as status-page-readme.png; with SALESAGG_README_SCREENSHOT=1 it
	// also replaces docs/status-page.png.
	s := newBrowserScene(t, false)
	bctx, noProblems, stopListening := newBrowser(t)
	if err := chromedp.Do(bctx, chromedp.Navigate(s.srv.URL+"/"), chromedp.WaitVisible("#tasks")); err != nil {
		t.Fatal(err)
	}
	watchRestores(t, bctx, s.batches)
	waitJS(t, bctx, 10*time.Second, "the top products and the bad event's warning",
		`!!document.querySelector("table#top td.product") && document.body.innerText.includes("Skipping bad event")`)
	sample := map[string]bool{}
	for k := range harness.SampleTotals {
		sample[k] = true
	}
	shown := eval[[]string](t, bctx, `Array.from(document.querySelectorAll("td.product")).map(function (td) { return td.textContent; })`)
	for _, p := range shown {
		if !sample[p] {
			t.Errorf("the page lists product %q, which is not one of the sample file's", p)
		}
	}
	noProblems("while restoring")
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(artifactDir(t), "status-page-readme.png")
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("README screenshot (%d products shown): %s", len(shown), out)
	if os.Getenv("SALESAGG_README_SCREENSHOT") == "1" {
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "status-page.png"), shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("replaced docs/status-page.png")
	}
	stopListening()
}
