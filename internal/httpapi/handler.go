package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// Backend is everything the HTTP interface reads, as the union of what its
// parts use: each part holds only its own interface (Querier, Lister,
// StatusReader and Prober here, PageSource in statuspage.go).
// internal/httpapi/streamview adapts the runtime to it.
type Backend interface {
	Querier
	Lister
	Windower
	StatusReader
	Prober
	PageSource
}

// StatusReader is what GET /v1/tasks and GET /v1/instances serve.
type StatusReader interface {
	// Tasks is the status of every task of this instance, active or copy.
	Tasks() []status.Task
	// Instances lists the group's members, their tasks and servers.
	Instances() []status.Instance
}

// Prober is what GET /healthz and GET /readyz answer.
type Prober interface {
	// Ready is false while this instance should get no traffic; the
	// reason says what is missing.
	Ready() (bool, string)
	// Healthy is false once a task kept failing past task.timeout.ms.
	Healthy() (bool, string)
}

// Querier is what a product's query reads: GET /v1/products/{product}
// answers from this instance's task or standby copy, or forwards to the
// task's owner or to an instance with a standby copy.
type Querier interface {
	// Total is the product's committed total from this instance's active
	// task; a *NotHostedError names its owner when it runs elsewhere.
	Total(product string) (int64, bool, error)
	// StandbyTotal answers from this instance's standby copy of the
	// product's task, within acceptable.recovery.lag; lag is how far behind
	// it may be.
	StandbyTotal(product string) (total int64, ok bool, lag int64, err error)
	// StandbyServers are the other instances keeping a standby copy of the
	// product's task.
	StandbyServers(product string) []status.Peer
	// TaskOf names the task owning a product.
	TaskOf(product string) string
	// InstanceID names this instance in X-Served-By.
	InstanceID() string
}

// Lister is what GET /v1/products gathers: this instance's page, and the
// instances to ask for theirs.
type Lister interface {
	// Products lists up to limit totals after the product after, from
	// this instance's running tasks; unavailable names the tasks that are
	// not running, whose products are missing.
	Products(after string, limit int) (page []state.Total, unavailable []string, err error)
	// TopProducts lists the limit largest totals (equal totals by product)
	// of this instance's running tasks; unavailable as Products'.
	TopProducts(ctx context.Context, limit int) (top []state.Total, unavailable []string, err error)
	// StandbyPage lists the products of task's standby copy on this
	// instance, when it runs within acceptable.recovery.lag: a page after
	// after, or with byTotal the limit largest; lag is how far behind the
	// copy may be.
	StandbyPage(ctx context.Context, task, after string, limit int, byTotal bool) (page []state.Total, lag int64, err error)
	// Instances lists the group's members, their tasks and servers.
	Instances() []status.Instance
	// InstanceID names this instance to those it asks.
	InstanceID() string
}

// productsPrefix is the path of one product's total; the rest of the path
// is the product, escaped as one segment.
const productsPrefix = "/v1/products/"

// handler serves the routes; each field is the part of the backend one
// group of routes reads.
type handler struct {
	query  Querier
	list   Lister
	win    Windower
	status StatusReader
	probe  Prober
	fw     *forwarder
	// topScans (buffered 1) lets one top query at a time read the stores.
	topScans chan struct{}
	// mux serves every route but one product's total (see ServeHTTP).
	mux *http.ServeMux
}

// routes wires the handler's routes over b, behind g's protection, with
// request bodies bounded to 1 MiB.
func routes(b Backend, g *guard, log *zap.Logger, o options) http.Handler {
	h := &handler{query: b, list: b, win: b, status: b, probe: b, fw: newForwarder(g, log), topScans: make(chan struct{}, 1), mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /v1/products", h.products)
	h.mux.HandleFunc("GET /v1/products/{product}/windows", h.productWindows)
	h.mux.HandleFunc("GET /v1/windows", h.windowPage)
	h.mux.HandleFunc("GET /v1/windows/starts", h.windowStarts)
	h.mux.HandleFunc("GET /v1/tasks", h.tasks)
	h.mux.HandleFunc("GET /v1/instances", h.instances)
	h.mux.Handle("GET /{$}", newStatusPage(b, o))
	h.mux.HandleFunc("GET /healthz", h.healthz)
	h.mux.HandleFunc("GET /readyz", h.readyz)
	if o.metrics != nil {
		h.mux.Handle("GET /metrics", promhttp.HandlerFor(o.metrics, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	}
	if o.pprof {
		pprofRoutes(h.mux)
	}
	return http.MaxBytesHandler(g.protect(h), 1<<20)
}

// pprofRoutes serves net/http/pprof's handlers. Profiles are bounded by the
// server's WriteTimeout (30 s): a CPU profile asks for at most ?seconds=29.
// The command line is not served: it can hold secrets given as flags.
func pprofRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/pprof/cmdline", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "the command line is not served"})
	})
}

// ServeHTTP routes one product's total itself, and the rest through the
// mux: the mux cleans dot segments, so that the products "." and ".." (sent
// as %2E and %2E%2E) would be redirected to other paths.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), productsPrefix)
	if !ok || strings.Contains(rest, "/") {
		if _, pattern := h.mux.Handler(r); pattern == "" {
			unrouted(w, r, h.mux)
			return
		}
		h.mux.ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed"})
		return
	}
	// local and stale are how the Kafka Streams reference forwards a query
	// to the instance it names (see forwardedHere).
	if unknownParams(w, r, "local", "stale") {
		return
	}
	product, err := url.PathUnescape(rest)
	if err != nil || product == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "the product must be one path segment, escaped"})
		return
	}
	h.product(w, r, product)
}

// unrouted answers a request no route takes in JSON, as every other answer
// of the API: 404 for a path it does not serve, 405 with Allow for a method
// the path does not take (what the mux would answer in plain text).
func unrouted(w http.ResponseWriter, r *http.Request, mux *http.ServeMux) {
	rec := &statusRecorder{header: http.Header{}}
	mux.ServeHTTP(rec, r)
	if allow := rec.header.Get("Allow"); rec.code == http.StatusMethodNotAllowed && allow != "" {
		w.Header().Set("Allow", allow)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + r.Method + " not allowed; allowed: " + allow})
		return
	}
	writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such path: " + r.URL.Path})
}

// statusRecorder keeps the status and headers a handler writes and drops
// its body.
type statusRecorder struct {
	header http.Header
	code   int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.code = code }

// tasks answers GET /v1/tasks.
func (h *handler) tasks(w http.ResponseWriter, r *http.Request) {
	if unknownParams(w, r) {
		return
	}
	ts := h.status.Tasks()
	if ts == nil {
		ts = []status.Task{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tasks": ts})
}

// instances answers GET /v1/instances.
func (h *handler) instances(w http.ResponseWriter, r *http.Request) {
	if unknownParams(w, r) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"instances": h.status.Instances()})
}

// healthz answers GET /healthz: alive unless a task kept failing past
// task.timeout.ms, when a restart (the liveness probe's) is the next thing
// to try.
func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	if ok, reason := h.probe.Healthy(); !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers GET /readyz: 503 while not ready, with the reason.
func (h *handler) readyz(w http.ResponseWriter, _ *http.Request) {
	ready, reason := h.probe.Ready()
	code := http.StatusOK
	if !ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"ready": ready, "reason": reason})
}

// products answers GET /v1/products: this instance's page merged with the
// same page of every other instance running tasks (unless the request was
// forwarded to us), asked in parallel under one deadline (forwardTimeout).
// With sort=total it answers the limit largest totals instead (see top).
func (h *handler) products(w http.ResponseWriter, r *http.Request) {
	if unknownParams(w, r, "limit", "after", "sort", "standby") {
		return
	}
	q := r.URL.Query()
	limit, ok := pageLimit(w, q)
	if !ok {
		return
	}
	after := q.Get("after")
	byTotal := false
	switch sortBy := q.Get("sort"); sortBy {
	case "", "product":
	case "total":
		if q.Has("after") {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "after pages by product; with sort=total ask for up to limit=" + strconv.Itoa(MaxPageSize) + " instead"})
			return
		}
		byTotal = true
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("sort must be product (the default) or total, not %q", sortBy)})
		return
	}
	if q.Has("standby") {
		h.standbyPage(w, r, listOf{}, q.Get("standby"), after, limit, byTotal)
		return
	}
	if byTotal {
		h.top(w, r, limit)
		return
	}
	page, unavailable, err := h.list.Products(after, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	var stale []string
	if !forwarded(r) {
		page, unavailable = h.gather(r.Context(), page, unavailable, after, limit)
		var more []state.Total
		more, stale, unavailable = h.fromStandbys(r.Context(), forwardTimeout, listOf{}, unavailable, after, limit, false)
		page = append(page, more...)
		sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
		if len(page) > limit {
			page = page[:limit]
		}
	}
	if page == nil {
		page = []state.Total{}
	}
	resp := map[string]any{"products": page}
	if len(page) == limit {
		resp["next"] = page[len(page)-1].Product
	}
	if len(unavailable) > 0 {
		resp["unavailable_tasks"] = unavailable
	}
	if len(stale) > 0 {
		resp["stale_tasks"] = stale
	}
	writeJSON(w, http.StatusOK, resp)
}

// listOf names what a list reads: the totals (size 0), or the products of
// the window of size starting at start.
type listOf struct {
	size  time.Duration
	start int64
}

// standbyPage answers GET /v1/products?standby=<task> (and GET
// /v1/windows?standby=<task>, of a window): the products of this
// instance's standby copy of the task, when it runs within
// acceptable.recovery.lag (else 503), with how far behind it may be. Other
// instances ask it for a task whose owner could not answer.
func (h *handler) standbyPage(w http.ResponseWriter, r *http.Request, of listOf, task, after string, limit int, byTotal bool) {
	if !state.IsTaskName(task) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("standby must name a task (0_ and its partition, such as 0_2), not %q", task)})
		return
	}
	if byTotal && after != "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "after pages by product; with sort=total ask for up to limit=" + strconv.Itoa(MaxPageSize) + " instead"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), topGatherTimeout)
	defer cancel()
	page, lag, err := h.readStandby(ctx, of, task, after, limit, byTotal)
	if errors.Is(err, errScanBusy) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if page == nil {
		page = []state.Total{}
	}
	resp := map[string]any{"products": page, "standby": task, "lag": lag}
	if of.size > 0 {
		resp["size"], resp["start"], resp["end"] = sales.FormatWindowSize(of.size), of.start, of.start+of.size.Milliseconds()
	}
	if byTotal {
		resp["sort"] = "total"
	} else if len(page) == limit {
		resp["next"] = page[len(page)-1].Product
	}
	writeJSON(w, http.StatusOK, resp)
}

// readStandby reads this instance's standby copy of task (StandbyPage, or
// StandbyWindowPage of a window); a read of it whole (byTotal) waits its
// turn (scanWhole).
func (h *handler) readStandby(ctx context.Context, of listOf, task, after string, limit int, byTotal bool) (page []state.Total, lag int64, err error) {
	read := func() (err error) {
		if of.size > 0 {
			page, lag, err = h.win.StandbyWindowPage(ctx, task, of.size, of.start, after, limit, byTotal)
		} else {
			page, lag, err = h.list.StandbyPage(ctx, task, after, limit, byTotal)
		}
		return err
	}
	if byTotal {
		err = h.scanWhole(ctx, read)
	} else {
		err = read()
	}
	return page, lag, err
}

// fromStandbys reads the products of the tasks in unavailable from standby
// copies within acceptable.recovery.lag: this instance's, else one of
// another instance that keeps a copy, asked in parallel under timeout. It
// returns what they answered, the tasks answered so (stale by up to the lag)
// and the tasks still unavailable, each sorted.
func (h *handler) fromStandbys(ctx context.Context, timeout time.Duration, of listOf, unavailable []string, after string, limit int, byTotal bool) (page []state.Total, stale, still []string) {
	if len(unavailable) == 0 {
		return nil, nil, unavailable
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	instances := h.list.Instances()
	type answer struct {
		task string
		page []state.Total
		ok   bool
	}
	answers := make(chan answer, len(unavailable))
	var wg sync.WaitGroup
	for _, task := range unavailable {
		wg.Go(func() {
			if got, _, err := h.readStandby(ctx, of, task, after, limit, byTotal); err == nil {
				answers <- answer{task, got, true}
				return
			}
			for _, is := range instances {
				if is.Self || !slices.Contains(is.Standbys, task) {
					continue
				}
				if got, err := h.fw.standbyPage(ctx, h.list.InstanceID(), is, of, task, after, limit, byTotal); err == nil {
					answers <- answer{task, got, true}
					return
				}
			}
			answers <- answer{task: task}
		})
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		if a.ok {
			page = append(page, a.page...)
			stale = append(stale, a.task)
		} else {
			still = append(still, a.task)
		}
	}
	sort.Strings(stale)
	sort.Strings(still)
	return page, stale, still
}

// topGatherTimeout bounds GET /v1/products?sort=total's gathering from
// every instance: each reads all of its stores.
const topGatherTimeout = 20 * time.Second

// top answers GET /v1/products?sort=total&limit=N: the N largest totals
// (equal totals by product) of this instance's running tasks, merged, unless
// the request was forwarded to us, with the N largest of every other
// instance running tasks, asked in parallel under topGatherTimeout. Each
// instance reads its stores whole, one top query at a time (topScans);
// a query waiting for its turn past its deadline gets 503.
func (h *handler) top(w http.ResponseWriter, r *http.Request, limit int) {
	ctx, cancel := context.WithTimeout(r.Context(), topGatherTimeout)
	defer cancel()
	var peers chan pageResult
	if !forwarded(r) {
		peers = h.askPeers(ctx, func(ctx context.Context, is status.Instance) ([]state.Total, []string, error) {
			return h.fw.top(ctx, h.list.InstanceID(), is, limit)
		})
	}
	var top []state.Total
	var unavailable []string
	err := h.scanWhole(ctx, func() (err error) {
		top, unavailable, err = h.list.TopProducts(ctx, limit)
		return err
	})
	if errors.Is(err, errScanBusy) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	if errors.Is(err, context.DeadlineExceeded) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("reading this instance's stores took longer than %s", topGatherTimeout)})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if peers != nil {
		for res := range peers {
			if res.err != nil {
				unavailable = append(unavailable, res.tasks...)
				continue
			}
			top = append(top, res.page...)
			unavailable = append(unavailable, res.unavailable...)
		}
		sort.Strings(unavailable)
		unavailable = slices.Compact(unavailable)
	}
	var stale []string
	if peers != nil {
		var more []state.Total
		more, stale, unavailable = h.fromStandbys(r.Context(), topGatherTimeout, listOf{}, unavailable, "", limit, true)
		top = append(top, more...)
		state.SortByTotal(top)
		if len(top) > limit {
			top = top[:limit]
		}
	}
	if top == nil {
		top = []state.Total{}
	}
	resp := map[string]any{"products": top, "sort": "total"}
	if len(unavailable) > 0 {
		resp["unavailable_tasks"] = unavailable
	}
	if len(stale) > 0 {
		resp["stale_tasks"] = stale
	}
	writeJSON(w, http.StatusOK, resp)
}

// errScanBusy: a query that reads stores whole waited for its turn past its
// deadline.
var errScanBusy = errors.New("another top query is reading this instance's stores; try again")

// scanWhole runs scan, a read of stores whole (a top query of the tasks or
// of a standby copy), once no other one runs on this instance (topScans);
// errScanBusy when ctx ends first.
func (h *handler) scanWhole(ctx context.Context, scan func() error) error {
	select {
	case h.topScans <- struct{}{}:
	case <-ctx.Done():
		return errScanBusy
	}
	defer func() { <-h.topScans }()
	return scan()
}

// pageResult is one other instance's answer to a gathered query: its
// tasks (all unavailable when err is set), what it answered and the tasks
// it said were unavailable.
type pageResult = peerResult[[]state.Total]

// peerResult is one other instance's answer to a gathered query of T.
type peerResult[T any] struct {
	tasks       []string
	page        T
	unavailable []string
	err         error
}

// askPeers asks every other instance running tasks with ask, in parallel,
// and returns their answers on a channel closed after the last.
func (h *handler) askPeers(ctx context.Context, ask func(context.Context, status.Instance) ([]state.Total, []string, error)) chan pageResult {
	return askEach(h, ctx, ask)
}

// askEach asks every other instance running tasks with ask, in parallel,
// and returns their answers on a channel closed after the last.
func askEach[T any](h *handler, ctx context.Context, ask func(context.Context, status.Instance) (T, []string, error)) chan peerResult[T] {
	var peers []status.Instance
	for _, is := range h.list.Instances() {
		if !is.Self && len(is.Tasks) > 0 {
			peers = append(peers, is)
		}
	}
	results := make(chan peerResult[T], len(peers))
	var wg sync.WaitGroup
	for _, is := range peers {
		wg.Go(func() {
			got, unav, err := ask(ctx, is)
			results <- peerResult[T]{tasks: is.Tasks, page: got, unavailable: unav, err: err}
		})
	}
	go func() {
		wg.Wait()
		close(results)
	}()
	return results
}

// pageLimit reads the limit parameter (DefaultPageSize when absent), or
// answers 400 and reports false.
func pageLimit(w http.ResponseWriter, q url.Values) (int, bool) {
	v := q.Get("limit")
	if v == "" {
		return DefaultPageSize, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxPageSize {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("limit must be an integer from 1 to %d", MaxPageSize)})
		return 0, false
	}
	return n, true
}

// unknownParams answers 400 naming the query parameters of r that are not
// among allowed, sorted, and reports whether it did.
func unknownParams(w http.ResponseWriter, r *http.Request, allowed ...string) bool {
	var unknown []string
	for name := range r.URL.Query() {
		if !slices.Contains(allowed, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return false
	}
	sort.Strings(unknown)
	takes := "takes no query parameters"
	if len(allowed) > 0 {
		takes = "takes only " + strings.Join(allowed, ", ")
	}
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("unknown query parameter(s) %s: %s %s", strings.Join(unknown, ", "), r.URL.Path, takes)})
	return true
}

// gather merges this instance's page (and unavailable tasks) with the same
// page of every other instance running tasks: the first limit products, and
// the tasks missing from the page, sorted. An instance that does not answer
// in time has all its tasks unavailable.
func (h *handler) gather(ctx context.Context, page []state.Total, unavailable []string, after string, limit int) ([]state.Total, []string) {
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	for res := range h.askPeers(ctx, func(ctx context.Context, is status.Instance) ([]state.Total, []string, error) {
		return h.fw.page(ctx, h.list.InstanceID(), is, after, limit)
	}) {
		if res.err != nil {
			unavailable = append(unavailable, res.tasks...)
			continue
		}
		page = append(page, res.page...)
		unavailable = append(unavailable, res.unavailable...)
	}
	sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
	if len(page) > limit {
		page = page[:limit]
	}
	sort.Strings(unavailable)
	return page, slices.Compact(unavailable)
}

// product answers GET /v1/products/{product}:
//  1. from this instance's active task;
//  2. else, unless the request was forwarded to us, by one hop to the
//     owner, whose answer is decoded and written again (never relayed as
//     it came) unless it could not give one (it did not answer, or
//     answered 503: restoring);
//  3. else from this instance's standby copy, within
//     acceptable.recovery.lag, marked stale (StandbyLagHeader);
//  4. else, unless forwarded, by one hop to an instance with a standby copy;
//  5. else an error: the owner's 503, or 503 naming an owner that did not
//     answer or advertises no usable address, or this instance's own answer
//     (404 naming the owner, 503 while no owner is known).
//
// A forwarded request is answered where it lands (steps 1, 3, 5): never
// forwarded again, so there are no loops. It is forwarded by another
// salesagg instance, or by a Kafka Streams instance of the same streams
// group (forwardedHere).
func (h *handler) product(w http.ResponseWriter, r *http.Request, product string) {
	b := h.query
	task := b.TaskOf(product)
	servedBy := b.InstanceID() + "; task=" + task
	total, ok, err := b.Total(product)
	if err == nil {
		w.Header().Set(ServedByHeader, servedBy)
		writeTotal(w, product, total, ok, nil)
		return
	}
	var nh *NotHostedError
	var ownerAnswer *answer
	ownerFailed := false
	if errors.As(err, &nh) && nh.Server != "" && !forwardedHere(r) {
		a, err := h.fw.ask(r.Context(), b.InstanceID(), nh.Owner, nh.Server, product, task)
		if err != nil {
			ownerFailed = true
		} else if a.code != http.StatusServiceUnavailable {
			a.write(w)
			return
		} else {
			ownerAnswer = a
		}
	}
	if st, ok, lag, serr := b.StandbyTotal(product); serr == nil {
		w.Header().Set(ServedByHeader, servedBy+"; standby")
		w.Header().Set(StandbyLagHeader, strconv.FormatInt(lag, 10))
		writeTotal(w, product, st, ok, &lag)
		return
	}
	if !forwardedHere(r) && h.askStandbys(w, r, product, task) {
		return
	}
	switch {
	case ownerAnswer != nil:
		ownerAnswer.write(w)
	case ownerFailed:
		// What went wrong stays in this instance's log: the answer names
		// the owner, not the dial error.
		writeOwnerFailed(w, servedBy, nh)
	default:
		w.Header().Set(ServedByHeader, servedBy)
		writeError(w, err)
	}
}

// forwardedHere reports whether a product query was forwarded to this
// instance: by a salesagg instance (ForwardedHeader) or by the Kafka Streams
// reference (bench/kstreams-reference) in a streams group shared with it,
// which asks GET /v1/products/{product}?local=1 (and &stale=1 for a standby
// copy, which this instance answers from when it has no active one anyway).
func forwardedHere(r *http.Request) bool {
	return forwarded(r) || r.URL.Query().Get("local") == "1"
}

// writeOwnerFailed answers 503 naming the owner of nh's task, which did
// not answer a forwarded query.
func writeOwnerFailed(w http.ResponseWriter, servedBy string, nh *NotHostedError) {
	w.Header().Set(ServedByHeader, servedBy)
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{
		"error": fmt.Sprintf("the owner of task %s, %s, did not answer", nh.Task, nh.Owner),
		"task":  nh.Task, "partition": nh.Partition, "owner": nh.Owner,
	})
}

// askStandbys forwards a product's query to the instances with a standby
// copy of its task, in turn, and writes the first answer for the product
// (its total, or 404 unknown); false when none gave one.
func (h *handler) askStandbys(w http.ResponseWriter, r *http.Request, product, task string) bool {
	for _, peer := range h.query.StandbyServers(product) {
		a, err := h.fw.ask(r.Context(), h.query.InstanceID(), peer.Name, peer.Server, product, task)
		if err == nil && (a.code == http.StatusOK || a.code == http.StatusNotFound) {
			a.write(w)
			return true
		}
	}
	return false
}

// writeTotal writes a product's total (404 when unknown); staleBy, when not
// nil, marks an answer from a standby copy.
func writeTotal(w http.ResponseWriter, product string, total int64, ok bool, staleBy *int64) {
	var body map[string]any
	code := http.StatusOK
	if ok {
		body = map[string]any{"product": product, "total": total}
	} else {
		code = http.StatusNotFound
		body = map[string]any{"error": "unknown product", "product": product}
	}
	if staleBy != nil {
		body["stale"] = true
		body["standby_lag"] = *staleBy
	}
	writeJSON(w, code, body)
}

// writeError answers a failed query. A product whose task runs on another
// member is 404 with the task and the owner (ask it instead); 503 with
// Retry-After when no owner is known yet (a rebalance), the owner cannot be
// asked, or the error is ErrUnavailable (the task is not ready here); any
// other error is 500.
func writeError(w http.ResponseWriter, err error) {
	var nh *NotHostedError
	if errors.As(err, &nh) {
		body := map[string]any{"error": err.Error(), "task": nh.Task, "partition": nh.Partition}
		if nh.Owner != "" && nh.Unroutable != "" {
			body["owner"] = nh.Owner
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, body)
			return
		}
		if nh.Owner != "" {
			body["owner"] = nh.Owner
			writeJSON(w, http.StatusNotFound, body)
			return
		}
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	code := http.StatusInternalServerError
	if errors.Is(err, ErrBadQuery) {
		code = http.StatusBadRequest
	}
	if errors.Is(err, ErrUnavailable) {
		code = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
