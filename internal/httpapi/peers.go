package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// Forwarding between instances.
//
// Nothing another member says is trusted as an address, a path or markup:
// its application.server must be host:port (config.CheckServer) or it is
// not asked; the URL is built with net/url from that host and the escaped
// product; no redirect is followed; the answer must be JSON of the expected
// shape, and what this instance sends on is written from the decoded
// fields, with its own headers (X-Served-By names the member it asked).
// Errors of the hop (a dial error names addresses and ports) go to the log,
// not to the client.

// forwarder asks other instances.
type forwarder struct {
	cl     *http.Client
	g      *guard
	scheme string
	log    *zap.Logger
	mu     sync.Mutex           // guards logged
	logged map[string]time.Time // guarded by mu: when a peer's failure was last logged
}

// errNotFollowed is a redirect another instance answered: never followed.
var errNotFollowed = errors.New("httpapi: an instance answered with a redirect")

func newForwarder(g *guard, log *zap.Logger) *forwarder {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = g.peerTLS()
	tr.MaxIdleConnsPerHost = 16
	tr.Proxy = nil // instances talk to each other directly
	return &forwarder{
		cl: &http.Client{Timeout: forwardTimeout, Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return errNotFollowed
		}},
		g: g, scheme: g.sec.Scheme(), log: log, logged: map[string]time.Time{},
	}
}

// escapeSegment escapes s as one path segment, "." and ".." included (as
// %2E), so that no server along the way takes it for a dot segment.
func escapeSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

// request builds a GET to server (checked as host:port) for path, whose
// last segment escaped is rawLast ("" when path has none to escape).
func (f *forwarder) request(ctx context.Context, self, server, path, rawPath string, q url.Values) (*http.Request, error) {
	if err := config.CheckServer(server); err != nil {
		return nil, fmt.Errorf("not forwarding to %q: %w", server, err)
	}
	u := url.URL{Scheme: f.scheme, Host: server, Path: path, RawPath: rawPath, RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(ForwardedHeader, self)
	req.Header.Set("Accept", "application/json")
	f.g.authorize(req)
	return req, nil
}

// do sends req and returns the status and up to limit bytes of a JSON body.
func (f *forwarder) do(req *http.Request, limit int64) (int, []byte, error) {
	resp, err := f.cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return 0, nil, fmt.Errorf("%w (%s)", errNotFollowed, resp.Status)
	}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return 0, nil, fmt.Errorf("answer of type %q, not application/json (%s)", resp.Header.Get("Content-Type"), resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, body, nil
}

// failed logs a failed hop, at most once a minute per peer.
func (f *forwarder) failed(name, server string, err error) {
	f.mu.Lock()
	last := f.logged[server]
	now := time.Now()
	if now.Sub(last) < time.Minute {
		f.mu.Unlock()
		return
	}
	f.logged[server] = now
	f.mu.Unlock()
	f.log.Warn("Forwarding to another instance failed", zap.String("instance", name), zap.String("server", server), zap.Error(err))
}

// answer is another instance's answer to a product query, decoded.
type answer struct {
	code    int
	product string
	total   int64
	// stale, lag: from a standby copy, this far behind.
	stale bool
	lag   int64
	// servedBy is what X-Served-By says: the member asked, the task.
	servedBy string
	// task, owner name the task and the member asked, for a 503.
	task, owner string
}

// ask forwards a product query to the member name at server: one hop,
// bounded by forwardTimeout, marked forwarded so that it is answered where
// it lands. It returns an error for anything but a 200 or 404 with the
// product's answer, or a 503 (not ready).
func (f *forwarder) ask(ctx context.Context, self, name, server, product, task string) (*answer, error) {
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	req, err := f.request(ctx, self, server, productsPrefix+product, productsPrefix+escapeSegment(product), nil)
	if err != nil {
		f.failed(name, server, err)
		return nil, err
	}
	code, body, err := f.do(req, 64<<10)
	if err == nil {
		var a *answer
		if a, err = decodeAnswer(code, body, product); err == nil {
			a.task, a.owner = task, name
			a.servedBy = name + "; task=" + task
			if a.stale {
				a.servedBy += "; standby"
			}
			return a, nil
		}
	}
	f.failed(name, server, err)
	return nil, err
}

// decodeAnswer checks an instance's answer to a query for product.
func decodeAnswer(code int, body []byte, product string) (*answer, error) {
	var got struct {
		Product *string `json:"product"`
		Total   *int64  `json:"total"`
		Stale   bool    `json:"stale"`
		Lag     *int64  `json:"standby_lag"`
		Error   string  `json:"error"`
		Owner   string  `json:"owner"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		return nil, fmt.Errorf("answer %d is not the expected JSON: %w", code, err)
	}
	a := &answer{code: code, product: product, stale: got.Stale}
	if got.Lag != nil {
		a.lag = *got.Lag
	}
	switch {
	case code == http.StatusOK && got.Product != nil && *got.Product == product && got.Total != nil && (!got.Stale || got.Lag != nil):
		a.total = *got.Total
	case code == http.StatusNotFound && got.Product != nil && *got.Product == product && got.Owner == "":
		// The owner does not know the product.
	case code == http.StatusServiceUnavailable:
		a.stale = false
	default:
		return nil, fmt.Errorf("answer %d is not an answer for product %q", code, product)
	}
	return a, nil
}

// write writes the answer again, from its decoded fields.
func (a *answer) write(w http.ResponseWriter) {
	w.Header().Set(ServedByHeader, a.servedBy)
	switch a.code {
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{
			"error": fmt.Sprintf("task %s is not ready on its owner, %s (restoring)", a.task, a.owner),
			"task":  a.task, "owner": a.owner,
		})
		return
	case http.StatusOK:
		if a.stale {
			w.Header().Set(StandbyLagHeader, strconv.FormatInt(a.lag, 10))
		}
		var lag *int64
		if a.stale {
			lag = &a.lag
		}
		writeTotal(w, a.product, a.total, true, lag)
	default:
		var lag *int64
		if a.stale {
			lag = &a.lag
		}
		writeTotal(w, a.product, 0, false, lag)
	}
}

// productsAnswer is another instance's answer to GET /v1/products.
type productsAnswer struct {
	Products    []state.Total `json:"products"`
	Unavailable []string      `json:"unavailable_tasks"`
	Sort        string        `json:"sort"`
	Standby     string        `json:"standby"`
}

// products asks another instance for GET /v1/products with q and checks
// its answer: 200, a page of at most limit products after after, and what
// check (when set) requires of it. A failure is recorded against the
// instance, but a 503 to a standby read (its copy cannot answer, for now).
func (f *forwarder) products(ctx context.Context, self string, is status.Instance, q url.Values, after string, limit int, check func(productsAnswer) error) (productsAnswer, error) {
	var got productsAnswer
	what := "GET /v1/products?" + q.Encode()
	req, err := f.request(ctx, self, is.Server, "/v1/products", "", q)
	if err != nil {
		f.failed(is.Name, is.Server, err)
		return got, err
	}
	code, body, err := f.do(req, 8<<20)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%s answered %d", what, code)
	}
	if err == nil {
		err = json.Unmarshal(body, &got)
	}
	if err == nil && check != nil {
		err = check(got)
	}
	if err == nil {
		err = checkPage(got.Products, got.Unavailable, after, limit)
	}
	if err != nil && !(code == http.StatusServiceUnavailable && q.Has("standby")) {
		f.failed(is.Name, is.Server, err)
	}
	return got, err
}

// page reads one page of GET /v1/products from another instance.
func (f *forwarder) page(ctx context.Context, self string, is status.Instance, after string, limit int) ([]state.Total, []string, error) {
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if after != "" {
		q.Set("after", after)
	}
	got, err := f.products(ctx, self, is, q, after, limit, nil)
	if err != nil {
		return nil, nil, err
	}
	return got.Products, got.Unavailable, nil
}

// top reads the limit largest totals of another instance's running tasks
// (GET /v1/products?sort=total). An answer that does not say it is sorted
// by total (an instance of a version before sort=total) is refused: its
// tasks are unavailable rather than wrongly merged.
func (f *forwarder) top(ctx context.Context, self string, is status.Instance, limit int) ([]state.Total, []string, error) {
	q := url.Values{"limit": {strconv.Itoa(limit)}, "sort": {"total"}}
	got, err := f.products(ctx, self, is, q, "", limit, func(a productsAnswer) error {
		if a.Sort != "total" {
			return fmt.Errorf("GET /v1/products?sort=total answered a page sorted by %q", cmp.Or(a.Sort, "product"))
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return got.Products, got.Unavailable, nil
}

// standbyPage reads the products of another instance's standby copy of
// task (GET /v1/products?standby=<task>, or GET /v1/windows?standby=<task>
// of a window): a page after after, or with byTotal the limit largest.
func (f *forwarder) standbyPage(ctx context.Context, self string, is status.Instance, of listOf, task, after string, limit int, byTotal bool) ([]state.Total, error) {
	if of.size > 0 {
		page, _, err := f.windowPage(ctx, self, is, of.size, of.start, task, after, limit, byTotal)
		return page, err
	}
	q := url.Values{"limit": {strconv.Itoa(limit)}, "standby": {task}}
	if after != "" {
		q.Set("after", after)
	}
	if byTotal {
		q.Set("sort", "total")
	}
	got, err := f.products(ctx, self, is, q, after, limit, func(a productsAnswer) error {
		if a.Standby != task {
			return fmt.Errorf("GET /v1/products?standby=%s answered for %q", task, a.Standby)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got.Products, nil
}

// checkPage checks another instance's page: at most limit products, each
// after after, and task names that are task names.
func checkPage(page []state.Total, unavailable []string, after string, limit int) error {
	if len(page) > limit {
		return fmt.Errorf("a page of %d products, asked for %d", len(page), limit)
	}
	for _, p := range page {
		if p.Product <= after && after != "" {
			return fmt.Errorf("product %q is not after %q", p.Product, after)
		}
	}
	for _, t := range unavailable {
		if !state.IsTaskName(t) {
			return fmt.Errorf("%q is not a task name", t)
		}
	}
	return nil
}

// forwarded reports whether r came from another instance (it is answered
// where it lands, never forwarded again).
func forwarded(r *http.Request) bool { return r.Header.Get(ForwardedHeader) != "" }
