package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/bench/kit"
)

// env is what every cell of a run shares.
type env struct {
	o      options
	tmp    string
	b      *kit.Broker
	bin    string // the built salesagg
	refSh  string // bench/kstreams-reference/run.sh
	prefix string // of every topic and group of the run
	seq    int    // cells and calibrations started, for unique names
	// calibrated is the maximum rate of each system, guarantee and
	// calibration interval, measured once.
	calibrated map[string]*calibration
}

// calibration is a system's measured maximum: events/s from ready until it
// has processed a preloaded input to its end. salesagg says where each task
// is (/v1/tasks positions); the reference has no such answer, so its end is
// when its committed offsets reach the input's end, up to one commit
// interval (at most 1 s here) after it processed the last event.
type calibration struct {
	System           string  `json:"system"`
	Guarantee        string  `json:"guarantee"`
	CommitIntervalMs int64   `json:"commit_interval_ms"`
	Events           int     `json:"events"`
	CaughtUpBy       string  `json:"caught_up_by"`
	StartToReadyMs   int64   `json:"start_to_ready_ms"`
	ReadyToCaughtMs  int64   `json:"ready_to_caught_up_ms"`
	EventsPerSec     float64 `json:"events_per_s"`
	CPUMs            int64   `json:"cpu_ms_ready_to_caught_up"`
}

// cell is one measured combination and what it showed.
type cell struct {
	System           string          `json:"system"`
	Guarantee        string          `json:"guarantee"`
	CommitIntervalMs int64           `json:"commit_interval_ms"` // 0: the system's default, not passed
	EffectiveMs      int64           `json:"effective_commit_interval_ms"`
	Calibration      *calibration    `json:"calibration"`
	InputRate        int             `json:"input_rate_events_per_s"`
	Capped           bool            `json:"input_capped_by_max_rate"`
	Producer         *kit.PacerStats `json:"producer,omitempty"`
	ProbeKeys        []string        `json:"probe_keys"`
	ProbesProduced   int             `json:"probes_in_window"`
	HTTP             dist            `json:"http"`
	Changelog        dist            `json:"changelog_read_committed"`
	Regressions      int             `json:"total_regressions"`
	Excess           int64           `json:"totals_above_probes"`
	HTTPFails        int64           `json:"http_failed_asks"`
	LagAtWindowEnd   int64           `json:"input_lag_at_window_end"`
	CPUMsWindow      int64           `json:"cpu_ms_in_window"`
	CPUUsPerEvent    float64         `json:"cpu_us_per_event_in_window"`
	Anomalies        []string        `json:"anomalies,omitempty"`
	Status           string          `json:"status"`
	Error            string          `json:"error,omitempty"`
	Logs             string          `json:"logs"`
}

func (c *cell) anomaly(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.Anomalies = append(c.Anomalies, msg)
	logf("%s: ANOMALY: %s", c.name(), msg)
}

func (c *cell) name() string {
	return fmt.Sprintf("%s %s commit %s", c.System, shortGuarantee(c.Guarantee), intervalName(c.CommitIntervalMs))
}

func intervalName(ms int64) string {
	if ms == 0 {
		return "default"
	}
	return strconv.FormatInt(ms, 10) + " ms"
}

func shortGuarantee(g string) string {
	if g == guaranteeEOS {
		return "eos"
	}
	return "alos"
}

// effectiveInterval is the commit interval a system runs with when ms is
// intervalDefault (none passed): 100 ms under exactly-once for both, and
// under at-least-once salesagg's 1 s against Kafka Streams' 30 s.
func effectiveInterval(sys, guarantee string, ms int64) int64 {
	switch {
	case ms != intervalDefault:
		return ms
	case guarantee == guaranteeEOS:
		return 100
	case sys == sysSalesagg:
		return 1000
	default:
		return 30_000
	}
}

func benchmark(ctx context.Context, o options) (err error) {
	started := time.Now()
	tmp, err := os.MkdirTemp("", "salesagg-latency-")
	if err != nil {
		return err
	}
	e := &env{o: o, tmp: tmp, bin: filepath.Join(tmp, "salesagg"), refSh: filepath.Join(o.repo, "bench", "kstreams-reference", "run.sh"),
		prefix: "lat-" + strconv.FormatInt(time.Now().Unix(), 36), calibrated: map[string]*calibration{}}
	defer func() {
		if err == nil && !o.keepTmp {
			_ = os.RemoveAll(tmp)
		} else {
			logf("kept %s (logs, state)", tmp)
		}
	}()
	machine := kit.DescribeMachine()
	machine.LoadAvgStart = kit.LoadAvg()
	if err := kit.BuildSalesagg(ctx, o.repo, e.bin, logf); err != nil {
		return err
	}
	for _, s := range o.systems {
		if s == sysReference {
			logf("building the reference: %s --build-only", e.refSh)
			if err := runQuiet(ctx, o.repo, tmp, e.refSh, "--build-only"); err != nil {
				return fmt.Errorf("building the reference: %w", err)
			}
		}
	}
	b, err := kit.OpenBroker(ctx, o.repo, tmp, o.bootstrap, logf)
	defer b.Close()
	if err != nil {
		return err
	}
	e.b = b
	warm := e.prefix + "-warm"
	if err := kit.CreateTopic(ctx, b.Adm, warm, 1); err != nil {
		return err
	}
	if err := kit.WarmGroupCoordinator(ctx, b.Adm, warm, warm); err != nil {
		return err
	}
	defer kit.DeleteRun(b.Adm, e.prefix, nil, logf)

	var cells []*cell
	for _, g := range o.guarantees {
		for _, iv := range o.intervals {
			for _, s := range o.systems {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				c := e.runCell(ctx, s, g, iv.Milliseconds())
				cells = append(cells, c)
			}
		}
	}
	machine.LoadAvgEnd = kit.LoadAvg()
	commit, dirty := kit.GitState(o.repo)
	rep := &report{StartedAt: started, DurationMs: time.Since(started).Milliseconds(), Machine: machine,
		Versions: kit.Versions{Go: runtime.Version(), Java: kit.JavaVersion(), Kafka: b.Version, KafkaStreams: kit.ReferenceStreamsVersion(o.repo),
			GitCommit: commit, GitDirty: dirty},
		Options: o.summary(), Cells: cells}
	path, err := rep.write(o.outDir)
	if err != nil {
		return err
	}
	fmt.Println(rep.table())
	logf("wrote %s", path)
	for _, c := range cells {
		if c.Status != "ok" {
			return fmt.Errorf("cell %s failed: %s", c.name(), kit.FirstLine(c.Error))
		}
	}
	return nil
}

// runQuiet runs path in dir, its output logged under logDir, and fails
// with the end of it when it exits non-zero.
func runQuiet(ctx context.Context, dir, logDir, path string, args ...string) error {
	p, err := kit.Start(kit.Spec{Name: "build-reference", LogDir: logDir, Path: path, Args: args, Dir: dir})
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Stop(10 * time.Second)
		return context.Cause(ctx)
	}
	if code, _, _ := p.ExitInfo(); code != 0 {
		return p.ExitError("while building")
	}
	return nil
}

// proc is one started system process and where it answers HTTP.
type proc struct {
	*kit.Proc
	httpAddr string
	mu       sync.Mutex // guards errs
	errs     kit.ErrorLines
}

// launch starts system sys under guarantee with commit interval ms (0: not
// passed) on input topic, as application app.
func (e *env) launch(sys, guarantee string, ms int64, app, topic, logDir string) (*proc, error) {
	port, err := kit.FreePort()
	if err != nil {
		return nil, err
	}
	p := &proc{httpAddr: fmt.Sprintf("127.0.0.1:%d", port)}
	state := filepath.Join(e.tmp, "state", app)
	var path string
	var args []string
	if sys == sysSalesagg {
		path = e.bin
		args = []string{"run",
			"--bootstrap.servers", e.b.Addr,
			"--application.id", app,
			"--state.dir", state,
			"--http.addr", p.httpAddr,
			"--input.topic", topic,
			"--notification.topic", app + "-notifications",
			"--processing.guarantee", guarantee,
			"--log.format", "json",
		}
		if ms != intervalDefault {
			args = append(args, "--commit.interval.ms", strconv.FormatInt(ms, 10))
		}
	} else {
		path = e.refSh
		args = []string{
			"--bootstrap", e.b.Addr,
			"--application-id", app,
			"--state-dir", state,
			"--http-addr", p.httpAddr,
			"--input-topic", topic,
			"--notification-topic", app + "-notifications",
			"--processing-guarantee", guarantee,
			"--leave-group-on-close", "true",
			"--rocksdb", e.o.refRocksDB,
		}
		if e.o.refTxnStores && guarantee == guaranteeEOS {
			args = append(args, "--transactional-state-stores", "true")
		}
		if ms != intervalDefault {
			args = append(args, "--commit-interval-ms", strconv.FormatInt(ms, 10))
		}
	}
	onLine := func(stream string, _ time.Time, line string) {
		bad := false
		if sys == sysSalesagg {
			bad = stream == "stderr" && (strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"fatal"`) ||
				strings.HasPrefix(line, "panic"))
		} else {
			bad = strings.Contains(line, "] ERROR ") || strings.HasPrefix(line, "REFERENCE ERROR")
		}
		if bad {
			p.mu.Lock()
			p.errs.Note(line, 500)
			p.mu.Unlock()
		}
	}
	kp, err := kit.Start(kit.Spec{Name: app, LogDir: logDir, Path: path, Args: args, Dir: e.o.repo, OnLine: onLine})
	if err != nil {
		return nil, err
	}
	p.Proc = kp
	return p, nil
}

// waitReady waits for /readyz to answer 200.
func (p *proc) waitReady(ctx context.Context, hc *http.Client, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/readyz", nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now(), nil
			}
		}
		if !p.Alive() {
			return time.Time{}, p.ExitError("before it was ready")
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s not ready within %s", p.Name, limit)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, context.Cause(ctx)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cpu returns the process's user+system CPU time so far (from /proc).
func (p *proc) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// stop stops the process and notes an unclean exit or error lines in c.
func (p *proc) stop(c *cell, timeout time.Duration) {
	took, killed := p.Stop(timeout)
	code, sig, _ := p.ExitInfo()
	switch {
	case killed:
		c.anomaly("%s: no exit within %s of SIGTERM; killed", p.Name, timeout)
	case code != 0 && code != 143:
		c.anomaly("%s: exit code %d %s after SIGTERM (%.2f s)", p.Name, code, sig, took.Seconds())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.errs.Count > 0 {
		c.anomaly("%s logged %d error lines, first: %s", p.Name, p.errs.Count, p.errs.First[0])
	}
}

func newHTTPClient() *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil,
		DialContext: (&net.Dialer{Timeout: time.Second}).DialContext, MaxIdleConnsPerHost: 16}}
}

// newTopics creates the input and notification topics of app.
func (e *env) newTopics(ctx context.Context, app string) (string, error) {
	topic := app + "-sales-events"
	for _, t := range []string{topic, app + "-notifications"} {
		if err := kit.CreateTopic(ctx, e.b.Adm, t, partitions); err != nil {
			return "", err
		}
		if err := kit.WaitTopic(ctx, e.b.Adm, t, partitions); err != nil {
			return "", err
		}
	}
	return topic, nil
}

func event(rng *rand.Rand, products int) *kgo.Record {
	k := "p" + strconv.Itoa(rng.IntN(products))
	return &kgo.Record{Key: []byte(k), Value: []byte(`{"product":"` + k + `","value":` + strconv.Itoa(1+rng.IntN(1000)) + `}`)}
}

// calibrate returns the maximum rate of sys under guarantee at commit
// interval ms, measuring it on the first ask.
func (e *env) calibrate(ctx context.Context, c *cell, sys, guarantee string, ms int64) (*calibration, error) {
	key := fmt.Sprintf("%s/%s/%d", sys, guarantee, ms)
	if cal := e.calibrated[key]; cal != nil {
		return cal, nil
	}
	e.seq++
	app := fmt.Sprintf("%s-c%d-%s-%s", e.prefix, e.seq, sys, shortGuarantee(guarantee))
	topic, err := e.newTopics(ctx, app)
	if err != nil {
		return nil, err
	}
	defer kit.DeleteRun(e.b.Adm, app, []string{app}, logf)
	cl, err := kit.NewBulkProducer(e.b.Addr, topic)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(e.o.seed, e.o.seed^uint64(e.seq)))
	err = kit.ProduceAll(ctx, cl, e.o.events, func(int) *kgo.Record { return event(rng, e.o.products) }, logf, "the calibration input", 10*time.Minute)
	cl.Close()
	if err != nil {
		return nil, err
	}
	ends, err := kit.EndOffsets(ctx, e.b.Adm, topic)
	if err != nil {
		return nil, err
	}
	logf("%s: calibrating %s %s at commit %d ms over %d events", c.name(), sys, shortGuarantee(guarantee), ms, e.o.events)
	p, err := e.launch(sys, guarantee, ms, app, topic, filepath.Join(e.tmp, "logs"))
	if err != nil {
		return nil, err
	}
	defer p.stop(c, e.o.stopTimeout)
	hc := newHTTPClient()
	ready, err := p.waitReady(ctx, hc, e.o.timeout)
	if err != nil {
		return nil, err
	}
	cpu0 := p.cpu()
	deadline := time.Now().Add(e.o.timeout)
	by := "committed offsets"
	if sys == sysSalesagg {
		by = "/v1/tasks positions"
	}
	for {
		var at bool
		var err error
		if sys == sysSalesagg {
			at, err = positionsAtEnd(ctx, hc, p.httpAddr, ends)
		} else {
			at, _, err = kit.CommittedAtEnd(ctx, e.b.Adm, app, topic, ends)
		}
		now := time.Now()
		if err == nil && at {
			cal := &calibration{System: sys, Guarantee: guarantee, CommitIntervalMs: ms, Events: e.o.events, CaughtUpBy: by,
				StartToReadyMs: ready.Sub(p.Started).Milliseconds(), ReadyToCaughtMs: now.Sub(ready).Milliseconds(),
				EventsPerSec: float64(e.o.events) / now.Sub(ready).Seconds(), CPUMs: (p.cpu() - cpu0).Milliseconds()}
			e.calibrated[key] = cal
			logf("%s: calibrated: %.0f events/s", c.name(), cal.EventsPerSec)
			return cal, nil
		}
		if !p.Alive() {
			return nil, p.ExitError("while calibrating")
		}
		if now.After(deadline) {
			return nil, fmt.Errorf("calibration: committed offsets not at the end within %s", e.o.timeout)
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// runCell calibrates (at the cell's interval, at most 1 s: a longer
// interval only delays the last commit the calibration waits for), then
// measures the probes among a steady input on fresh topics.
func (e *env) runCell(ctx context.Context, sys, guarantee string, ms int64) (c *cell) {
	c = &cell{System: sys, Guarantee: guarantee, CommitIntervalMs: ms, EffectiveMs: effectiveInterval(sys, guarantee, ms), Status: "ok",
		Logs: filepath.Join(e.tmp, "logs")}
	logf("=== %s ===", c.name())
	defer func() {
		if c.Status != "ok" {
			logf("=== %s FAILED: %s ===", c.name(), kit.FirstLine(c.Error))
		}
	}()
	if err := e.measure(ctx, c); err != nil {
		c.Status, c.Error = "failed", err.Error()
	}
	return c
}

func (e *env) measure(ctx context.Context, c *cell) error {
	calMs := min(c.EffectiveMs, 1000)
	cal, err := e.calibrate(ctx, c, c.System, c.Guarantee, calMs)
	if err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	c.Calibration = cal
	c.InputRate = int(cal.EventsPerSec * e.o.fraction)
	if e.o.maxRate > 0 && c.InputRate > e.o.maxRate {
		c.InputRate, c.Capped = e.o.maxRate, true
	}

	e.seq++
	app := fmt.Sprintf("%s-m%d-%s-%s", e.prefix, e.seq, c.System, shortGuarantee(c.Guarantee))
	topic, err := e.newTopics(ctx, app)
	if err != nil {
		return err
	}
	defer kit.DeleteRun(e.b.Adm, app, []string{app}, logf)
	p, err := e.launch(c.System, c.Guarantee, c.CommitIntervalMs, app, topic, filepath.Join(e.tmp, "logs"))
	if err != nil {
		return err
	}
	defer p.stop(c, e.o.stopTimeout)
	hc := newHTTPClient()
	if _, err := p.waitReady(ctx, hc, e.o.timeout); err != nil {
		return err
	}
	changelog := app + "-PRODUCT_AGGREGATED_SALES-changelog"
	if err := kit.WaitTopic(ctx, e.b.Adm, changelog, partitions); err != nil {
		return err
	}
	starts, err := kit.EndOffsets(ctx, e.b.Adm, changelog)
	if err != nil {
		return err
	}

	c.ProbeKeys = probeKeys(app, partitions, e.o.probesPerPart)
	tr := newTracker(c.ProbeKeys)
	var excess, httpFails atomic.Int64
	var produceErr atomic.Pointer[error]
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	readErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := changelogReader(wctx, e.b.Addr, changelog, starts, tr, func() { excess.Add(1) }); err != nil {
			readErr <- err
		}
	}()
	for _, k := range c.ProbeKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			httpFails.Add(int64(httpPoller(wctx, hc, "http://"+p.httpAddr, k, tr, e.o.pollEvery, func() { excess.Add(1) })))
		}()
	}
	defer func() {
		stopWatch()
		wg.Wait()
	}()

	cl, err := kit.NewBulkProducer(e.b.Addr, topic)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(e.o.seed, e.o.seed^0x6c6174))
	pacer := kit.StartPacer(cl, c.InputRate, func() *kgo.Record { return event(rng, e.o.products) })
	pctx, stopProbes := context.WithCancel(ctx)
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		prober(pctx, cl, tr, c.ProbeKeys, e.o.probeEvery, func(err error) { produceErr.CompareAndSwap(nil, &err) })
	}()
	finishInput := func() {
		stopProbes()
		<-probesDone
		if pacer != nil {
			st := pacer.Finish()
			c.Producer, pacer = &st, nil
		}
	}
	defer finishInput()
	logf("%s: steady input %d events/s (%.0f%% of %.0f), a probe every %s over %d products; %s warm-up, %s measured",
		c.name(), c.InputRate, e.o.fraction*100, cal.EventsPerSec, e.o.probeEvery, len(c.ProbeKeys), e.o.warmup, e.o.duration)

	if err := kit.Sleep(ctx, e.o.warmup); err != nil {
		return err
	}
	from, cpu0 := time.Now(), p.cpu()
	if err := kit.Sleep(ctx, e.o.duration); err != nil {
		return err
	}
	to := time.Now()
	c.CPUMsWindow = (p.cpu() - cpu0).Milliseconds()
	if n := float64(c.InputRate) * to.Sub(from).Seconds(); n > 0 {
		c.CPUUsPerEvent = float64(c.CPUMsWindow) * 1000 / n
	}
	if ends, err := kit.EndOffsets(ctx, e.b.Adm, topic); err == nil {
		_, committed, _ := kit.CommittedAtEnd(ctx, e.b.Adm, app, topic, ends)
		var sum int64
		for _, o := range ends {
			sum += o
		}
		c.LagAtWindowEnd = sum - committed
	}
	// The probes of the window must all show, HTTP and changelog; the
	// steady input goes on meanwhile, as it would.
	drain := 10*time.Second + 3*time.Duration(c.EffectiveMs)*time.Millisecond
	deadline := time.Now().Add(drain)
	for !tr.allSeen(to) && time.Now().Before(deadline) {
		if !p.Alive() {
			return p.ExitError("while measuring")
		}
		select {
		case err := <-readErr:
			return err
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(50 * time.Millisecond):
		}
	}
	finishInput()
	stopWatch()
	wg.Wait()
	select {
	case err := <-readErr:
		return err
	default:
	}
	httpL, logL, httpUnseen, logUnseen, regress := tr.latencies(from, to)
	c.ProbesProduced = max(len(httpL)+httpUnseen, len(logL)+logUnseen)
	c.HTTP, c.Changelog = distOf(httpL, httpUnseen), distOf(logL, logUnseen)
	c.Regressions, c.Excess, c.HTTPFails = regress, excess.Load(), httpFails.Load()
	if httpUnseen+logUnseen > 0 {
		c.anomaly("%d probes never answered over HTTP and %d never in the changelog within %s of the window's end", httpUnseen, logUnseen, drain)
	}
	if regress > 0 || c.Excess > 0 {
		c.anomaly("a probe total went down %d times, showed more probes than produced %d times", regress, c.Excess)
	}
	if pe := produceErr.Load(); pe != nil {
		c.anomaly("producing a probe failed: %v", *pe)
	}
	if c.Producer != nil && c.Producer.Failed > 0 {
		c.anomaly("steady input: %d of %d events failed (first: %s)", c.Producer.Failed, c.Producer.Sent, c.Producer.FirstError)
	}
	logf("%s: HTTP p50 %.1f p99 %.1f max %.1f ms; changelog p50 %.1f p99 %.1f max %.1f ms (%d probes)",
		c.name(), c.HTTP.P50, c.HTTP.P99, c.HTTP.Max, c.Changelog.P50, c.Changelog.P99, c.Changelog.Max, c.ProbesProduced)
	return nil
}

// positionsAtEnd reports whether salesagg's /v1/tasks shows every input
// partition's position at its end.
func positionsAtEnd(ctx context.Context, hc *http.Client, addr string, ends map[int32]int64) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/tasks", nil)
	if err != nil {
		return false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET /v1/tasks: %s", resp.Status)
	}
	var v struct {
		Tasks []struct {
			Partition int32  `json:"partition"`
			Position  int64  `json:"position"`
			Role      string `json:"role"`
		} `json:"tasks"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil {
		return false, err
	}
	seen := 0
	for _, t := range v.Tasks {
		if t.Role != "" && t.Role != "active" {
			continue
		}
		if t.Position < ends[t.Partition] {
			return false, nil
		}
		seen++
	}
	return seen == len(ends), nil
}
