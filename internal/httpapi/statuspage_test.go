package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// pageBackend is a Backend with settable tasks, members and stores. Its mu
// guards what a test may change while the page reads it; the rest is set
// before the page runs (a test that scans reads scanned on its own
// goroutine, the one that scans).
type pageBackend struct {
	idle
	mu      sync.Mutex    // guards tasks, stores, scanned and scans
	tasks   []status.Task // guarded by mu
	members []status.Instance
	ready   bool
	reason  string
	stores  map[string][]state.Total // guarded by mu; sorted by product
	scanned int                      // guarded by mu: products returned by ScanStore
	scans   int                      // guarded by mu
}

func (b *pageBackend) Tasks() []status.Task {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]status.Task(nil), b.tasks...)
}
func (b *pageBackend) Instances() []status.Instance { return b.members }
func (b *pageBackend) Ready() (bool, string)        { return b.ready, b.reason }
func (b *pageBackend) Healthy() (bool, string)      { return true, "ok" }
func (b *pageBackend) InstanceID() string           { return "salesagg-0" }
func (b *pageBackend) BadEvents() int64             { return 3 }

func (b *pageBackend) ScanStore(task, after string, limit int) ([]state.Total, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.stores[task]
	if !ok {
		return nil, errors.New("not running")
	}
	i := sort.Search(len(s), func(i int) bool { return s[i].Product > after })
	if after == "" {
		i = 0
	}
	out := append([]state.Total(nil), s[i:min(len(s), i+limit)]...)
	b.scans++
	b.scanned += len(out)
	return out, nil
}

func (b *pageBackend) setCheckpoint(task string, cp, processed int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.tasks {
		if b.tasks[i].Task == task && b.tasks[i].Role == "active" {
			b.tasks[i].Checkpoint = cp
			b.tasks[i].Processed = processed
		}
	}
}

func render(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	resp := rec.Result()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// rowOf returns the <tr> of task (role) in the page.
func rowOf(t *testing.T, body, task, role string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr data-task="` + regexp.QuoteMeta(task) + `" data-role="` + role + `".*?</tr>`).FindString(body)
	if m == "" {
		t.Fatalf("no row for %s (%s) in:\n%s", task, role, body)
	}
	return m
}

// restoringPage is a status page over four tasks (one running, one restoring
// with its range known, one without, a standby copy), a hostile member, a
// store with hostile product names, and a log ring with two entries kept.
func restoringPage() (*pageBackend, *statusPage) {
	lag := int64(42)
	b := &pageBackend{
		reason: "task 0_1 is restoring",
		tasks: []status.Task{
			{Task: "0_0", Role: "active", State: "running",
				Counters: status.Counters{Processed: 1000, Lag: 7, BadEvents: 2, Cache: &status.Cache{Hits: 39, Misses: 1}},
				Restore:  status.Restore{Restored: 12, Done: true, DurationMs: 850}},
			{Task: "0_1", Role: "active", State: "restoring", Checkpoint: 400,
				Restore: status.Restore{From: 100, To: 1100, Restored: 300}},
			{Task: "0_2", Role: "active", State: "restoring", Checkpoint: -1},
			{Task: "0_3", Role: "standby", State: "running", Checkpoint: 5000, ChangelogLag: &lag,
				Restore: status.Restore{Restored: 5000}},
		},
		members: []status.Instance{
			{Name: "salesagg-0", Server: "127.0.0.1:8080", Tasks: []string{"0_0", "0_1", "0_2"}, Standbys: []string{"0_3"}, Self: true},
			{Name: `<b>evil</b>"member`, Server: `x"><script>alert(1)</script>`, Tasks: []string{"0_3"},
				Member: "m-<i>1", MemberEpoch: 7, Pending: []string{"0_4"}},
		},
		stores: map[string][]state.Total{
			"0_0": {{Product: `<script>alert("pwned")</script>`, Total: 900}, {Product: "a&b", Total: 50}, {Product: "plain", Total: 70}},
		},
	}
	recent := NewRecentLog(10, zapcore.WarnLevel)
	log := zap.New(recent)
	log.Info("not kept")
	log.With(zap.String("task", "0_1")).Warn(`Skipping bad event <img src=x onerror=alert(1)>`, zap.Int64("offset", 17), zap.Error(errors.New("not JSON")))
	log.Error("Task failed")

	return b, newStatusPage(b, options{recent: recent})
}

func TestStatusPageShowsTasksRestoreProgressAndEscapes(t *testing.T) {
	// Scenario: the page lists each task with its state, a determinate progress bar with rate and
	// ETA for a restore whose range is known, an indeterminate one while it is not, standby copies,
	// the members (a streams member with its member id, epoch and the tasks it is taking), the
	// top products and the last errors, escaping every name; it refreshes itself
	// and its Content-Security-Policy allows exactly its own inline style and script.
	b, page := restoringPage()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	page.now = func() time.Time { return now }
	h := http.Handler(page)

	resp, body := render(t, h, "/")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`, `data-refresh-ms="2000"`, "salesagg-0", "127.0.0.1:8080",
		"not ready", "task 0_1 is restoring", "restored 12 records in 850 ms", "97.5%", "measuring",
		"42 records behind", `&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;`, "a&amp;b",
		`&lt;b&gt;evil&lt;/b&gt;&#34;member`, "Skipping bad event &lt;img src=x onerror=alert(1)&gt;",
		"task=0_1 offset=17 error=", "Task failed", "the last 2 of 2 warnings and errors",
		"member m-&lt;i&gt;1 · epoch 7", "(taking 0_4)",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range []string{`<script>alert`, `<b>evil`, `<img src=x`, "not kept"} {
		if strings.Contains(body, bad) {
			t.Errorf("page holds unescaped %q", bad)
		}
	}
	// The top products, largest first.
	if i, j := strings.Index(body, "pwned"), strings.Index(body, "plain"); i < 0 || j < 0 || i > j {
		t.Errorf("top products out of order")
	}
	if r := rowOf(t, body, "0_1", "active"); !strings.Contains(r, `<progress class="restore" aria-label="restore of 0_1" value="300" max="1000">`) ||
		!strings.Contains(r, "30.0%") {
		t.Errorf("0_1 row: %s", r)
	}
	if r := rowOf(t, body, "0_2", "active"); !regexp.MustCompile(`<progress class="restore" aria-label="restore of 0_2"></progress>`).MatchString(r) {
		t.Errorf("0_2 row has no indeterminate bar: %s", r)
	}
	if r := rowOf(t, body, "0_0", "active"); strings.Contains(r, "<progress") {
		t.Errorf("a running task has a progress bar: %s", r)
	}
	rowOf(t, body, "0_3", "standby")

	// The CSP names the hashes of exactly the inline style and script served.
	csp := resp.Header.Get("Content-Security-Policy")
	style := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindStringSubmatch(body)
	script := regexp.MustCompile(`(?s)<script>(.*?)</script>`).FindStringSubmatch(body)
	if style == nil || script == nil || !strings.Contains(csp, sha256Source(style[1])) || !strings.Contains(csp, sha256Source(script[1])) ||
		!strings.Contains(csp, "default-src 'none'") {
		t.Fatalf("CSP %q does not match the page's inline style and script", csp)
	}
	if n := strings.Count(body, "<script"); n != 1 {
		t.Fatalf("%d script elements, want 1", n)
	}

	// Two seconds later the restore moved 200 offsets and 0_0 processed 500 events: rates and ETA.
	now = now.Add(2 * time.Second)
	b.setCheckpoint("0_1", 600, 0)
	b.setCheckpoint("0_0", 0, 1500)
	resp, body = render(t, h, "/?part=main")
	if strings.Contains(body, "<html") || strings.Contains(body, "<script") || !strings.HasPrefix(body, `<section id="instance"`) {
		t.Fatalf("part=main is not the main element's content:\n%.300s", body)
	}
	if r := rowOf(t, body, "0_1", "active"); !strings.Contains(r, `value="500" max="1000"`) || !strings.Contains(r, "100/s, ETA 5.0 s") {
		t.Errorf("0_1 row after 2 s: %s", r)
	}
	if r := rowOf(t, body, "0_0", "active"); !strings.Contains(r, ">250/s<") {
		t.Errorf("0_0 row after 2 s: %s", r)
	}
	if !strings.Contains(body, `<dd id="events-rate">250/s</dd>`) {
		t.Errorf("no total events/s")
	}
}

func TestStatusPageWithoutTasksOrLog(t *testing.T) {
	// Scenario: an instance with nothing assigned and no log ring still renders a page that says so.
	resp, body := render(t, Handler(idle{}), "/")
	if resp.StatusCode != 200 {
		t.Fatalf("GET / = %d", resp.StatusCode)
	}
	for _, want := range []string{"No task is assigned", "no partitions assigned yet", "The log is not kept", "idle-0"} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q:\n%s", want, body)
		}
	}
	if resp, _ := render(t, Handler(idle{}), "/nope"); resp.StatusCode != 404 {
		t.Fatalf("GET /nope = %d, want 404", resp.StatusCode)
	}
}

func TestTopProductsScanIsBounded(t *testing.T) {
	// Scenario: a store of 100,000 products is read in chunks of at most topStepBudget per step,
	// at most one step per topStepEvery however often the page renders; after a full pass the
	// top 10 are exact, and a later pass picks up a product that climbed into the top.
	const n = 100_000
	s := make([]state.Total, n)
	for i := range s {
		s[i] = state.Total{Product: fmt.Sprintf("p%06d", i), Total: int64((i * 7919) % n)}
	}
	b := &pageBackend{stores: map[string][]state.Total{"0_0": s}}
	var tp topProducts
	now := time.Unix(1000, 0)
	steps := 0
	var v topView
	for ; steps < 100; steps++ {
		before := b.scanned
		for range 5 { // five renders within one step period
			v = tp.update(now, b, []string{"0_0"})
		}
		if got := b.scanned - before; got > topStepBudget {
			t.Fatalf("step %d read %d products, more than %d", steps, got, topStepBudget)
		}
		now = now.Add(topStepEvery)
		if !v.Partial {
			break
		}
	}
	if want := n/topStepBudget + 1; steps+1 != want {
		t.Fatalf("a full pass took %d steps, want %d", steps+1, want)
	}
	want := append([]state.Total(nil), s...)
	sort.Slice(want, func(i, j int) bool { return want[i].Total > want[j].Total })
	if len(v.Rows) != topK {
		t.Fatalf("%d rows", len(v.Rows))
	}
	for i, r := range v.Rows {
		if r.Total != want[i].Total || r.Product != want[i].Product || r.Rank != i+1 || r.Task != "0_0" {
			t.Fatalf("row %d = %+v, want %+v", i, r, want[i])
		}
	}
	// A product near the end climbs to the top: shown once the next pass reaches it, and until
	// then the last pass's entries after the cursor still count.
	b.mu.Lock()
	s[n-5].Total = 1 << 40
	b.mu.Unlock()
	found := false
	for range n/topStepBudget + 1 {
		v = tp.update(now, b, []string{"0_0"})
		now = now.Add(topStepEvery)
		if len(v.Rows) != topK {
			t.Fatalf("%d rows during the second pass", len(v.Rows))
		}
		if v.Rows[0].Product == s[n-5].Product {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("the climbing product never reached the top: %+v", v.Rows)
	}
	// A task that stops running is dropped.
	if v = tp.update(now, b, nil); len(v.Rows) != 0 || !strings.Contains(v.Note, "No task is running") {
		t.Fatalf("after the task stopped: %+v", v)
	}
}

func TestRateSamplerWindow(t *testing.T) {
	// Scenario: rates come from the oldest sample within 5 s, fall back to an older one after a pause,
	// and a counter that went down (a new task) has no rate.
	var s rateSampler
	at := time.Unix(0, 0)
	ts := func(p int64) []status.Task {
		return []status.Task{{Task: "0_0", Role: "active", Counters: status.Counters{Processed: p}}}
	}
	if r := s.observe(at, ts(0)); len(r) != 0 {
		t.Fatalf("first observation has rates: %v", r)
	}
	for i := 1; i <= 10; i++ { // a sample every second, 100 events/s
		r := s.observe(at.Add(time.Duration(i)*time.Second), ts(int64(100*i)))
		if got := r["0_0/active"].processed; !near(got, 100) {
			t.Fatalf("rate at %d s = %v, want 100", i, got)
		}
	}
	// Within minRateSpan of the last sample: still measured against one at least 0.5 s old.
	if r := s.observe(at.Add(10*time.Second+100*time.Millisecond), ts(1010)); !near(r["0_0/active"].processed, 100) {
		t.Fatalf("rate right after a sample = %v", r)
	}
	// After a 30 s pause, the latest older sample.
	if r := s.observe(at.Add(40*time.Second), ts(1300)); !near(r["0_0/active"].processed, 10) {
		t.Fatalf("rate after a pause = %v", r)
	}
	if r := s.observe(at.Add(42*time.Second), ts(5)); len(r) != 0 {
		t.Fatalf("rate of a reset counter = %v", r)
	}
	// A restore resuming from offset 1,000,000: the checkpoint is -1 until the first batch lands,
	// which must not read as a burst of a million offsets per second.
	restoring := func(cp int64) []status.Task {
		return []status.Task{{Task: "0_1", Role: "active", State: "restoring", Checkpoint: cp,
			Restore: status.Restore{From: 1_000_000, To: 1_010_000}}}
	}
	s.observe(at.Add(50*time.Second), restoring(-1))
	if r := s.observe(at.Add(51*time.Second), restoring(1_000_500)); !r["0_1/active"].progressKnown || !near(r["0_1/active"].progress, 500) {
		t.Fatalf("restore rate after the first batch = %+v, want 500/s", r["0_1/active"])
	}
	if len(s.samples) > maxSamples {
		t.Fatalf("%d samples kept", len(s.samples))
	}
}

func near(a, b float64) bool { return a > b-1e-6 && a < b+1e-6 }

func TestRecentLogRing(t *testing.T) {
	// Scenario: the ring keeps the last entries at warn and above, newest first, with their fields,
	// bounded in count and size, and tees with the process core.
	r := NewRecentLog(3, nil)
	base, _ := zap.NewDevelopment()
	log := zap.New(r.Tee(base.Core()))
	for i := range 5 {
		log.Warn(fmt.Sprintf("warning %d", i), zap.Int("i", i))
	}
	log.Debug("no")
	log.Info("no")
	log.Error(strings.Repeat("x", 5000))
	got, total := r.Entries()
	if total != 6 || len(got) != 3 {
		t.Fatalf("total %d, %d kept", total, len(got))
	}
	if got[0].Level != zapcore.ErrorLevel || len(got[0].Message) > maxRecentText+4 || got[1].Message != "warning 4" || got[1].Fields != "i=4" || got[2].Message != "warning 3" {
		t.Fatalf("entries: %+v", got)
	}
}

func TestStatusPageSaysWhatItRuns(t *testing.T) {
	// Scenario: the page names the application, its input topic, brokers, guarantee and version;
	// the instance's name appears once in its card (not again as a fact); and every time shown
	// (rendered at, a failing task's since, the log's entries) is in one format, UTC to the second.
	b, _ := restoringPage()
	b.tasks[2].Failing = &status.Failing{Error: "broker down", Attempts: 3, Since: "2026-12-01T11:59:00Z"}
	recent := NewRecentLog(10, zapcore.WarnLevel)
	zap.New(recent).Warn("something")
	page := newStatusPage(b, options{recent: recent, about: About{ApplicationID: "shop-totals", InputTopic: "sales-events-v1",
		Brokers: []string{"127.0.0.1:9092", "127.0.0.1:9093"}, Guarantee: "exactly_once_v2", Version: "v1.2.3 (0123456789ab)"}})
	page.now = func() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) }
	_, body := render(t, page, "/")
	for _, want := range []string{"shop-totals", "sales-events-v1", "127.0.0.1:9092, 127.0.0.1:9093", "exactly_once_v2",
		"v1.2.3 (0123456789ab)", "Rendered 2026-12-01 12:00:00Z.", "failing since 2026-12-01 11:59:00Z"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	card := body[strings.Index(body, `<section id="instance"`):]
	card = card[:strings.Index(card, "</section>")]
	if n := strings.Count(card, ">salesagg-0<"); n != 1 {
		t.Errorf("the instance's name is shown %d times in its card, want once", n)
	}
	visible := regexp.MustCompile(`data-generated="[^"]*"`).ReplaceAllString(body, "")
	if rfc := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d`).FindString(visible); rfc != "" {
		t.Errorf("a time in another format: %q", rfc)
	}
}

func TestStatusPageShowsTheCurrentWindow(t *testing.T) {
	// Scenario: an active task with windows shows, per size, the window holding its stream
	// time and the events left out of windows; one with no event yet says so.
	b := &pageBackend{tasks: []status.Task{
		{Task: "0_0", Role: "active", State: "running", Windows: []status.Window{
			{Size: "1h", StreamTime: time.Date(2026, 12, 1, 5, 59, 24, 0, time.UTC).UnixMilli(), Late: 3},
			{Size: "24h", StreamTime: time.Date(2026, 12, 1, 5, 59, 24, 0, time.UTC).UnixMilli(), BadTime: 2},
		}},
		{Task: "0_1", Role: "active", State: "running", Windows: []status.Window{{Size: "1h", StreamTime: -1}}},
	}}
	_, body := render(t, newStatusPage(b, options{}), "/")
	r := rowOf(t, body, "0_0", "active")
	for _, want := range []string{
		"1h window 2026-12-01 05:00:00Z – 2026-12-01 06:00:00Z (stream time 2026-12-01 05:59:24Z), 3 late",
		"24h window 2026-12-01 00:00:00Z – 2026-12-02 00:00:00Z (stream time 2026-12-01 05:59:24Z), 2 without a readable time",
	} {
		if !strings.Contains(r, want) {
			t.Errorf("0_0 row lacks %q: %s", want, r)
		}
	}
	if r := rowOf(t, body, "0_1", "active"); !strings.Contains(r, "1h windows: no event yet") {
		t.Errorf("0_1 row: %s", r)
	}
}
