package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// Windower is what the window queries read: GET
// /v1/products/{product}/windows from the product's task (here, or
// forwarded to its owner) and GET /v1/windows gathered from every
// instance.
type Windower interface {
	// WindowSizes are the configured window sizes.
	WindowSizes() []time.Duration
	// ProductWindows returns the product's windows of size starting from
	// from to to (ms), as Total does its total: a NotHostedError when
	// another member runs its task.
	ProductWindows(product string, size time.Duration, from, to int64) ([]state.WindowTotal, error)
	// StandbyWindows answers the same from this instance's standby copy of
	// the product's task, within acceptable.recovery.lag; lag is how many
	// changelog records it may be behind.
	StandbyWindows(product string, size time.Duration, from, to int64) ([]state.WindowTotal, int64, error)
	// WindowPage lists up to limit products of the window of size starting
	// at start, after the product after, from this instance's running
	// tasks; unavailable names those not running.
	WindowPage(size time.Duration, start int64, after string, limit int) ([]state.Total, []string, error)
	// WindowTop lists the limit largest totals of that window over this
	// instance's running tasks, each read whole; unavailable as
	// WindowPage's.
	WindowTop(ctx context.Context, size time.Duration, start int64, limit int) ([]state.Total, []string, error)
	// WindowStarts lists up to limit starts of the windows of size this
	// instance's running tasks hold, from from on; unavailable as
	// WindowPage's.
	WindowStarts(size time.Duration, from int64, limit int) ([]int64, []string, error)
	// StandbyWindowPage lists that window's products from this instance's
	// standby copy of task (as StandbyPage the totals').
	StandbyWindowPage(ctx context.Context, task string, size time.Duration, start int64, after string, limit int, byTotal bool) ([]state.Total, int64, error)
}

// defaultWindows is how many windows a product's window query spans
// without from.
const defaultWindows = 24

// windowSize reads the size parameter: required, as FormatWindowSize
// writes a size (1h, 15m, 90s, 1500ms) or any Go duration.
func windowSize(q url.Values) (time.Duration, error) {
	v := q.Get("size")
	if v == "" {
		return 0, errors.New("size is required: a window size of windows.sizes, such as 1h")
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("size must be a window size such as 1h or 15m, not %q", v)
	}
	return d, nil
}

// timeParam reads a time parameter: epoch milliseconds or RFC 3339; def
// when absent.
func timeParam(q url.Values, name string, def int64) (int64, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return ms, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UnixMilli(), nil
	}
	return 0, fmt.Errorf("%s must be epoch milliseconds or an RFC 3339 time, not %q", name, v)
}

// windowJSON is one window in an answer.
type windowJSON struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	Total int64 `json:"total"`
}

// productWindows answers GET /v1/products/{product}/windows?size=&from=&to=:
// the product's windows of size starting from from to to (epoch ms or
// RFC 3339; by default the 24 windows up to now), as Kafka Streams'
// WindowStore.fetch(key, from, to). Another member's product is forwarded
// to its owner; a standby copy answers when the owner cannot
// (answerWindows).
func (h *handler) productWindows(w http.ResponseWriter, r *http.Request) {
	if unknownParams(w, r, "size", "from", "to") {
		return
	}
	product := r.PathValue("product")
	q := r.URL.Query()
	size, err := windowSize(q)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	to, err := timeParam(q, "to", time.Now().UnixMilli())
	if err == nil {
		var from int64
		from, err = timeParam(q, "from", to-defaultWindows*size.Milliseconds()+1)
		if err == nil && from > to {
			err = fmt.Errorf("from (%d) is after to (%d)", from, to)
		}
		if err == nil {
			h.answerWindows(w, r, product, size, from, to)
			return
		}
	}
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
}

// answerWindows answers a product's window query as product answers its
// total: from this instance's task; else, unless forwarded, by one hop to
// the owner (its answer relayed unless it is a 503 or none came); else
// from this instance's standby copy within acceptable.recovery.lag, marked
// stale; else, unless forwarded, by one hop to an instance with a standby
// copy; else the owner's 503, a 503 naming an owner that did not answer,
// or this instance's own error.
func (h *handler) answerWindows(w http.ResponseWriter, r *http.Request, product string, size time.Duration, from, to int64) {
	task := h.query.TaskOf(product)
	servedBy := h.query.InstanceID() + "; task=" + task
	ws, err := h.win.ProductWindows(product, size, from, to)
	if err == nil {
		w.Header().Set(ServedByHeader, servedBy)
		writeWindows(w, product, size, from, to, ws, nil)
		return
	}
	var nh *NotHostedError
	var ownerAnswer *windowAnswer
	ownerFailed := false
	if errors.As(err, &nh) && nh.Server != "" && nh.Unroutable == "" && !forwarded(r) {
		a, ferr := h.askWindows(r, nh.Owner, nh.Server, product, task)
		switch {
		case ferr != nil:
			ownerFailed = true
		case a.code != http.StatusServiceUnavailable:
			a.write(w)
			return
		default:
			ownerAnswer = a
		}
	}
	if sws, lag, serr := h.win.StandbyWindows(product, size, from, to); serr == nil {
		w.Header().Set(ServedByHeader, servedBy+"; standby")
		w.Header().Set(StandbyLagHeader, strconv.FormatInt(lag, 10))
		writeWindows(w, product, size, from, to, sws, &lag)
		return
	}
	if !forwarded(r) {
		for _, peer := range h.query.StandbyServers(product) {
			if a, err := h.askWindows(r, peer.Name, peer.Server, product, task); err == nil && a.code == http.StatusOK {
				a.write(w)
				return
			}
		}
	}
	switch {
	case ownerAnswer != nil:
		ownerAnswer.write(w)
	case ownerFailed:
		writeOwnerFailed(w, servedBy, nh)
	default:
		w.Header().Set(ServedByHeader, servedBy)
		writeError(w, err)
	}
}

// writeWindows writes a product's windows; staleBy, when not nil, marks an
// answer from a standby copy.
func writeWindows(w http.ResponseWriter, product string, size time.Duration, from, to int64, ws []state.WindowTotal, staleBy *int64) {
	out := make([]windowJSON, 0, len(ws))
	for _, wt := range ws {
		out = append(out, windowJSON{Start: wt.Start, End: wt.Start + size.Milliseconds(), Total: wt.Total})
	}
	body := map[string]any{"product": product, "size": sales.FormatWindowSize(size), "from": from, "to": to, "windows": out}
	if staleBy != nil {
		body["stale"] = true
		body["standby_lag"] = *staleBy
	}
	writeJSON(w, http.StatusOK, body)
}

// windowAnswer is another instance's answer to a product's window query,
// checked and kept as it came.
type windowAnswer struct {
	code     int
	body     []byte
	servedBy string
	// lag is set when the answer came from a standby copy.
	lag *int64
}

// askWindows forwards r, a product's window query, to the instance name
// at server: one hop, bounded by forwardTimeout, marked forwarded. It
// returns an error for an answer that is not JSON, or a 200 that is not
// the product's windows.
func (h *handler) askWindows(r *http.Request, name, server, product, task string) (*windowAnswer, error) {
	ctx, cancel := context.WithTimeout(r.Context(), forwardTimeout)
	defer cancel()
	req, err := h.fw.request(ctx, h.query.InstanceID(), server, r.URL.Path, r.URL.RawPath, r.URL.Query())
	var code int
	var body []byte
	if err == nil {
		code, body, err = h.fw.do(req, 8<<20)
	}
	var got struct {
		Product *string      `json:"product"`
		Windows []windowJSON `json:"windows"`
		Stale   bool         `json:"stale"`
		Lag     *int64       `json:"standby_lag"`
	}
	if err == nil {
		if jerr := json.Unmarshal(body, &got); jerr != nil {
			err = fmt.Errorf("answer %d is not JSON: %w", code, jerr)
		} else if code == http.StatusOK && (got.Product == nil || *got.Product != product || got.Windows == nil || got.Stale != (got.Lag != nil)) {
			err = fmt.Errorf("answer %d is not an answer for product %q's windows", code, product)
		}
	}
	if err != nil {
		h.fw.failed(name, server, err)
		return nil, err
	}
	a := &windowAnswer{code: code, body: body, servedBy: name + "; task=" + task}
	if code == http.StatusOK && got.Stale {
		a.servedBy += "; standby"
		a.lag = got.Lag
	}
	return a, nil
}

// write writes the answer as it came, with this instance's headers.
func (a *windowAnswer) write(w http.ResponseWriter) {
	w.Header().Set(ServedByHeader, a.servedBy)
	if a.lag != nil {
		w.Header().Set(StandbyLagHeader, strconv.FormatInt(*a.lag, 10))
	}
	if a.code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.code)
	_, _ = w.Write(a.body)
}

// windowPage answers GET /v1/windows?size=&start=&after=&limit=: the
// products of one window of size (start: epoch ms or RFC 3339 within it,
// by default now), paged by product and gathered from every instance as
// GET /v1/products is, a task whose owner cannot answer read from a
// standby copy (stale_tasks); with sort=total (no after) the limit
// largest; with standby=<task>, this instance's standby copy of the task.
func (h *handler) windowPage(w http.ResponseWriter, r *http.Request) {
	if unknownParams(w, r, "size", "start", "after", "limit", "sort", "standby") {
		return
	}
	q := r.URL.Query()
	size, err := windowSize(q)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	at, err := timeParam(q, "start", time.Now().UnixMilli())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	of := listOf{size: size, start: sales.WindowStart(at, size.Milliseconds())}
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
		h.standbyPage(w, r, of, q.Get("standby"), after, limit, byTotal)
		return
	}
	if byTotal {
		h.windowTop(w, r, of, limit)
		return
	}
	page, unavailable, err := h.win.WindowPage(size, of.start, after, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	var stale []string
	if !forwarded(r) {
		ctx, cancel := context.WithTimeout(r.Context(), forwardTimeout)
		for res := range h.askPeers(ctx, func(ctx context.Context, is status.Instance) ([]state.Total, []string, error) {
			return h.fw.windowPage(ctx, h.list.InstanceID(), is, size, of.start, "", after, limit, false)
		}) {
			if res.err != nil {
				unavailable = append(unavailable, res.tasks...)
				continue
			}
			page = append(page, res.page...)
			unavailable = append(unavailable, res.unavailable...)
		}
		cancel()
		sort.Strings(unavailable)
		var more []state.Total
		more, stale, unavailable = h.fromStandbys(r.Context(), forwardTimeout, of, slices.Compact(unavailable), after, limit, false)
		page = append(page, more...)
		sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
		if len(page) > limit {
			page = page[:limit]
		}
	}
	if page == nil {
		page = []state.Total{}
	}
	resp := map[string]any{"size": sales.FormatWindowSize(size), "start": of.start, "end": of.start + size.Milliseconds(), "products": page}
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

// windowTop answers GET /v1/windows?sort=total: the limit largest totals
// of one window, this instance's stores read whole (one such read at a
// time, as GET /v1/products?sort=total), with every other instance's, and
// standby copies' for the tasks whose owner could not answer.
func (h *handler) windowTop(w http.ResponseWriter, r *http.Request, of listOf, limit int) {
	ctx, cancel := context.WithTimeout(r.Context(), topGatherTimeout)
	defer cancel()
	var peers chan pageResult
	if !forwarded(r) {
		peers = h.askPeers(ctx, func(ctx context.Context, is status.Instance) ([]state.Total, []string, error) {
			return h.fw.windowPage(ctx, h.list.InstanceID(), is, of.size, of.start, "", "", limit, true)
		})
	}
	var top []state.Total
	var unavailable, stale []string
	err := h.scanWhole(ctx, func() (err error) {
		top, unavailable, err = h.win.WindowTop(ctx, of.size, of.start, limit)
		return err
	})
	switch {
	case errors.Is(err, errScanBusy):
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	case errors.Is(err, context.DeadlineExceeded):
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("reading this instance's stores took longer than %s", topGatherTimeout)})
		return
	case err != nil:
		writeError(w, err)
		return
	}
	if peers != nil { // nil when forwarded: this instance's stores only
		for res := range peers {
			if res.err != nil {
				unavailable = append(unavailable, res.tasks...)
				continue
			}
			top = append(top, res.page...)
			unavailable = append(unavailable, res.unavailable...)
		}
		sort.Strings(unavailable)
		var more []state.Total
		more, stale, unavailable = h.fromStandbys(ctx, topGatherTimeout, of, slices.Compact(unavailable), "", limit, true)
		top = append(top, more...)
	}
	state.SortByTotal(top)
	if len(top) > limit {
		top = top[:limit]
	}
	sort.Strings(unavailable)
	if top == nil {
		top = []state.Total{}
	}
	resp := map[string]any{"size": sales.FormatWindowSize(of.size), "start": of.start, "end": of.start + of.size.Milliseconds(), "products": top, "sort": "total"}
	if len(unavailable) > 0 {
		resp["unavailable_tasks"] = unavailable
	}
	if len(stale) > 0 {
		resp["stale_tasks"] = stale
	}
	writeJSON(w, http.StatusOK, resp)
}

// windowPage reads one page of GET /v1/windows from another instance (with
// byTotal, its limit largest totals; with standby, of its standby copy of
// that task).
func (f *forwarder) windowPage(ctx context.Context, self string, is status.Instance, size time.Duration, start int64, standby, after string, limit int, byTotal bool) ([]state.Total, []string, error) {
	q := url.Values{"size": {sales.FormatWindowSize(size)}, "start": {strconv.FormatInt(start, 10)}, "limit": {strconv.Itoa(limit)}}
	if standby != "" {
		q.Set("standby", standby)
	}
	if after != "" {
		q.Set("after", after)
	}
	if byTotal {
		q.Set("sort", "total")
	}
	req, err := f.request(ctx, self, is.Server, "/v1/windows", "", q)
	if err != nil {
		f.failed(is.Name, is.Server, err)
		return nil, nil, err
	}
	var got struct {
		Start       int64         `json:"start"`
		Products    []state.Total `json:"products"`
		Unavailable []string      `json:"unavailable_tasks"`
		Standby     string        `json:"standby"`
	}
	code, body, err := f.do(req, 8<<20)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/windows?%s answered %d", q.Encode(), code)
	}
	if err == nil {
		err = json.Unmarshal(body, &got)
	}
	if err == nil && got.Start != start {
		err = fmt.Errorf("GET /v1/windows?%s answered window %d", q.Encode(), got.Start)
	}
	if err == nil && got.Standby != standby {
		err = fmt.Errorf("GET /v1/windows?%s answered for standby %q", q.Encode(), got.Standby)
	}
	if err == nil && !byTotal {
		err = checkPage(got.Products, got.Unavailable, after, limit)
	}
	if err == nil && byTotal && len(got.Products) > limit {
		err = fmt.Errorf("GET /v1/windows?%s answered %d products, more than %d", q.Encode(), len(got.Products), limit)
	}
	if err != nil {
		f.failed(is.Name, is.Server, err)
		return nil, nil, err
	}
	return got.Products, got.Unavailable, nil
}

// windowStarts answers GET /v1/windows/starts?size=&from=&limit=: the
// starts of the windows of size the stores hold, from from (epoch ms or
// RFC 3339; default 0) on, sorted and each once, up to limit, gathered
// from every instance; next is the from of the next page.
// unavailable_tasks names the tasks whose windows could not be listed.
func (h *handler) windowStarts(w http.ResponseWriter, r *http.Request) {
	if unknownParams(w, r, "size", "from", "limit") {
		return
	}
	q := r.URL.Query()
	size, err := windowSize(q)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	from, err := timeParam(q, "from", 0)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	limit, ok := pageLimit(w, q)
	if !ok {
		return
	}
	starts, unavailable, err := h.win.WindowStarts(size, from, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	if !forwarded(r) {
		ctx, cancel := context.WithTimeout(r.Context(), forwardTimeout)
		for res := range askEach(h, ctx, func(ctx context.Context, is status.Instance) ([]int64, []string, error) {
			return h.fw.windowStarts(ctx, h.list.InstanceID(), is, size, from, limit)
		}) {
			if res.err != nil {
				unavailable = append(unavailable, res.tasks...)
				continue
			}
			starts = append(starts, res.page...)
			unavailable = append(unavailable, res.unavailable...)
		}
		cancel()
		slices.Sort(starts)
		starts = slices.Compact(starts)
		if len(starts) > limit {
			starts = starts[:limit]
		}
		sort.Strings(unavailable)
		unavailable = slices.Compact(unavailable)
	}
	if starts == nil {
		starts = []int64{}
	}
	resp := map[string]any{"size": sales.FormatWindowSize(size), "starts": starts}
	if len(starts) == limit {
		resp["next"] = starts[len(starts)-1] + 1
	}
	if len(unavailable) > 0 {
		resp["unavailable_tasks"] = unavailable
	}
	writeJSON(w, http.StatusOK, resp)
}

// windowStarts reads GET /v1/windows/starts from another instance.
func (f *forwarder) windowStarts(ctx context.Context, self string, is status.Instance, size time.Duration, from int64, limit int) ([]int64, []string, error) {
	q := url.Values{"size": {sales.FormatWindowSize(size)}, "from": {strconv.FormatInt(from, 10)}, "limit": {strconv.Itoa(limit)}}
	req, err := f.request(ctx, self, is.Server, "/v1/windows/starts", "", q)
	if err != nil {
		f.failed(is.Name, is.Server, err)
		return nil, nil, err
	}
	var got struct {
		Starts      []int64  `json:"starts"`
		Unavailable []string `json:"unavailable_tasks"`
	}
	code, body, err := f.do(req, 1<<20)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/windows/starts?%s answered %d", q.Encode(), code)
	}
	if err == nil {
		err = json.Unmarshal(body, &got)
	}
	if err == nil && len(got.Starts) > limit {
		err = fmt.Errorf("GET /v1/windows/starts?%s answered %d starts, more than %d", q.Encode(), len(got.Starts), limit)
	}
	for _, s := range got.Starts {
		if err == nil && s < from {
			err = fmt.Errorf("GET /v1/windows/starts?%s answered start %d, before %d", q.Encode(), s, from)
		}
	}
	if err == nil {
		err = checkPage(nil, got.Unavailable, "", limit)
	}
	if err != nil {
		f.failed(is.Name, is.Server, err)
		return nil, nil, err
	}
	return got.Starts, got.Unavailable, nil
}
