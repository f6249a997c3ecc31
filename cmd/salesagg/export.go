package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

const exportLine = "state export [--state.dir DIR] [--task 0_N ...] [--window SIZE] | --from URL [--token-file F] [--ca-file F] [--cert-file F --key-file F]; [--format jsonl|csv] [--output FILE]"

const exportAbout = `Writes every product's total, sorted by product within each task, one per line:
JSONL ({"task":"0_1","product":"p1","total":1200}) or CSV (task,product,total with a header).

Offline (the default) it reads the stores of a stopped service's state dir, with its lock, every
task or those named with --task. With --from URL it asks a running instance instead
(GET /v1/products, paged, gathered from every instance; task is then empty): it fails (exit 1)
when a task was unavailable (restoring, or its instance did not answer), after writing what it
read. --token-file gives the bearer token (its first line) when http.auth.tokens.file is set;
--ca-file the CA for an https URL, --cert-file and --key-file a client certificate when the
service asks for one (http.tls.client.ca.file). With --output the file appears only once the
export is whole.

With --window SIZE (one of windows.sizes) it writes the windows of that size instead, by start
and then product: {"task":"0_1","product":"p1","window":"1h","start":…,"end":…,"total":300}
(epoch ms), or CSV task,product,window,start,end,total; with --from it lists the window starts
(GET /v1/windows/starts) and pages each window (GET /v1/windows). A task read from a standby
copy (its owner did not answer) is named on standard error.`

// exportRow is one exported total.
type exportRow struct {
	Task    string `json:"task"`
	Product string `json:"product"`
	// Window, Start and End are a window's size and bounds (epoch ms; the
	// end excluded), for an export of windows.
	Window string `json:"window,omitempty"`
	Start  *int64 `json:"start,omitempty"`
	End    *int64 `json:"end,omitempty"`
	Total  int64  `json:"total"`
}

// exportWriter writes rows in one format.
type exportWriter interface {
	write(exportRow) error
	flush() error
}

type jsonlWriter struct {
	w   *bufio.Writer
	enc *json.Encoder
}

func (j *jsonlWriter) write(r exportRow) error { return j.enc.Encode(r) }
func (j *jsonlWriter) flush() error            { return j.w.Flush() }

type csvWriter struct {
	w       *csv.Writer
	windows bool
}

func (c *csvWriter) write(r exportRow) error {
	if c.windows && r.Start != nil && r.End != nil {
		return c.w.Write([]string{r.Task, r.Product, r.Window, strconv.FormatInt(*r.Start, 10), strconv.FormatInt(*r.End, 10), strconv.FormatInt(r.Total, 10)})
	}
	return c.w.Write([]string{r.Task, r.Product, strconv.FormatInt(r.Total, 10)})
}
func (c *csvWriter) flush() error { c.w.Flush(); return c.w.Error() }

func newExportWriter(format string, out io.Writer, windows bool) (exportWriter, error) {
	switch format {
	case "jsonl":
		bw := bufio.NewWriter(out)
		return &jsonlWriter{w: bw, enc: json.NewEncoder(bw)}, nil
	case "csv":
		w := csv.NewWriter(out)
		if windows {
			return &csvWriter{w: w, windows: true}, w.Write([]string{"task", "product", "window", "start", "end", "total"})
		}
		return &csvWriter{w: w}, w.Write([]string{"task", "product", "total"})
	}
	return nil, usageError{fmt.Errorf("--format %q: want jsonl or csv", format)}
}

// runStateExport implements "salesagg state export".
func runStateExport(args []string, stdout io.Writer) (err error) {
	fs := stateFlags("export", "windows.sizes")
	tasks := fs.StringSlice("task", nil, "export only this task, 0_<partition> (repeatable; default: every task; offline only)")
	format := fs.String("format", "jsonl", "jsonl or csv")
	output := fs.String("output", "-", "the file to write (- for standard output)")
	from := fs.String("from", "", "a running instance's base URL, e.g. http://127.0.0.1:8080 (default: read the state dir offline)")
	tokenFile := fs.String("token-file", "", "with --from: a file whose first line is the bearer token")
	caFile := fs.String("ca-file", "", "with --from https://…: the CA that signed the service's certificate")
	certFile := fs.String("cert-file", "", "with --from https://…: a client certificate (PEM), with --key-file")
	keyFile := fs.String("key-file", "", "with --from https://…: the client certificate's key (PEM)")
	timeout := fs.Duration("timeout", 2*time.Minute, "with --from: give up after this long")
	window := fs.String("window", "", "export the windows of this size (one of windows.sizes, e.g. 1h) instead of the totals")
	commandUsage(fs, exportLine, exportAbout)
	cfg, err := loadCommandConfig(fs, args)
	if err != nil {
		return err
	}
	if *from != "" && len(*tasks) > 0 {
		return usageError{errors.New("--task selects stores offline; with --from every product is exported")}
	}
	if *from == "" && (*tokenFile != "" || *caFile != "" || *certFile != "" || *keyFile != "") {
		return usageError{errors.New("--token-file, --ca-file, --cert-file and --key-file go with --from")}
	}
	if (*certFile == "") != (*keyFile == "") {
		return usageError{errors.New("--cert-file and --key-file go together")}
	}
	var size time.Duration
	if *window != "" {
		size, err = time.ParseDuration(*window)
		switch {
		case err != nil || size <= 0:
			return usageError{fmt.Errorf("--window %q: want a window size such as 1h", *window)}
		case *from == "" && !slices.Contains(cfg.WindowSizes(), size):
			// With --from the instance says which sizes it keeps.
			return usageError{fmt.Errorf("--window %q: want one of windows.sizes (%s)", *window, strings.Join(cfg.Windows.Sizes, ", "))}
		}
	}
	if _, err := newExportWriter(*format, io.Discard, size > 0); err != nil {
		return err
	}

	out := stdout
	var tmp *os.File
	if *output != "-" {
		// Written beside the target and renamed when whole: a failed
		// export never leaves a file that looks complete.
		tmp, err = os.CreateTemp(filepath.Dir(*output), "."+filepath.Base(*output)+".*")
		if err != nil {
			return fmt.Errorf("--output %s: %w", *output, err)
		}
		defer func() {
			if tmp != nil {
				tmp.Close()
				os.Remove(tmp.Name())
			}
		}()
		out = tmp
	}
	w, err := newExportWriter(*format, out, size > 0)
	if err != nil {
		return err
	}
	var rows int64
	emit := func(r exportRow) error { rows++; return w.write(r) }
	if *from != "" {
		err = exportHTTP(*from, httpCreds{token: *tokenFile, ca: *caFile, cert: *certFile, key: *keyFile}, *timeout, size, emit)
	} else {
		err = exportOffline(cfg.StateDir, cfg.ApplicationID, *tasks, size, emit)
	}
	if ferr := w.flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	if tmp != nil {
		if err := tmp.Sync(); err != nil {
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		if err := os.Rename(tmp.Name(), *output); err != nil {
			return err
		}
		tmp = nil
		fmt.Fprintf(os.Stderr, "salesagg state export: %d products written to %s\n", rows, *output)
	}
	return nil
}

// exportOffline reads the stores of the tasks named (all when none) of a
// stopped service's state dir, holding its lock.
func exportOffline(stateDir, appID string, names []string, size time.Duration, emit func(exportRow) error) error {
	dir, parts, err := openTasks(stateDir, appID, names)
	if err != nil {
		return err
	}
	defer dir.Close()
	for _, p := range parts {
		task := state.TaskName(p)
		if size > 0 {
			name := sales.FormatWindowSize(size)
			if err := dir.EachWindow(p, size, func(wt state.WindowTotal) error {
				end := wt.Start + size.Milliseconds()
				return emit(exportRow{Task: task, Product: wt.Product, Window: name, Start: &wt.Start, End: &end, Total: wt.Total})
			}); err != nil {
				return err
			}
			continue
		}
		if err := dir.EachTotal(p, func(t state.Total) error {
			return emit(exportRow{Task: task, Product: t.Product, Total: t.Total})
		}); err != nil {
			return err
		}
	}
	return nil
}

// httpCreds are the files export --from authenticates with: a bearer
// token, the CA of the service's certificate, a client certificate and key.
type httpCreds struct{ token, ca, cert, key string }

// exportHTTP pages through GET /v1/products of the instance at base (with
// size, through GET /v1/windows/starts and each window's GET /v1/windows).
// It fails after the last page when a task was unavailable on any page;
// tasks read from standby copies are named on standard error.
func exportHTTP(base string, creds httpCreds, timeout time.Duration, size time.Duration, emit func(exportRow) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := newExportClient(base, creds)
	if err != nil {
		return err
	}
	defer c.close()
	if size > 0 {
		err = c.windows(ctx, size, emit)
	} else {
		err = c.pages(ctx, "/v1/products", nil, func(t state.Total) error {
			return emit(exportRow{Product: t.Product, Total: t.Total})
		})
	}
	if err != nil {
		return err
	}
	if len(c.stale) > 0 {
		fmt.Fprintf(os.Stderr, "salesagg state export: tasks %s were read from standby copies (within acceptable.recovery.lag of their owner)\n",
			strings.Join(slices.Sorted(maps.Keys(c.stale)), ", "))
	}
	if len(c.missing) > 0 {
		return fmt.Errorf("the export is incomplete: the products of tasks %s were unavailable (restoring, or their instance did not answer); try again",
			strings.Join(slices.Sorted(maps.Keys(c.missing)), ", "))
	}
	return nil
}

// exportClient asks a running instance for export --from, and gathers the
// tasks its answers said were unavailable or read from standby copies.
type exportClient struct {
	u              *neturl.URL
	token          string
	tr             *http.Transport
	cl             *http.Client
	missing, stale map[string]bool
}

func newExportClient(base string, creds httpCreds) (*exportClient, error) {
	u, err := neturl.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{fmt.Errorf("--from %q: want http://HOST:PORT or https://HOST:PORT", base)}
	}
	c := &exportClient{u: u, missing: map[string]bool{}, stale: map[string]bool{}}
	if creds.token != "" {
		b, err := os.ReadFile(creds.token)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		token, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		c.token = strings.TrimSpace(token)
		if c.token == "" {
			return nil, fmt.Errorf("--token-file %s: no token on its first line", creds.token)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if creds.ca != "" {
		pem, err := os.ReadFile(creds.ca)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", creds.ca)
		}
		tlsCfg.RootCAs = pool
	}
	if creds.cert != "" {
		pair, err := tls.LoadX509KeyPair(creds.cert, creds.key)
		if err != nil {
			return nil, fmt.Errorf("--cert-file %s, --key-file %s: %w", creds.cert, creds.key, err)
		}
		tlsCfg.Certificates = []tls.Certificate{pair}
	}
	tr.TLSClientConfig = tlsCfg
	c.tr, c.cl = tr, &http.Client{Transport: tr}
	return c, nil
}

func (c *exportClient) close() { c.tr.CloseIdleConnections() }

// get reads GET path?q into v (a 200's JSON), and notes the tasks the
// answer says were unavailable or stale.
func (c *exportClient) get(ctx context.Context, path string, q neturl.Values, v any) error {
	pu := *c.u
	pu.Path = strings.TrimSuffix(c.u.Path, "/") + path
	pu.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pu.String(), nil)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.cl.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", pu.Redacted(), err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("GET %s: %w", pu.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", pu.Redacted(), resp.Status, strings.TrimSpace(string(body)))
	}
	var tasks struct {
		Unavailable []string `json:"unavailable_tasks"`
		Stale       []string `json:"stale_tasks"`
	}
	if err := json.Unmarshal(body, &tasks); err != nil {
		return fmt.Errorf("GET %s: %w", pu.Redacted(), err)
	}
	for _, t := range tasks.Unavailable {
		c.missing[t] = true
	}
	for _, t := range tasks.Stale {
		c.stale[t] = true
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", pu.Redacted(), err)
	}
	return nil
}

// pages reads every page of a product list route (GET /v1/products, or
// /v1/windows of one window) with q, 1,000 products a page.
func (c *exportClient) pages(ctx context.Context, path string, q neturl.Values, fn func(state.Total) error) error {
	after := ""
	for {
		pq := neturl.Values{"limit": {"1000"}}
		for k, v := range q {
			pq[k] = v
		}
		if after != "" {
			pq.Set("after", after)
		}
		var got struct {
			Products []state.Total `json:"products"`
			Next     string        `json:"next"`
		}
		if err := c.get(ctx, path, pq, &got); err != nil {
			return err
		}
		for _, t := range got.Products {
			if err := fn(t); err != nil {
				return err
			}
		}
		if got.Next == "" || got.Next <= after {
			return nil
		}
		after = got.Next
	}
}

// windows reads every window of size: the starts the instances hold
// (GET /v1/windows/starts), then each window's products, by start and
// then product.
func (c *exportClient) windows(ctx context.Context, size time.Duration, emit func(exportRow) error) error {
	name := sales.FormatWindowSize(size)
	from := int64(0)
	for {
		var got struct {
			Starts []int64 `json:"starts"`
			Next   *int64  `json:"next"`
		}
		if err := c.get(ctx, "/v1/windows/starts", neturl.Values{"size": {name}, "from": {strconv.FormatInt(from, 10)}, "limit": {"1000"}}, &got); err != nil {
			return err
		}
		for _, start := range got.Starts {
			end := start + size.Milliseconds()
			q := neturl.Values{"size": {name}, "start": {strconv.FormatInt(start, 10)}}
			if err := c.pages(ctx, "/v1/windows", q, func(t state.Total) error {
				return emit(exportRow{Product: t.Product, Window: name, Start: &start, End: &end, Total: t.Total})
			}); err != nil {
				return err
			}
		}
		if got.Next == nil || *got.Next <= from {
			return nil
		}
		from = *got.Next
	}
}
