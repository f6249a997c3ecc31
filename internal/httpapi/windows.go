package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
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
	// WindowPage lists up to limit products of the window of size starting
	// at start, after the product after, from this instance's running
	// tasks; unavailable names those not running.
	WindowPage(size time.Duration, start int64, after string, limit int) ([]state.Total, []string, error)
	// WindowTop lists the limit largest totals of that window over this
	// instance's running tasks, each read whole; unavailable as
	// WindowPage's.
	WindowTop(ctx context.Context, size time.Duration, start int64, limit int) ([]state.Total, []string, error)
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
// to its owner; standby copies keep no windows, so there is no standby
// answer.
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

func (h *handler) answerWindows(w http.ResponseWriter, r *http.Request, product string, size time.Duration, from, to int64) {
	task := h.query.TaskOf(product)
	servedBy := h.query.InstanceID() + "; task=" + task
	ws, err := h.win.ProductWindows(product, size, from, to)
	var nh *NotHostedError
	if errors.As(err, &nh) && nh.Server != "" && nh.Unroutable == "" && !forwarded(r) {
		h.forwardWindows(w, r, nh)
		return
	}
	w.Header().Set(ServedByHeader, servedBy)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]windowJSON, 0, len(ws))
	for _, wt := range ws {
		out = append(out, windowJSON{Start: wt.Start, End: wt.Start + size.Milliseconds(), Total: wt.Total})
	}
	writeJSON(w, http.StatusOK, map[string]any{"product": product, "size": sales.FormatWindowSize(size), "from": from, "to": to, "windows": out})
}

// forwardWindows asks the owner of the product's task the same query and
// writes its answer (a JSON object), or 503 naming the owner.
func (h *handler) forwardWindows(w http.ResponseWriter, r *http.Request, nh *NotHostedError) {
	ctx, cancel := context.WithTimeout(r.Context(), forwardTimeout)
	defer cancel()
	req, err := h.fw.request(ctx, h.query.InstanceID(), nh.Server, r.URL.Path, r.URL.RawPath, r.URL.Query())
	var code int
	var body []byte
	if err == nil {
		code, body, err = h.fw.do(req, 8<<20)
	}
	if err == nil && !json.Valid(body) {
		err = fmt.Errorf("answer %d is not JSON", code)
	}
	if err != nil {
		h.fw.failed(nh.Owner, nh.Server, err)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{
			"error": fmt.Sprintf("the owner of task %s, %s, did not answer", nh.Task, nh.Owner),
			"task":  nh.Task, "partition": nh.Partition, "owner": nh.Owner,
		})
		return
	}
	w.Header().Set(ServedByHeader, nh.Owner+"; task="+nh.Task)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// windowPage answers GET /v1/windows?size=&start=&after=&limit=: the
// products of one window of size (start: epoch ms or RFC 3339 within it,
// by default now), paged by product and gathered from every instance as
// GET /v1/products is; with sort=total (no after) the limit largest.
func (h *handler) windowPage(w http.ResponseWriter, r *http.Request) {
	if unknownParams(w, r, "size", "start", "after", "limit", "sort") {
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
	start := sales.WindowStart(at, size.Milliseconds())
	limit, ok := pageLimit(w, q)
	if !ok {
		return
	}
	after := q.Get("after")
	switch sortBy := q.Get("sort"); sortBy {
	case "", "product":
	case "total":
		if q.Has("after") {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "after pages by product; with sort=total ask for up to limit=" + strconv.Itoa(MaxPageSize) + " instead"})
			return
		}
		h.windowTop(w, r, size, start, limit)
		return
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("sort must be product (the default) or total, not %q", sortBy)})
		return
	}
	page, unavailable, err := h.win.WindowPage(size, start, after, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	if !forwarded(r) {
		ctx, cancel := context.WithTimeout(r.Context(), forwardTimeout)
		for res := range h.askPeers(ctx, func(ctx context.Context, is status.Instance) ([]state.Total, []string, error) {
			return h.fw.windowPage(ctx, h.list.InstanceID(), is, size, start, after, limit, false)
		}) {
			if res.err != nil {
				unavailable = append(unavailable, res.tasks...)
				continue
			}
			page = append(page, res.page...)
			unavailable = append(unavailable, res.unavailable...)
		}
		cancel()
		sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
		if len(page) > limit {
			page = page[:limit]
		}
		sort.Strings(unavailable)
	}
	if page == nil {
		page = []state.Total{}
	}
	resp := map[string]any{"size": sales.FormatWindowSize(size), "start": start, "end": start + size.Milliseconds(), "products": page}
	if len(page) == limit {
		resp["next"] = page[len(page)-1].Product
	}
	if len(unavailable) > 0 {
		resp["unavailable_tasks"] = unavailable
	}
	writeJSON(w, http.StatusOK, resp)
}

// windowTop answers GET /v1/windows?sort=total: the limit largest totals
// of one window, this instance's stores read whole (one such read at a
// time, as GET /v1/products?sort=total), with every other instance's.
func (h *handler) windowTop(w http.ResponseWriter, r *http.Request, size time.Duration, start int64, limit int) {
	ctx, cancel := context.WithTimeout(r.Context(), topGatherTimeout)
	defer cancel()
	var peers chan pageResult
	if !forwarded(r) {
		peers = h.askPeers(ctx, func(ctx context.Context, is status.Instance) ([]state.Total, []string, error) {
			return h.fw.windowPage(ctx, h.list.InstanceID(), is, size, start, "", limit, true)
		})
	}
	var top []state.Total
	var unavailable []string
	err := h.scanWhole(ctx, func() (err error) {
		top, unavailable, err = h.win.WindowTop(ctx, size, start, limit)
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
	}
	state.SortByTotal(top)
	if len(top) > limit {
		top = top[:limit]
	}
	sort.Strings(unavailable)
	if top == nil {
		top = []state.Total{}
	}
	resp := map[string]any{"size": sales.FormatWindowSize(size), "start": start, "end": start + size.Milliseconds(), "products": top, "sort": "total"}
	if len(unavailable) > 0 {
		resp["unavailable_tasks"] = unavailable
	}
	writeJSON(w, http.StatusOK, resp)
}

// windowPage reads one page of GET /v1/windows from another instance (with
// byTotal, its limit largest totals).
func (f *forwarder) windowPage(ctx context.Context, self string, is status.Instance, size time.Duration, start int64, after string, limit int, byTotal bool) ([]state.Total, []string, error) {
	q := url.Values{"size": {sales.FormatWindowSize(size)}, "start": {strconv.FormatInt(start, 10)}, "limit": {strconv.Itoa(limit)}}
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
