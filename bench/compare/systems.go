package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/bench/kit"
	"github.com/salesagg/salesagg/internal/sales"
)

// env is what every system's measurement shares.
type env struct {
	o         options
	tmp       string
	addr      string
	adm       *kadm.Client
	data      *dataset // the data set being run
	prefix    string   // of every topic and group of this run
	guarantee string
	stem      string // path of the current results without ".json" (profiles are named after it)
	salesagg  string // built binary
	refRunSh  string
}

// system is one entry of the run order: salesagg, the ceiling, or one
// variant of the reference.
type system struct {
	kind string // sysSalesagg, sysReference, sysCeiling
	ref  refVariant
}

func (s system) name() string {
	if s.kind == sysReference {
		return s.ref.name()
	}
	return s.kind
}

// refVariant is one configuration of the Kafka Streams reference.
type refVariant struct {
	threads int    // num.stream.threads
	cache   int64  // statestore.cache.max.bytes; cacheDefault: Kafka Streams' default
	rocksdb string // run.sh --rocksdb: rocksDefault or rocksTuned
	txn     bool   // enable.transactional.statestores (exactly-once variants only)
}

const (
	rocksDefault = "default"
	rocksTuned   = "tuned"
)

// name is the variant's column in the tables; the variants of Kafka
// Streams' own RocksDB settings and stores keep the names they always had.
func (v refVariant) name() string {
	extra := ""
	if v.rocksdb == rocksTuned {
		extra += ", RocksDB tuned"
	}
	if v.txn {
		extra += ", transactional stores"
	}
	return fmt.Sprintf("reference (threads %d, cache %s%s)", v.threads, cacheName(v.cache), extra)
}

// slug names the variant in application ids and log files.
func (v refVariant) slug() string {
	c := "default"
	if v.cache != cacheDefault {
		c = strconv.FormatInt(v.cache, 10)
	}
	s := fmt.Sprintf("reference-t%d-c%s", v.threads, c)
	if v.rocksdb == rocksTuned {
		s += "-rt"
	}
	if v.txn {
		s += "-tx"
	}
	return s
}

// refSettings is a reference variant in the JSON.
type refSettings struct {
	NumStreamThreads int    `json:"num_stream_threads"`
	CacheMaxBytes    *int64 `json:"cache_max_bytes"` // null: Kafka Streams' default (10 MiB)
	RocksDB          string `json:"rocksdb"`         // default (Kafka Streams') or tuned (RocksDBTuning)
	TransactionalSS  bool   `json:"transactional_state_stores"`
}

func (v refVariant) settings() *refSettings {
	s := &refSettings{NumStreamThreads: v.threads, RocksDB: v.rocksdb, TransactionalSS: v.txn}
	if s.RocksDB == "" {
		s.RocksDB = rocksDefault
	}
	if v.cache != cacheDefault {
		c := v.cache
		s.CacheMaxBytes = &c
	}
	return s
}

// cacheName formats a --reference-cache value: "default", "64 MiB", "0 B".
func cacheName(c int64) string {
	switch {
	case c == cacheDefault:
		return "default"
	case c == 0:
		return "0 B"
	case c%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", c>>30)
	case c%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", c>>20)
	case c%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", c>>10)
	default:
		return fmt.Sprintf("%d B", c)
	}
}

// plan expands --systems in its order for one data set and guarantee:
// "reference" becomes every --reference-threads × --reference-cache ×
// --reference-rocksdb × --reference-transactional-stores variant (in that
// nesting, threads outer), the transactional stores under exactly-once only,
// and only on the data sets of --reference-products.
func (o options) plan(products int, guarantee string) []system {
	var out []system
	for _, k := range o.systems {
		if k != sysReference {
			out = append(out, system{kind: k})
			continue
		}
		if len(o.refProducts) > 0 && !slices.Contains(o.refProducts, products) {
			continue
		}
		txns := o.refTxn
		if guarantee != exactlyOnceV2 {
			txns = []bool{false}
		}
		seen := map[refVariant]bool{}
		for _, t := range o.refThreads {
			for _, c := range o.refCaches {
				for _, r := range o.refRocksDB {
					for _, x := range txns {
						v := refVariant{threads: t, cache: c, rocksdb: r, txn: x}
						if !seen[v] {
							seen[v] = true
							out = append(out, system{kind: sysReference, ref: v})
						}
					}
				}
			}
		}
	}
	return out
}

// allSystems lists every system some data set and guarantee runs, in plan
// order.
func (o options) allSystems() []system {
	var out []system
	seen := map[string]bool{}
	for _, p := range o.products {
		for _, g := range o.guarantees {
			for _, s := range o.plan(p, g) {
				if !seen[s.name()] {
					seen[s.name()] = true
					out = append(out, s)
				}
			}
		}
	}
	return out
}

func shortGuarantee(g string) string {
	if g == exactlyOnceV2 {
		return "eos"
	}
	return "alo"
}

// runMetrics are the figures of one process run.
type runMetrics struct {
	Run               string `json:"run"`
	Pid               int    `json:"pid"`
	StartToReadyMs    int64  `json:"start_to_ready_ms"`
	StartToCaughtUpMs int64  `json:"start_to_caught_up_ms,omitempty"`
	// salesagg only: first time /v1/tasks showed every position at the input
	// end (processed, not yet necessarily committed).
	StartToProcessedMs int64 `json:"start_to_processed_ms,omitempty"`
	// Restore as the system reports it (-1: not reported).
	RestoredRecords    int64    `json:"restored_records"`
	RestoreReportedMs  int64    `json:"restore_reported_ms"`
	RestoredPartitions int      `json:"restored_partitions"`
	PeakRSSBytes       int64    `json:"peak_rss_bytes"` // VmHWM (else VmRSS) of /proc/<pid>/status, polled every 100 ms
	RSSSamples         int      `json:"rss_samples"`
	CPUMs              int64    `json:"cpu_ms"` // user+sys over the process's life (wait4)
	CPUUs              int64    `json:"cpu_us"` // the same in µs
	LifetimeMs         int64    `json:"lifetime_ms"`
	StopMs             int64    `json:"stop_ms"`
	Killed             bool     `json:"killed"`
	ExitCode           int      `json:"exit_code"`
	ExitSignal         string   `json:"exit_signal,omitempty"`
	CleanStop          *bool    `json:"clean_stop,omitempty"` // reference: REFERENCE STOPPED clean=
	ErrorLines         int      `json:"error_log_lines"`
	WarnLines          int      `json:"warn_log_lines"`
	FirstErrors        []string `json:"first_errors,omitempty"`
	Logs               string   `json:"logs"`
	// --profile (salesagg): the profile files of this run.
	Profiles *profileFiles `json:"profiles,omitempty"`
}

// systemResult is everything measured of one system under one guarantee.
type systemResult struct {
	System    string `json:"system"`
	Status    string `json:"status"` // ok, failed
	Error     string `json:"error,omitempty"`
	AppID     string `json:"application_id,omitempty"`
	StateDir  string `json:"state_dir,omitempty"`
	Guarantee string `json:"guarantee"`
	// reference only: the variant.
	Reference *refSettings `json:"reference,omitempty"`

	Processing  *runMetrics `json:"processing,omitempty"`
	FullRestore *runMetrics `json:"full_restore,omitempty"`
	Restart     *runMetrics `json:"restart,omitempty"`

	// Derived.
	EventsPerSec             float64 `json:"events_per_s"`               // events / (start → committed at end)
	EventsPerSecAfterReady   float64 `json:"events_per_s_after_ready"`   // events / (ready → committed at end)
	RestoreRecordsPerSec     float64 `json:"restore_records_per_s"`      // restored / reported restore time
	RestoreRecordsPerSecWall float64 `json:"restore_records_per_s_wall"` // restored / (start → ready)
	// events_per_s ÷ the ceiling's events_per_s on the same data set and
	// guarantee (0: no ceiling run).
	EventsPerSecVsCeiling float64 `json:"events_per_s_vs_ceiling,omitempty"`
	// CPU (user+sys) of the processing run per input event, and of the full
	// restore run per restored record, in µs; each over the whole process
	// life (start-up and shutdown included). Ceiling: see ceilingMetrics.CPUMs.
	CPUPerEventUs          float64 `json:"cpu_us_per_event"`
	CPUPerRestoredRecordUs float64 `json:"cpu_us_per_restored_record,omitempty"`

	// Set when the processing run reached --reference-time-limit before the
	// committed offsets reached the input end.
	Cut *cutInfo `json:"cut,omitempty"`

	Verify *verifyResult `json:"verify,omitempty"`
	// salesagg: GET /v1/tasks when caught up.
	Tasks json.RawMessage `json:"tasks_at_caught_up,omitempty"`
	// ceiling only.
	Ceiling *ceilingMetrics `json:"ceiling,omitempty"`

	Anomalies []string `json:"anomalies,omitempty"`
}

// cutInfo: a processing run ended at the time limit; its events/s are the
// committed offsets at that moment ÷ the time since start.
type cutInfo struct {
	LimitMs          int64 `json:"limit_ms"`
	AtMs             int64 `json:"at_ms"` // start → the poll that found the limit passed
	CommittedOffsets int64 `json:"committed_offsets"`
	Events           int   `json:"events"`
}

func (r *systemResult) anomaly(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.Anomalies = append(r.Anomalies, msg)
	logf("%s: ANOMALY: %s", r.System, msg)
}

// instance is one started process of a system, with what its output told.
type instance struct {
	*kit.Proc
	run      string
	httpAddr string // salesagg

	mu sync.Mutex
	// salesagg
	restorationMs   int64
	restoredRecords int64
	restoredLines   int
	// reference
	runningAt   time.Time
	restoreSeen bool
	// both
	errs      kit.ErrorLines
	warnLines int
	cleanStop *bool
}

func (in *instance) noteError(line string) { in.errs.Note(line, 500) }

// driver starts and watches one system's processes.
type driver interface {
	name() string
	appID() string
	stateDir() string
	launch(run string) (*instance, error)
	// waitReady returns when the instance is ready to serve (restored, running).
	waitReady(ctx context.Context, in *instance) (time.Time, error)
	// restoreInfo returns what the instance reported of its restore (after ready).
	restoreInfo(ctx context.Context, in *instance) (records, ms int64, partitions int, ok bool)
	// positionsAtEnd reports whether the instance's own view says it has
	// processed the whole input (salesagg: /v1/tasks positions); ok=false
	// when the system has no such view.
	positionsAtEnd(ctx context.Context, in *instance) (atEnd, ok bool)
	// progress is an extra word for the progress line.
	progress(ctx context.Context, in *instance) string
	// caughtUp is called once caught up, before the changelog is verified.
	caughtUp(ctx context.Context, in *instance, res *systemResult)
}

// measure runs the three runs of a system: processing, full restore (state
// dir deleted), restart with the state dir intact.
func measure(ctx context.Context, e *env, d driver) *systemResult {
	res := &systemResult{System: d.name(), Status: "ok", AppID: d.appID(), StateDir: d.stateDir(), Guarantee: e.guarantee}
	err := measureRuns(ctx, e, d, res)
	if err != nil {
		res.Status = "failed"
		res.Error = err.Error()
		logf("%s: FAILED: %v", d.name(), err)
	}
	return res
}

func measureRuns(ctx context.Context, e *env, d driver, res *systemResult) error {
	events := float64(e.data.events)

	// The notification topic must exist for the reference (the broker does
	// not auto-create topics); salesagg would create it. Both get one made
	// here, like the input: 3 partitions, replication 1.
	if err := kit.CreateTopic(ctx, e.adm, notificationTopic(d.appID()), e.o.partitions); err != nil {
		return err
	}

	// (a) processing.
	logf("%s [%s]: processing run: %d events from %s", d.name(), e.guarantee, e.data.events, e.data.topic)
	m, err := runOnce(ctx, e, d, res, "processing", func(pctx context.Context, in *instance, m *runMetrics, readyAt time.Time) error {
		var until time.Time
		if _, ref := d.(*referenceDriver); ref && e.o.refTimeLimit > 0 {
			until = in.Started.Add(e.o.refTimeLimit)
		}
		caughtAt, processedAt, committed, cut, err := waitCaughtUp(pctx, e, d, in, until)
		if err != nil {
			return err
		}
		if !processedAt.IsZero() {
			m.StartToProcessedMs = processedAt.Sub(in.Started).Milliseconds()
		}
		m.StartToCaughtUpMs = caughtAt.Sub(in.Started).Milliseconds()
		done := events
		if cut {
			done = float64(committed)
			res.Cut = &cutInfo{LimitMs: e.o.refTimeLimit.Milliseconds(), AtMs: m.StartToCaughtUpMs, CommittedOffsets: committed, Events: e.data.events}
		}
		res.EventsPerSec = done / caughtAt.Sub(in.Started).Seconds()
		if d := caughtAt.Sub(readyAt).Seconds(); d > 0 {
			res.EventsPerSecAfterReady = done / d
		}
		if cut {
			logf("%s: CUT at the time limit %s: %d of %d input offsets committed after %.2f s: %.0f events/s so far; the changelog is not verified", d.name(),
				e.o.refTimeLimit, committed, e.data.events, caughtAt.Sub(in.Started).Seconds(), res.EventsPerSec)
			d.caughtUp(pctx, in, res)
			return nil
		}
		logf("%s: caught up %.2f s after start (ready at %.2f s): %.0f events/s", d.name(),
			caughtAt.Sub(in.Started).Seconds(), readyAt.Sub(in.Started).Seconds(), res.EventsPerSec)
		if pf, ok := profiledDriver(e, d); ok {
			heapProfile(pctx, in, m, res, pf.pprofURL(in), e.profilePath(d, "processing", "heap"))
		}
		d.caughtUp(pctx, in, res)
		logf("%s: verifying changelog %s against the expected totals", d.name(), sales.ChangelogTopic(d.appID(), sales.StoreName))
		vr := verifyChangelog(pctx, e.addr, sales.ChangelogTopic(d.appID(), sales.StoreName), e.data.expected, e.o.partitions)
		res.Verify = &vr
		switch {
		case vr.Error != "":
			res.anomaly("changelog verification failed: %s", vr.Error)
		case !vr.OK:
			res.anomaly("changelog differs from the expected totals: %d mismatches, %d missing, %d extra, %d bad values, %d in the wrong partition, %d in several partitions (of %d keys); e.g. %s",
				vr.Mismatches, vr.Missing, vr.Extra, vr.BadValues, vr.WrongPartition, vr.MultiPartition, vr.KeysExpected, strings.Join(vr.Examples, "; "))
		default:
			logf("%s: changelog OK: %d keys, all totals equal (%d changelog records)", d.name(), vr.KeysChecked, vr.ChangelogRecords)
		}
		return nil
	})
	res.Processing = m
	if err != nil {
		return fmt.Errorf("processing run: %w", err)
	}
	res.CPUPerEventUs = float64(m.CPUUs) / events
	if res.Cut != nil && res.Cut.CommittedOffsets > 0 {
		res.CPUPerEventUs = float64(m.CPUUs) / float64(res.Cut.CommittedOffsets)
	}

	// (b) full restore: state dir deleted.
	if err := os.RemoveAll(d.stateDir()); err != nil {
		return fmt.Errorf("deleting state dir: %w", err)
	}
	logf("%s: full restore run (state dir %s deleted)", d.name(), d.stateDir())
	m, err = runOnce(ctx, e, d, res, "full_restore", nil)
	res.FullRestore = m
	if err != nil {
		return fmt.Errorf("full restore run: %w", err)
	}
	if m.RestoredRecords >= 0 && m.RestoreReportedMs > 0 {
		res.RestoreRecordsPerSec = float64(m.RestoredRecords) / (float64(m.RestoreReportedMs) / 1000)
	}
	if m.RestoredRecords >= 0 && m.StartToReadyMs > 0 {
		res.RestoreRecordsPerSecWall = float64(m.RestoredRecords) / (float64(m.StartToReadyMs) / 1000)
	}
	if m.RestoredRecords > 0 {
		res.CPUPerRestoredRecordUs = float64(m.CPUUs) / float64(m.RestoredRecords)
	}
	// With windows a restore reads the window changelogs too.
	if res.Verify != nil && res.Verify.Error == "" && m.RestoredRecords >= 0 && e.o.windows == "" && m.RestoredRecords != res.Verify.ChangelogRecords {
		res.anomaly("full restore restored %d records but the changelog held %d when verified", m.RestoredRecords, res.Verify.ChangelogRecords)
	}

	// (c) restart, state dir intact.
	logf("%s: restart run (state dir intact)", d.name())
	m, err = runOnce(ctx, e, d, res, "restart", nil)
	res.Restart = m
	if err != nil {
		return fmt.Errorf("restart run: %w", err)
	}
	if m.RestoredRecords > 0 {
		res.anomaly("restart with the state dir intact after a clean SIGTERM restored %d records (expected 0)", m.RestoredRecords)
	}
	return nil
}

// runOnce starts the system, waits until ready, runs body (if any), and
// stops it with SIGTERM, recording the run's figures.
func runOnce(ctx context.Context, e *env, d driver, res *systemResult, run string,
	body func(ctx context.Context, in *instance, m *runMetrics, readyAt time.Time) error) (*runMetrics, error) {
	pctx, cancel := context.WithTimeout(ctx, e.o.phaseTimeout)
	defer cancel()
	m := &runMetrics{Run: run, RestoredRecords: -1, RestoreReportedMs: -1}
	in, err := d.launch(run)
	if err != nil {
		return m, err
	}
	m.Pid = in.PID
	m.Logs = filepath.Join(in.LogDir, in.Name+".{stdout,stderr}")
	defer in.Kill()

	// --profile: a CPU profile from the start of a full restore (the restore
	// happens before ready), from ready in a processing run.
	pf, profiling := profiledDriver(e, d)
	var cpuProf *cpuProfile
	startCPU := func() {
		cpuProf = startCPUProfile(pctx, in, pf.pprofURL(in), e.profilePath(d, run, "cpu"), e.o.profileSeconds)
	}
	if profiling {
		m.Profiles = &profileFiles{}
		if run == "full_restore" {
			startCPU()
		}
	}

	finish := func() {
		if cpuProf != nil {
			// The process must not be stopped before the profile is in.
			cpuProf.finish(in, m, res, d.name(), run)
		}
		took, killed := in.Stop(e.o.stopTimeout)
		m.StopMs, m.Killed = took.Milliseconds(), killed
		code, sig, cpu := in.ExitInfo()
		m.ExitCode, m.ExitSignal, m.CPUMs, m.CPUUs = code, sig, cpu.Milliseconds(), cpu.Microseconds()
		m.LifetimeMs = in.ExitedAt().Sub(in.Started).Milliseconds()
		m.PeakRSSBytes = in.Peak()
		m.RSSSamples = in.Samples()
		in.mu.Lock()
		m.CleanStop = in.cleanStop
		m.ErrorLines, m.WarnLines = in.errs.Count, in.warnLines
		m.FirstErrors = in.errs.First
		in.mu.Unlock()
		if killed {
			res.anomaly("%s run: no exit within %s of SIGTERM; killed", run, e.o.stopTimeout)
		} else if code != 0 && !(code == 143 && m.CleanStop != nil && *m.CleanStop) {
			// (The JVM exits with 128+SIGTERM after its shutdown hooks ran:
			// 143 with "REFERENCE STOPPED clean=true" is a clean stop.)
			res.anomaly("%s run: exit code %d%s after SIGTERM", run, code, map[bool]string{true: " (signal " + sig + ")", false: ""}[sig != ""])
		}
		if m.CleanStop != nil && !*m.CleanStop {
			res.anomaly("%s run: the reference reported an unclean stop", run)
		}
		if m.ErrorLines > 0 {
			first := m.FirstErrors[0]
			if len(first) > 300 {
				first = first[:300] + "…"
			}
			res.anomaly("%s run: %d error log lines (in %s), first: %s", run, m.ErrorLines, m.Logs, first)
		}
		logf("%s: %s run stopped in %.2f s (exit %d%s), peak RSS %.1f MiB, CPU %.2f s", d.name(), run,
			took.Seconds(), code, map[bool]string{true: ", KILLED", false: ""}[killed], float64(m.PeakRSSBytes)/(1<<20), cpu.Seconds())
	}

	readyAt, err := d.waitReady(pctx, in)
	if err != nil {
		cpuProf.abandon()
		finish()
		return m, err
	}
	m.StartToReadyMs = readyAt.Sub(in.Started).Milliseconds()
	if profiling {
		switch run {
		case "processing":
			startCPU()
		case "full_restore":
			heapProfile(pctx, in, m, res, pf.pprofURL(in), e.profilePath(d, run, "heap"))
		}
	}
	if recs, ms, parts, ok := d.restoreInfo(pctx, in); ok {
		m.RestoredRecords, m.RestoreReportedMs, m.RestoredPartitions = recs, ms, parts
	} else {
		res.anomaly("%s run: the restore report was not found in the output", run)
	}
	logf("%s: %s run ready %.2f s after start; restored %d records in %d ms (reported)", d.name(), run,
		readyAt.Sub(in.Started).Seconds(), m.RestoredRecords, m.RestoreReportedMs)
	if body != nil {
		if err := body(pctx, in, m, readyAt); err != nil {
			cpuProf.abandon()
			finish()
			return m, err
		}
	}
	if !in.Alive() {
		cpuProf.abandon()
		finish()
		return m, in.ExitError("before it was stopped")
	}
	finish()
	return m, nil
}

// waitCaughtUp polls the group's committed offsets every 100 ms until they
// reach the input end offsets.
// It also returns when the system's own view first said the whole input was
// processed (zero if it has none).
func waitCaughtUp(ctx context.Context, e *env, d driver, in *instance, until time.Time) (caught, processed time.Time, committed int64, cut bool, err error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastLog := time.Now()
	hasView := true
	for {
		if hasView && processed.IsZero() {
			atEnd, ok := d.positionsAtEnd(ctx, in)
			hasView = ok
			if atEnd {
				processed = time.Now()
			}
		}
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		at, sum, err := kit.CommittedAtEnd(qctx, e.adm, d.appID(), e.data.topic, e.data.ends)
		cancel()
		now := time.Now()
		if err == nil {
			committed = sum
			if at {
				return now, processed, committed, false, nil
			}
			if !until.IsZero() && now.After(until) {
				return now, processed, committed, true, nil
			}
		}
		if !in.Alive() {
			return time.Time{}, time.Time{}, committed, false, in.ExitError("while processing")
		}
		if now.Sub(lastLog) >= 5*time.Second {
			lastLog = now
			logf("%s: processing: %d of %d input offsets committed (%.1f%%), %.0f s since start%s", d.name(), committed, e.data.events,
				100*float64(committed)/float64(e.data.events), now.Sub(in.Started).Seconds(), d.progress(ctx, in))
		}
		select {
		case <-ctx.Done():
			return time.Time{}, time.Time{}, committed, false, fmt.Errorf("not caught up (%d of %d offsets committed): %w", committed, e.data.events, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

func notificationTopic(app string) string { return app + "-notifications" }

// ---------------------------------------------------------------------------
// salesagg

type salesaggDriver struct {
	e     *env
	app   string
	state string
	http  *http.Client
}

func newSalesagg(e *env) *salesaggDriver {
	app := e.prefix + "-" + e.data.slug() + "-salesagg-" + shortGuarantee(e.guarantee)
	return &salesaggDriver{e: e, app: app, state: filepath.Join(e.tmp, "state", app), http: &http.Client{Timeout: 2 * time.Second}}
}

func (d *salesaggDriver) name() string     { return sysSalesagg }
func (d *salesaggDriver) appID() string    { return d.app }
func (d *salesaggDriver) stateDir() string { return d.state }

var restorationRe = regexp.MustCompile(`^Restoration took (\d+) ms`)

func (d *salesaggDriver) launch(run string) (*instance, error) {
	port, err := kit.FreePort()
	if err != nil {
		return nil, err
	}
	in := &instance{run: run, httpAddr: fmt.Sprintf("127.0.0.1:%d", port), restorationMs: -1}
	args := []string{"run",
		"--bootstrap.servers", d.e.addr,
		"--application.id", d.app,
		"--state.dir", d.state,
		"--http.addr", in.httpAddr,
		"--input.topic", d.e.data.topic,
		"--notification.topic", notificationTopic(d.app),
		"--processing.guarantee", d.e.guarantee,
		"--commit.interval.ms", strconv.FormatInt(d.e.o.commitInterval.Milliseconds(), 10),
		"--log.format", "json",
	}
	if d.e.o.profile {
		args = append(args, "--http.pprof", "true")
	}
	if d.e.o.windows != "" {
		args = append(args, "--windows.sizes", d.e.o.windows)
	}
	onLine := func(stream string, _ time.Time, line string) {
		if stream != "stderr" {
			return
		}
		var rec struct {
			Level   string `json:"level"`
			Msg     string `json:"msg"`
			Records *int64 `json:"records"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			in.mu.Lock()
			if strings.Contains(line, "panic") || strings.Contains(line, "fatal") {
				in.noteError(line)
			}
			in.mu.Unlock()
			return
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		switch rec.Level {
		case "error", "dpanic", "panic", "fatal":
			in.noteError(line)
		case "warn":
			in.warnLines++
		}
		if strings.HasPrefix(rec.Msg, "Finished restoring changelog ") && rec.Records != nil {
			in.restoredRecords += *rec.Records
			in.restoredLines++
		}
		if m := restorationRe.FindStringSubmatch(rec.Msg); m != nil {
			in.restorationMs, _ = strconv.ParseInt(m[1], 10, 64)
		}
	}
	p, err := kit.Start(kit.Spec{Name: d.e.data.slug() + "-salesagg-" + shortGuarantee(d.e.guarantee) + "-" + run, LogDir: filepath.Join(d.e.tmp, "logs"),
		Path: d.e.salesagg, Args: args, Dir: d.e.o.repo, SampleRSS: true, OnLine: onLine})
	if err != nil {
		return nil, err
	}
	in.Proc = p
	return in, nil
}

func (d *salesaggDriver) waitReady(ctx context.Context, in *instance) (time.Time, error) {
	url := "http://" + in.httpAddr + "/readyz"
	lastLog := time.Now()
	reason := ""
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := d.http.Do(req)
		if err == nil {
			now := time.Now()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return now, nil
			}
			reason = strings.TrimSpace(string(body))
		}
		if !in.Alive() {
			return time.Time{}, in.ExitError("before it was ready")
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			logf("salesagg: waiting for /readyz (%.0f s since start): %s", time.Since(in.Started).Seconds(), reason)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("not ready (last /readyz: %s): %w", reason, context.Cause(ctx))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (d *salesaggDriver) pprofURL(in *instance) string {
	return "http://" + in.httpAddr + "/debug/pprof"
}

func (d *salesaggDriver) restoreInfo(ctx context.Context, in *instance) (int64, int64, int, bool) {
	// The "Restoration took" line may come a moment after /readyz turns 200.
	deadline := time.Now().Add(10 * time.Second)
	for {
		in.mu.Lock()
		ms, recs, lines := in.restorationMs, in.restoredRecords, in.restoredLines
		in.mu.Unlock()
		if ms >= 0 && lines >= d.e.o.partitions {
			return recs, ms, lines, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return recs, ms, lines, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type taskStatus struct {
	Task      string `json:"task"`
	Partition int32  `json:"partition"`
	State     string `json:"state"`
	Position  int64  `json:"position"`
	Lag       int64  `json:"lag"`
	Processed int64  `json:"processed"`
	Dups      int64  `json:"duplicates_skipped"`
	Bad       int64  `json:"bad_events"`
	Forwarded int64  `json:"forwarded"`
}

func (d *salesaggDriver) tasks(ctx context.Context, in *instance) ([]byte, []taskStatus, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+in.httpAddr+"/v1/tasks", nil)
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, nil, fmt.Errorf("GET /v1/tasks: %s", resp.Status)
	}
	var v struct {
		Tasks []taskStatus `json:"tasks"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return body, nil, err
	}
	return body, v.Tasks, nil
}

func (d *salesaggDriver) positionsAtEnd(ctx context.Context, in *instance) (bool, bool) {
	_, ts, err := d.tasks(ctx, in)
	if err != nil || len(ts) != d.e.o.partitions {
		return false, true
	}
	for _, t := range ts {
		if t.Position < d.e.data.ends[t.Partition] {
			return false, true
		}
	}
	return true, true
}

func (d *salesaggDriver) progress(ctx context.Context, in *instance) string {
	_, ts, err := d.tasks(ctx, in)
	if err != nil {
		return ""
	}
	var lag, processed int64
	for _, t := range ts {
		lag += t.Lag
		processed += t.Processed
	}
	return fmt.Sprintf("; /v1/tasks: processed %d, lag %d", processed, lag)
}

func (d *salesaggDriver) caughtUp(ctx context.Context, in *instance, res *systemResult) {
	body, ts, err := d.tasks(ctx, in)
	if err != nil {
		res.anomaly("GET /v1/tasks when caught up: %v", err)
		return
	}
	res.Tasks = json.RawMessage(body)
	var processed, dups, bad int64
	for _, t := range ts {
		processed += t.Processed
		dups += t.Dups
		bad += t.Bad
		if t.State != "running" {
			res.anomaly("task %s is %s when caught up", t.Task, t.State)
		}
		if end := d.e.data.ends[t.Partition]; t.Position != end {
			res.anomaly("task %s position %d, input end offset %d", t.Task, t.Position, end)
		}
	}
	if len(ts) != d.e.o.partitions {
		res.anomaly("/v1/tasks lists %d tasks, want %d", len(ts), d.e.o.partitions)
	}
	if processed != int64(d.e.data.events) || dups != 0 || bad != 0 {
		res.anomaly("/v1/tasks when caught up: processed %d (want %d), duplicates skipped %d, bad events %d", processed, d.e.data.events, dups, bad)
	}
}

// ---------------------------------------------------------------------------
// Kafka Streams reference

type referenceDriver struct {
	e       *env
	variant refVariant
	slug    string // of the data set, variant and guarantee
	app     string
	state   string
}

func newReference(e *env, v refVariant) *referenceDriver {
	slug := e.data.slug() + "-" + v.slug() + "-" + shortGuarantee(e.guarantee)
	app := e.prefix + "-" + slug
	return &referenceDriver{e: e, variant: v, slug: slug, app: app, state: filepath.Join(e.tmp, "state", app)}
}

func (d *referenceDriver) name() string     { return d.variant.name() }
func (d *referenceDriver) appID() string    { return d.app }
func (d *referenceDriver) stateDir() string { return d.state }

var (
	refRestoreTotalRe = regexp.MustCompile(`^REFERENCE RESTORE TOTAL records=(\d+) ms=(\d+)`)
	refStoppedRe      = regexp.MustCompile(`^REFERENCE STOPPED clean=(\w+)`)
)

func (d *referenceDriver) launch(run string) (*instance, error) {
	in := &instance{run: run, restorationMs: -1}
	args := []string{
		"--bootstrap", d.e.addr,
		"--application-id", d.app,
		"--state-dir", d.state,
		"--processing-guarantee", d.e.guarantee,
		"--input-topic", d.e.data.topic,
		"--notification-topic", notificationTopic(d.app),
		"--commit-interval-ms", strconv.FormatInt(d.e.o.commitInterval.Milliseconds(), 10),
		"--leave-group-on-close", "true",
		"--num-stream-threads", strconv.Itoa(d.variant.threads),
	}
	if d.variant.cache != cacheDefault {
		args = append(args, "--cache-max-bytes", strconv.FormatInt(d.variant.cache, 10))
	}
	if d.variant.rocksdb == rocksTuned {
		args = append(args, "--rocksdb", rocksTuned)
	}
	if d.variant.txn {
		args = append(args, "--transactional-state-stores", "true")
	}
	if d.e.o.windows != "" {
		args = append(args, "--windows", d.e.o.windows)
	}
	var (
		pendingRecs, pendingMs int64 = -1, -1
		restoreEnds            int
	)
	onLine := func(stream string, at time.Time, line string) {
		in.mu.Lock()
		defer in.mu.Unlock()
		if stream == "stderr" {
			switch {
			case strings.Contains(line, "] ERROR "):
				in.noteError(line)
			case strings.Contains(line, "] WARN "):
				in.warnLines++
			}
			return
		}
		switch {
		case strings.HasPrefix(line, "REFERENCE RESTORE END "):
			restoreEnds++
		case strings.HasPrefix(line, "REFERENCE RESTORE TOTAL "):
			if m := refRestoreTotalRe.FindStringSubmatch(line); m != nil {
				pendingRecs, _ = strconv.ParseInt(m[1], 10, 64)
				pendingMs, _ = strconv.ParseInt(m[2], 10, 64)
			}
		case line == "REFERENCE STATE RUNNING":
			if in.runningAt.IsZero() {
				in.runningAt = at
				if pendingRecs >= 0 {
					in.restoreSeen = true
					in.restoredRecords, in.restorationMs, in.restoredLines = pendingRecs, pendingMs, restoreEnds
				}
			}
		case strings.HasPrefix(line, "REFERENCE ERROR"):
			in.noteError(line)
		case strings.HasPrefix(line, "REFERENCE STOPPED "):
			if m := refStoppedRe.FindStringSubmatch(line); m != nil {
				clean := m[1] == "true"
				in.cleanStop = &clean
			}
		}
	}
	p, err := kit.Start(kit.Spec{Name: d.slug + "-" + run, LogDir: filepath.Join(d.e.tmp, "logs"),
		Path: d.e.refRunSh, Args: args, Dir: d.e.o.repo, SampleRSS: true, OnLine: onLine})
	if err != nil {
		return nil, err
	}
	in.Proc = p
	return in, nil
}

func (d *referenceDriver) waitReady(ctx context.Context, in *instance) (time.Time, error) {
	lastLog := time.Now()
	for {
		in.mu.Lock()
		at := in.runningAt
		in.mu.Unlock()
		if !at.IsZero() {
			return at, nil
		}
		if !in.Alive() {
			return time.Time{}, in.ExitError("before it was RUNNING")
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			logf("reference: waiting for REFERENCE STATE RUNNING (%.0f s since start)", time.Since(in.Started).Seconds())
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("not RUNNING: %w", context.Cause(ctx))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (d *referenceDriver) restoreInfo(_ context.Context, in *instance) (int64, int64, int, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.restoredRecords, in.restorationMs, in.restoredLines, in.restoreSeen
}

func (d *referenceDriver) positionsAtEnd(context.Context, *instance) (bool, bool) {
	return false, false
}

func (d *referenceDriver) progress(context.Context, *instance) string { return "" }

func (d *referenceDriver) caughtUp(context.Context, *instance, *systemResult) {}

// ---------------------------------------------------------------------------
// ceiling: a consume-only franz-go group consumer in this process.

type ceilingMetrics struct {
	Group                string `json:"group"`
	StartToAssignedMs    int64  `json:"start_to_assigned_ms"`
	StartToFirstRecordMs int64  `json:"start_to_first_record_ms"`
	StartToDoneMs        int64  `json:"start_to_done_ms"`
	Records              int64  `json:"records"`
	Bytes                int64  `json:"bytes"`
	// CPU (user+sys) of the whole harness process (getrusage RUSAGE_SELF)
	// from the client's creation to the last record: franz-go's fetching and
	// decoding, the group join, and whatever else the harness did meanwhile
	// (nothing but this consumer runs then).
	CPUMs int64 `json:"cpu_ms"`
	CPUUs int64 `json:"cpu_us"`
}

func runCeiling(ctx context.Context, e *env) *systemResult {
	group := e.prefix + "-" + e.data.slug() + "-ceiling-" + shortGuarantee(e.guarantee)
	res := &systemResult{System: sysCeiling, Status: "ok", AppID: group, Guarantee: e.guarantee}
	cm, err := consumeAll(ctx, e, group)
	res.Ceiling = cm
	if err != nil {
		res.Status, res.Error = "failed", err.Error()
		logf("ceiling: FAILED: %v", err)
		return res
	}
	events := float64(e.data.events)
	res.EventsPerSec = events / (float64(cm.StartToDoneMs) / 1000)
	res.CPUPerEventUs = float64(cm.CPUUs) / events
	if d := cm.StartToDoneMs - cm.StartToAssignedMs; d > 0 {
		res.EventsPerSecAfterReady = events / (float64(d) / 1000)
	}
	if cm.Records != int64(e.data.events) {
		res.anomaly("consumed %d records, want %d", cm.Records, e.data.events)
	}
	logf("ceiling: consumed %d records in %.2f s (assigned at %.2f s): %.0f events/s", cm.Records,
		float64(cm.StartToDoneMs)/1000, float64(cm.StartToAssignedMs)/1000, res.EventsPerSec)
	return res
}

func consumeAll(ctx context.Context, e *env, group string) (*ceilingMetrics, error) {
	cm := &ceilingMetrics{Group: group}
	ctx, cancel := context.WithTimeout(ctx, e.o.phaseTimeout)
	defer cancel()
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	var (
		mu         sync.Mutex
		assignedAt time.Time
	)
	t0 := time.Now()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(e.addr),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(e.data.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			mu.Lock()
			if assignedAt.IsZero() {
				assignedAt = time.Now()
			}
			mu.Unlock()
		}),
	)
	if err != nil {
		return cm, err
	}
	defer cl.Close()
	want := map[int32]int64{}
	for p, end := range e.data.ends {
		if end > 0 {
			want[p] = end - 1
		}
	}
	var first time.Time
	for len(want) > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return cm, fmt.Errorf("consumed %d of %d records: %w", cm.Records, e.data.events, context.Cause(ctx))
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return cm, ferr
		}
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			n := len(fp.Records)
			if n == 0 {
				return
			}
			if first.IsZero() {
				first = time.Now()
			}
			cm.Records += int64(n)
			for _, r := range fp.Records {
				cm.Bytes += int64(len(r.Key) + len(r.Value))
			}
			if last, ok := want[fp.Partition]; ok && fp.Records[n-1].Offset >= last {
				delete(want, fp.Partition)
			}
		})
	}
	done := time.Now()
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	cpu := tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	cm.CPUMs, cm.CPUUs = cpu.Milliseconds(), cpu.Microseconds()
	mu.Lock()
	if !assignedAt.IsZero() {
		cm.StartToAssignedMs = assignedAt.Sub(t0).Milliseconds()
	}
	mu.Unlock()
	cm.StartToFirstRecordMs = first.Sub(t0).Milliseconds()
	cm.StartToDoneMs = done.Sub(t0).Milliseconds()
	return cm, nil
}
