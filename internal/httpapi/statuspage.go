package httpapi

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// The status page at GET /: one server-rendered HTML page for people, from
// the templates embedded below, with no external assets and no build step.
// It refreshes itself every refreshEvery: a few lines of inline JavaScript
// fetch "/?part=main" and swap the page's <main> in place, so the scroll
// position stays where the reader left it (without JavaScript, a
// <meta http-equiv=refresh> in <noscript> reloads the page every 5 s).
// Everything shown goes through html/template, so product names, instance
// names and log messages are escaped; a Content-Security-Policy allows only
// the page's own inline style and script (by hash) and requests to itself.

//go:embed templates/status.html templates/status.css templates/refresh.js
var statusFS embed.FS

// refreshEvery is how often the page refreshes itself.
const refreshEvery = 2 * time.Second

// PageSource is what the status page shows: the tasks, the members, this
// instance's readiness and bad events, and the top products of its stores.
type PageSource interface {
	Tasks() []status.Task
	Instances() []status.Instance
	Ready() (bool, string)
	InstanceID() string
	// BadEvents counts the events skipped as bad since the start.
	BadEvents() int64
	StoreScanner
}

// StoreScanner is how the status page lists the top products: a bounded
// read of one task's store.
type StoreScanner interface {
	// ScanStore lists up to limit totals of task's store after the
	// product after, in product order; an error when the task does not run
	// here (any longer).
	ScanStore(task, after string, limit int) ([]state.Total, error)
}

var (
	statusTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
		"num": formatCount,
	}).ParseFS(statusFS, "templates/status.html"))
	statusCSS = mustRead("templates/status.css")
	statusJS  = mustRead("templates/refresh.js")
	// statusCSP allows exactly the page's inline style and script.
	statusCSP = "default-src 'none'; style-src '" + sha256Source(statusCSS) + "'; script-src '" + sha256Source(statusJS) +
		"'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

func mustRead(name string) string {
	b, err := statusFS.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func sha256Source(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

// statusPage serves GET /. It keeps, across renders, the counters' samples
// (for events/s, restore rates and ETAs) and the top-products scan.
type statusPage struct {
	b      PageSource
	recent *RecentLog // nil: not wired
	now    func() time.Time
	// scheme is how the other instances are linked to: http, or https
	// with TLS on.
	scheme  string
	sampler rateSampler
	top     topProducts
	about   About
}

func newStatusPage(b PageSource, o options) *statusPage {
	return &statusPage{b: b, recent: o.recent, now: time.Now, scheme: o.sec.Scheme(), about: o.about}
}

func (p *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v := p.view(p.now())
	name := "page"
	if r.URL.Query().Get("part") == "main" {
		name = "main"
	}
	var buf bytes.Buffer
	if err := statusTmpl.ExecuteTemplate(&buf, name, v); err != nil {
		http.Error(w, "rendering the status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(buf.Bytes())
}

// statusView is what the templates render.
type statusView struct {
	Style      template.CSS
	Script     template.JS
	RefreshMs  int64
	Generated  string // RFC 3339, UTC, for scripts
	Rendered   string // the same in timeFormat, for people
	Instance   string
	About      aboutView
	Server     string
	Ready      bool
	Reason     string
	Summary    summaryView
	Tasks      []taskView
	Members    []memberView
	Top        topView
	Errors     []errorView
	ErrorsOn   bool   // a RecentLog is wired
	ErrorsNote string // "3 of 17 since start"
}

type summaryView struct {
	Active, Running, Copies int
	EventsPerSec            string
	Processed, Lag, Bad     int64
}

// taskView is one row of the tasks table.
type taskView struct {
	Task, Role, State string
	// StateClass is ok, warn or bad (the badge's colour).
	StateClass string
	// Restore is the progress of a restore under way.
	Restore restoreBar
	// Detail is the restore or copy column's text.
	Detail string
	// Active: an active task, whose Counters are shown (a copy has none).
	Active   bool
	Counters counterView
	// Trouble is what keeps the task back: a failure it retries, or what it
	// waits for; TroubleClass colours it (warn, or bad once unhealthy).
	Trouble, TroubleClass string
	// Windows are an active task's current windows, one line per size.
	Windows []string
}

// restoreBar is a restore under way (On): the bar is Done of Total
// changelog offsets, Indeterminate while the range is not known yet.
type restoreBar struct {
	On, Indeterminate  bool
	Done, Total        int64
	Percent, Rate, ETA string
}

// counterView is an active task's input lag and counters.
type counterView struct {
	Lag            int64
	Rate           string // events/s
	Processed, Bad int64
	CacheHit       string // "97.5%"; "" when no lookups yet
	CacheNote      string
}

type memberView struct {
	Name, Server, Link string
	Tasks, Standbys    string
	Self               bool
	// Member is "member <id> · epoch N" in a streams group, Pending the
	// tasks its coordinator means for it and has not given yet.
	Member, Pending string
}

type topView struct {
	Rows    []topRow
	Note    string
	Partial bool
}

type topRow struct {
	Rank    int
	Product string
	Total   int64
	Task    string
}

type errorView struct {
	Time, Level, LevelClass, Logger, Message, Fields string
}

// maxErrorsShown bounds the errors listed on the page.
const maxErrorsShown = 20

// timeFormat is how the page shows a time: UTC, to the second, one format
// for every time on the page (the runtime's reasons use it too).
const timeFormat = "2006-01-02 15:04:05Z"

// readableTime shows an RFC 3339 time in timeFormat (as it is when it does
// not parse).
func readableTime(rfc3339 string) string {
	t, err := time.Parse(time.RFC3339, rfc3339)
	if err != nil {
		return rfc3339
	}
	return t.UTC().Format(timeFormat)
}

// aboutView is the service the page describes.
type aboutView struct {
	ApplicationID, InputTopic, Brokers, Guarantee, Version string
}

func aboutOf(a About) aboutView {
	return aboutView{ApplicationID: a.ApplicationID, InputTopic: a.InputTopic,
		Brokers: strings.Join(a.Brokers, ", "), Guarantee: a.Guarantee, Version: a.Version}
}

func (p *statusPage) view(now time.Time) statusView {
	tasks := p.b.Tasks()
	rates := p.sampler.observe(now, tasks)
	ready, reason := p.b.Ready()
	v := statusView{
		Style:     template.CSS(statusCSS),
		Script:    template.JS(statusJS),
		RefreshMs: refreshEvery.Milliseconds(),
		Generated: now.UTC().Format(time.RFC3339),
		Rendered:  now.UTC().Format(timeFormat),
		Instance:  p.b.InstanceID(),
		About:     aboutOf(p.about),
		Ready:     ready,
		Reason:    reason,
	}
	var running []string
	v.Tasks, v.Summary, running = taskRows(tasks, rates)
	v.Summary.Bad = p.b.BadEvents()
	v.Members, v.Server = p.members()
	v.Top = p.top.update(now, p.b, running)
	if p.recent != nil {
		v.ErrorsOn = true
		v.Errors, v.ErrorsNote = p.lastErrors()
	}
	return v
}

// taskRows renders the tasks and sums them up; running names the active
// tasks that run (their stores are scanned for the top products).
func taskRows(tasks []status.Task, rates map[string]taskRates) (rows []taskView, sum summaryView, running []string) {
	var totalRate float64
	rateKnown := false
	for _, t := range tasks {
		r, known := rates[sampleKey(t)]
		if t.Role == "active" {
			sum.Active++
			sum.Processed += t.Processed
			sum.Lag += t.Lag
			if t.State == "running" {
				sum.Running++
				running = append(running, t.Task)
			}
			if known {
				totalRate += r.processed
				rateKnown = true
			}
		} else {
			sum.Copies++
		}
		rows = append(rows, taskRow(t, r, known))
	}
	if rateKnown {
		sum.EventsPerSec = formatRate(totalRate)
	}
	return rows, sum, running
}

// taskRow renders one task; r are its rates when known.
func taskRow(t status.Task, r taskRates, known bool) taskView {
	tv := taskView{Task: t.Task, Role: t.Role, State: t.State, StateClass: stateClass(t.State)}
	if t.Role == "active" {
		tv.Active = true
		tv.Counters = activeCounters(t, r, known)
		if t.State == "restoring" || t.State == "created" {
			tv.Restore, tv.Detail = restoreProgress(t, r, known)
		} else if t.Restore.Done {
			tv.Detail = fmt.Sprintf("restored %s records in %s", formatCount(t.Restore.Restored),
				formatDuration(time.Duration(t.Restore.DurationMs)*time.Millisecond))
		}
	} else {
		tv.Detail = copyDetail(t, r, known)
	}
	tv.Trouble, tv.TroubleClass = trouble(t)
	for _, w := range t.Windows {
		tv.Windows = append(tv.Windows, currentWindow(w))
	}
	return tv
}

// currentWindow says which window of a size a task is in (the one holding
// its stream time), and the events left out of windows.
func currentWindow(w status.Window) string {
	size, err := time.ParseDuration(w.Size)
	var text string
	switch {
	case w.StreamTime < 0:
		text = w.Size + " windows: no event yet"
	case err != nil || size <= 0:
		text = fmt.Sprintf("%s windows: stream time %s", w.Size, time.UnixMilli(w.StreamTime).UTC().Format(timeFormat))
	default:
		start := sales.WindowStart(w.StreamTime, size.Milliseconds())
		text = fmt.Sprintf("%s window %s – %s (stream time %s)", w.Size, time.UnixMilli(start).UTC().Format(timeFormat),
			time.UnixMilli(start+size.Milliseconds()).UTC().Format(timeFormat), time.UnixMilli(w.StreamTime).UTC().Format(timeFormat))
	}
	if w.Late > 0 {
		text += fmt.Sprintf(", %s late", formatCount(w.Late))
	}
	if w.BadTime > 0 {
		text += fmt.Sprintf(", %s without a readable time", formatCount(w.BadTime))
	}
	return text
}

// activeCounters are an active task's counters, its events/s and its
// cache's hit ratio.
func activeCounters(t status.Task, r taskRates, known bool) counterView {
	c := counterView{Lag: t.Lag, Processed: t.Processed, Bad: t.BadEvents}
	if known {
		c.Rate = formatRate(r.processed)
	}
	if t.Cache != nil {
		if n := t.Cache.Hits + t.Cache.Misses; n > 0 {
			c.CacheHit = fmt.Sprintf("%.1f%%", 100*float64(t.Cache.Hits)/float64(n))
		}
		c.CacheNote = fmt.Sprintf("%s hits, %s misses, %s evictions, %s", formatCount(t.Cache.Hits),
			formatCount(t.Cache.Misses), formatCount(t.Cache.Evictions), formatBytes(t.Cache.Bytes))
	}
	return c
}

// trouble says what keeps a task back and its class (warn, or bad once
// unhealthy); "" when nothing.
func trouble(t status.Task) (text, class string) {
	switch {
	case t.Failing != nil:
		text = fmt.Sprintf("failing since %s (%d attempts, retrying with backoff): %s", readableTime(t.Failing.Since), t.Failing.Attempts, t.Failing.Error)
	case t.Waiting != "":
		text = "waiting for " + t.Waiting
	default:
		return "", ""
	}
	if t.Unhealthy {
		return "unhealthy (task.timeout.ms passed): " + text, "bad"
	}
	return text, "warn"
}

// members renders the group's members, and this instance's server.
func (p *statusPage) members() (members []memberView, server string) {
	for _, is := range p.b.Instances() {
		m := memberView{Name: is.Name, Server: is.Server, Self: is.Self,
			Tasks: strings.Join(is.Tasks, ", "), Standbys: strings.Join(is.Standbys, ", "), Pending: strings.Join(is.Pending, ", ")}
		if is.Member != "" {
			m.Member = fmt.Sprintf("member %s · epoch %d", is.Member, is.MemberEpoch)
		}
		if config.CheckServer(is.Server) == nil {
			m.Link = (&url.URL{Scheme: p.scheme, Host: is.Server, Path: "/"}).String()
		}
		if is.Self {
			server = is.Server
		}
		members = append(members, m)
	}
	return members, server
}

// lastErrors renders the newest entries of the RecentLog, and how many
// there were.
func (p *statusPage) lastErrors() ([]errorView, string) {
	entries, total := p.recent.Entries()
	if len(entries) > maxErrorsShown {
		entries = entries[:maxErrorsShown]
	}
	var out []errorView
	for _, e := range entries {
		out = append(out, errorView{
			Time: e.Time.UTC().Format(timeFormat), Level: e.Level.String(),
			LevelClass: levelClass(e.Level.String()), Logger: e.Logger, Message: e.Message, Fields: e.Fields,
		})
	}
	return out, fmt.Sprintf("the last %d of %s warnings and errors logged since the start", len(entries), formatCount(int64(total)))
}

// restoreProgress is the progress of an active task that restores, and its
// column's text. Progress is in changelog offsets (the checkpoint moves from
// From to To as batches are applied); the rate is the checkpoint's over the
// sampler's window, and the ETA what is left at that rate.
func restoreProgress(t status.Task, r taskRates, known bool) (restoreBar, string) {
	bar := restoreBar{On: true}
	from, to := t.Restore.From, t.Restore.To
	if to <= from {
		// The range is not known yet: the task waits for its turn, opens
		// its store or reads the changelog's offsets.
		bar.Indeterminate = true
		if t.Restore.Restored > 0 {
			return bar, fmt.Sprintf("%s records restored", formatCount(t.Restore.Restored))
		}
		return bar, "opening the store and reading the changelog range"
	}
	bar.Total = to - from
	bar.Done = min(max(t.Checkpoint-from, 0), bar.Total)
	if bar.Done == 0 && t.Restore.Restored > 0 {
		bar.Done = min(t.Restore.Restored, bar.Total)
	}
	bar.Percent = fmt.Sprintf("%.1f%%", 100*float64(bar.Done)/float64(bar.Total))
	detail := fmt.Sprintf("%s of %s changelog offsets (%s to %s), %s records applied", formatCount(bar.Done),
		formatCount(bar.Total), formatCount(from), formatCount(to), formatCount(t.Restore.Restored))
	switch {
	case !known || !r.progressKnown:
		bar.Rate, bar.ETA = "measuring", "measuring"
	case r.progress <= 0:
		bar.Rate, bar.ETA = "0/s", "not moving"
	default:
		bar.Rate = formatRate(r.progress)
		bar.ETA = formatDuration(time.Duration(float64(bar.Total-bar.Done) / r.progress * float64(time.Second)))
	}
	return bar, detail
}

// copyDetail describes a standby, warm-up or incoming copy.
func copyDetail(t status.Task, r taskRates, known bool) string {
	var parts []string
	if t.ChangelogLag != nil {
		parts = append(parts, fmt.Sprintf("%s records behind", formatCount(*t.ChangelogLag)))
	} else {
		parts = append(parts, "lag not known yet")
	}
	parts = append(parts, fmt.Sprintf("checkpoint %s", formatCount(t.Checkpoint)),
		fmt.Sprintf("%s applied", formatCount(t.Restore.Restored)))
	if known {
		parts = append(parts, "applying "+formatRate(r.applied))
		if t.ChangelogLag != nil && *t.ChangelogLag > 0 && r.progressKnown && r.progress > 0 {
			parts = append(parts, "catches up in "+formatDuration(time.Duration(float64(*t.ChangelogLag)/r.progress*float64(time.Second))))
		}
	}
	return strings.Join(parts, ", ")
}

func stateClass(s string) string {
	switch s {
	case "running":
		return "ok"
	case "failed", "stalled":
		return "bad"
	}
	return "warn"
}

func levelClass(l string) string {
	if l == "warn" {
		return "warn"
	}
	return "bad"
}

// --- events/s and restore rates -----------------------------------------

// rateSampler turns the tasks' counters into rates: each render records a
// sample (at most one per sampleGap), and a rate is the change between now
// and the oldest sample within rateWindow (or, when the page was not looked
// at for a while, the latest older one, up to sampleMaxAge). It keeps at
// most maxSamples samples, so its memory is bounded by the task count. The
// first render has nothing to compare with and shows no rates.
type rateSampler struct {
	mu      sync.Mutex // guards samples
	samples []sample   // guarded by mu; oldest first
}

const (
	sampleGap    = 250 * time.Millisecond
	rateWindow   = 5 * time.Second
	minRateSpan  = 500 * time.Millisecond
	sampleMaxAge = time.Minute
	maxSamples   = 64
)

type sample struct {
	at time.Time
	c  map[string]counters
}

// counters are a task's counters in a sample. progress is the changelog
// offset its store reflects: for an active task that restores, clamped to
// the restore's range (the checkpoint is -1, or the old one, until the first
// batch lands), so that the first batch is not taken for a burst.
type counters struct{ processed, progress, applied int64 }

// taskRates are per second; progressKnown is false while the offset was
// not known at the reference sample.
type taskRates struct {
	processed, progress, applied float64
	progressKnown                bool
}

// sampleKey names a task's counters: its name and role (a standby copy and
// the active task of one partition are different counters).
func sampleKey(t status.Task) string { return t.Task + "/" + t.Role }

func (s *rateSampler) observe(now time.Time, tasks []status.Task) map[string]taskRates {
	cur := make(map[string]counters, len(tasks))
	for _, t := range tasks {
		c := counters{processed: t.Processed, progress: t.Checkpoint, applied: t.Restore.Restored}
		if from, to := t.Restore.From, t.Restore.To; t.Role == "active" && to > from {
			c.progress = min(max(t.Checkpoint, from), to)
		}
		cur[sampleKey(t)] = c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.samples) > 0 && now.Sub(s.samples[0].at) > sampleMaxAge {
		s.samples = s.samples[1:]
	}
	var ref *sample
	for i := len(s.samples) - 1; i >= 0; i-- {
		age := now.Sub(s.samples[i].at)
		if age < minRateSpan {
			continue
		}
		if age <= rateWindow || ref == nil {
			ref = &s.samples[i]
		}
		if age > rateWindow {
			break
		}
	}
	out := map[string]taskRates{}
	if ref != nil {
		dt := now.Sub(ref.at).Seconds()
		for k, c := range cur {
			old, ok := ref.c[k]
			// A counter that went down belongs to a new task (a rebalance
			// gave the partition back): no rate until the next sample.
			if !ok || c.processed < old.processed || c.applied < old.applied || c.progress < old.progress {
				continue
			}
			out[k] = taskRates{
				processed:     float64(c.processed-old.processed) / dt,
				progress:      float64(c.progress-old.progress) / dt,
				progressKnown: old.progress >= 0,
				applied:       float64(c.applied-old.applied) / dt,
			}
		}
	}
	if n := len(s.samples); n == 0 || now.Sub(s.samples[n-1].at) >= sampleGap {
		s.samples = append(s.samples, sample{at: now, c: cur})
		if len(s.samples) > maxSamples {
			s.samples = s.samples[len(s.samples)-maxSamples:]
		}
	}
	return out
}

// --- top products ---------------------------------------------------------

// topProducts finds the topK products by total over this instance's running
// tasks, at a bounded cost: the page must never scan a million-product store
// on every refresh.
//
// How: each task's store is read in a rolling pass, in product order, one
// chunk per step: a step reads at most topStepBudget products over all tasks
// (each task at least topMinChunk), and runs at most once every
// topStepEvery however many pages are open, and only while someone looks at
// the page (renders drive the steps; nothing runs in the background). A pass
// keeps a min-heap of the topK largest totals it has read; at the end of
// the store its result becomes the task's last complete pass and a new pass
// starts. What is shown per task is the pass under way's heap (exact for the
// products before its cursor) together with the last complete pass's
// entries after the cursor; across tasks (which own disjoint products) the
// topK largest.
//
// So a task of up to 20,000 products (over the instance's tasks) is exact
// within topStepEvery; a store of a million products costs ~50 steps for a
// full pass (about 2 minutes of page views), each a few milliseconds of
// Pebble iteration holding the store's read lock for one chunk, and until
// the pass comes round a product that climbed into the top can be missing
// or its total stale. The totals are the committed ones (as GET
// /v1/products). Not chosen: a top-K kept from the commit cycle's store
// writes (exact and cheaper, but it needs a hook in the task's commit path
// and a way to recover the top after a restore, which is this scan anyway).
type topProducts struct {
	mu    sync.Mutex          // guards last, tasks and the taskTops in it
	last  time.Time           // guarded by mu: when the last scan step ran
	tasks map[string]*taskTop // guarded by mu, and so is each taskTop
}

const (
	topK          = 10
	topStepEvery  = 2 * time.Second
	topStepBudget = 20000
	topMinChunk   = 1000
)

type taskTop struct {
	cursor   string          // last product read by the pass under way; "" at its start
	pass     state.TopTotals // the topK largest of the pass under way
	passRead int64
	done     []state.Total // the last complete pass's topK, largest first
	doneRead int64
	doneAt   time.Time
	hasDone  bool
}

// update runs a scan step when one is due and returns what to show.
func (tp *topProducts) update(now time.Time, s StoreScanner, running []string) topView {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.tasks == nil {
		tp.tasks = map[string]*taskTop{}
	}
	isRunning := map[string]bool{}
	for _, name := range running {
		isRunning[name] = true
	}
	for name := range tp.tasks {
		if !isRunning[name] {
			delete(tp.tasks, name)
		}
	}
	if len(running) > 0 && (tp.last.IsZero() || now.Sub(tp.last) >= topStepEvery) {
		tp.last = now
		chunk := max(topMinChunk, topStepBudget/len(running))
		for _, name := range running {
			tt := tp.tasks[name]
			if tt == nil {
				tt = &taskTop{}
				tp.tasks[name] = tt
			}
			got, err := s.ScanStore(name, tt.cursor, chunk)
			if err != nil {
				delete(tp.tasks, name) // stopped meanwhile: start over when it runs again
				continue
			}
			for _, e := range got {
				tt.pass.Offer(e, topK)
			}
			tt.passRead += int64(len(got))
			if len(got) < chunk {
				tt.done, tt.doneRead, tt.doneAt, tt.hasDone = tt.pass.Sorted(), tt.passRead, now, true
				tt.cursor, tt.pass, tt.passRead = "", nil, 0
			} else {
				tt.cursor = got[len(got)-1].Product
			}
		}
	}
	return tp.viewLocked(now)
}

func (tp *topProducts) viewLocked(now time.Time) topView {
	var v topView
	var rows []topRow
	var products int64
	var oldest time.Time
	for name, tt := range tp.tasks {
		for _, e := range tt.pass {
			rows = append(rows, topRow{Product: e.Product, Total: e.Total, Task: name})
		}
		if !tt.hasDone {
			v.Partial = true
			continue
		}
		for _, e := range tt.done {
			if tt.cursor == "" || e.Product > tt.cursor {
				rows = append(rows, topRow{Product: e.Product, Total: e.Total, Task: name})
			}
		}
		products += tt.doneRead
		if oldest.IsZero() || tt.doneAt.Before(oldest) {
			oldest = tt.doneAt
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Total != rows[j].Total {
			return rows[i].Total > rows[j].Total
		}
		return rows[i].Product < rows[j].Product
	})
	if len(rows) > topK {
		rows = rows[:topK]
	}
	for i := range rows {
		rows[i].Rank = i + 1
	}
	v.Rows = rows
	note := fmt.Sprintf("Committed totals of this instance's running tasks, from a rolling scan of their stores (at most %s products every %s, only while this page is open).",
		formatCount(topStepBudget), formatDuration(topStepEvery))
	switch {
	case len(tp.tasks) == 0:
		note += " No task is running here."
	case v.Partial:
		note += " A first pass over a store is under way: the list may be incomplete."
	default:
		age := "just now"
		if d := now.Sub(oldest); d >= time.Second {
			age = formatDuration(d) + " ago"
		}
		note += fmt.Sprintf(" Last full passes: %s products, the oldest %s.", formatCount(products), age)
	}
	v.Note = note
	return v
}

// --- formatting -------------------------------------------------------------

// formatCount writes n with thousands separators: 1,234,567.
func formatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// formatRate writes a per-second rate: "0/s", "2.5/s", "1,234/s".
func formatRate(r float64) string {
	switch {
	case r <= 0 || math.IsNaN(r):
		return "0/s"
	case r < 10:
		return strconv.FormatFloat(r, 'f', 1, 64) + "/s"
	}
	return formatCount(int64(math.Round(r))) + "/s"
}

// formatDuration writes a short duration: "850 ms", "4.2 s", "3m 05s", "2h 10m".
func formatDuration(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
