package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
)

type report struct {
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Guarantee  string    `json:"guarantee"`
	Events     int       `json:"events"`
	// --events; Events is raised to Products when lower.
	EventsRequested  int                      `json:"events_requested"`
	Products         int                      `json:"products"`
	DistinctProducts int                      `json:"distinct_products"`
	Partitions       int                      `json:"partitions"`
	Seed             uint64                   `json:"seed"`
	InputTopic       string                   `json:"input_topic"`
	InputBytes       int64                    `json:"input_bytes"`
	Bootstrap        string                   `json:"bootstrap"`
	ExternalBroker   bool                     `json:"external_broker"`
	CommitIntervalMs int64                    `json:"commit_interval_ms"`
	ProduceMs        int64                    `json:"produce_ms"`
	Machine          kit.Machine              `json:"machine"`
	Versions         kit.Versions             `json:"versions"`
	Order            []string                 `json:"order"`
	Systems          map[string]*systemResult `json:"systems"`
	// The reference variant with the highest processing events/s; the
	// salesagg/reference ratios are against it.
	BestReference string `json:"best_reference,omitempty"`
	// Windows are the window sizes both systems kept (--windows), and
	// EventSpanMs the span of the events' timestamps (--event-span).
	Windows        string `json:"windows,omitempty"`
	EventSpanMs    int64  `json:"event_span_ms,omitempty"`
	Profile        bool   `json:"profile"`
	ProfileSeconds int    `json:"profile_seconds,omitempty"`
	Table          string `json:"table_markdown"`

	stem string // results path without ".json"
}

// ---------------------------------------------------------------------------
// Table

type row struct {
	name    string
	cell    func(r *systemResult) (float64, string, bool) // value, formatted, ok
	noRatio bool
}

func (rep *report) header() string {
	var b strings.Builder
	m := rep.Machine
	fmt.Fprintf(&b, "## salesagg vs Kafka Streams reference — %s, %s products\n\n", rep.Guarantee, kit.Group(int64(rep.Products)))
	raised := ""
	if rep.Events != rep.EventsRequested {
		raised = fmt.Sprintf(" (--events %d raised to the product count)", rep.EventsRequested)
	}
	fmt.Fprintf(&b, "- data: %d events%s over %d products (%d distinct), %d input partitions, seed %d, %s of keys+values\n",
		rep.Events, raised, rep.Products, rep.DistinctProducts, rep.Partitions, rep.Seed, mib(rep.InputBytes))
	fmt.Fprintf(&b, "- machine: %d cores (%s), %s RAM, load average %s at start, %s at end\n",
		m.Cores, m.CPUModel, kit.GiB(m.MemTotalBytes), m.LoadAvgStart, m.LoadAvgEnd)
	v := rep.Versions
	dirty := ""
	if v.GitDirty {
		dirty = " (work tree modified)"
	}
	fmt.Fprintf(&b, "- versions: %s, Java %s, Kafka broker %s, Kafka Streams %s, git %s%s\n",
		v.Go, v.Java, v.Kafka, v.KafkaStreams, kit.Short(v.GitCommit), dirty)
	fmt.Fprintf(&b, "- commit interval %d ms for both; systems run one after another on one broker (%s)\n", rep.CommitIntervalMs, rep.Bootstrap)
	if rep.Windows != "" {
		fmt.Fprintf(&b, "- **windows** %s for both (tumbling, by record timestamp), events' timestamps over %s\n",
			rep.Windows, time.Duration(rep.EventSpanMs)*time.Millisecond)
	}
	if rep.Profile {
		fmt.Fprintf(&b, "- **profiled** (--profile): salesagg served net/http/pprof and was CPU-profiled for %d s in its processing and full restore runs; its figures include the profiler's cost\n",
			rep.ProfileSeconds)
	}
	return b.String()
}

// derive fills in the figures that compare systems: the best reference
// variant and every system's throughput relative to the ceiling's.
func (rep *report) derive() {
	rep.BestReference = ""
	best := 0.0
	for _, name := range rep.Order {
		r := rep.Systems[name]
		if r == nil || r.Reference == nil || r.Status != "ok" || r.EventsPerSec <= best {
			continue
		}
		rep.BestReference, best = name, r.EventsPerSec
	}
	c := rep.Systems[sysCeiling]
	for _, r := range rep.Systems {
		r.EventsPerSecVsCeiling = 0
		if c != nil && c.EventsPerSec > 0 && r != c && r.EventsPerSec > 0 {
			r.EventsPerSecVsCeiling = r.EventsPerSec / c.EventsPerSec
		}
	}
}

// columns are the systems of the table, in this order: salesagg, the
// reference variants (in run order), the ceiling; those that ran.
func (rep *report) columns() []string {
	var cols, refs []string
	for _, name := range rep.Order {
		if r := rep.Systems[name]; r != nil && r.Reference != nil {
			refs = append(refs, name)
		}
	}
	if rep.Systems[sysSalesagg] != nil {
		cols = append(cols, sysSalesagg)
	}
	cols = append(cols, refs...)
	if rep.Systems[sysCeiling] != nil {
		cols = append(cols, sysCeiling)
	}
	return cols
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func secs(ms int64) (float64, string, bool) {
	return float64(ms) / 1000, fmt.Sprintf("%.2f", float64(ms)/1000), true
}

func count(n float64) (float64, string, bool) {
	return n, kit.Group(int64(math.Round(n))), true
}

func none() (float64, string, bool) { return 0, "", false }

// micros formats a µs figure with three significant digits or so.
func micros(v float64) (float64, string, bool) {
	switch {
	case v < 10:
		return v, fmt.Sprintf("%.2f", v), true
	case v < 100:
		return v, fmt.Sprintf("%.1f", v), true
	default:
		return v, fmt.Sprintf("%.0f", v), true
	}
}

func runOf(r *systemResult, which string) *runMetrics {
	switch which {
	case "processing":
		return r.Processing
	case "full_restore":
		return r.FullRestore
	default:
		return r.Restart
	}
}

func rows() []row {
	run := func(which string, f func(m *runMetrics) (float64, string, bool)) func(r *systemResult) (float64, string, bool) {
		return func(r *systemResult) (float64, string, bool) {
			m := runOf(r, which)
			if m == nil {
				return none()
			}
			return f(m)
		}
	}
	rss := func(m *runMetrics) (float64, string, bool) {
		if m.PeakRSSBytes <= 0 {
			return none()
		}
		v := float64(m.PeakRSSBytes) / (1 << 20)
		return v, fmt.Sprintf("%.0f", v), true
	}
	return []row{
		{name: "(a) start → ready, processing run (s) ↓", cell: func(r *systemResult) (float64, string, bool) {
			if r.Ceiling != nil {
				return secs(r.Ceiling.StartToAssignedMs)
			}
			if r.Processing == nil || r.Processing.StartToReadyMs == 0 {
				return none()
			}
			return secs(r.Processing.StartToReadyMs)
		}},
		{name: "(a) start → committed offsets = input end (s) ↓", cell: func(r *systemResult) (float64, string, bool) {
			if r.Ceiling != nil {
				return secs(r.Ceiling.StartToDoneMs)
			}
			if r.Processing == nil || r.Processing.StartToCaughtUpMs == 0 {
				return none()
			}
			return secs(r.Processing.StartToCaughtUpMs)
		}},
		{name: "(a) start → all input processed, own view (s) ↓", cell: run("processing", func(m *runMetrics) (float64, string, bool) {
			if m.StartToProcessedMs == 0 {
				return none()
			}
			return secs(m.StartToProcessedMs)
		})},
		{name: "(a) **throughput, events/s (from process start)** ↑", cell: func(r *systemResult) (float64, string, bool) {
			if r.EventsPerSec == 0 {
				return none()
			}
			return count(r.EventsPerSec)
		}},
		{name: "(a) throughput after ready, events/s ↑", cell: func(r *systemResult) (float64, string, bool) {
			if r.EventsPerSecAfterReady == 0 {
				return none()
			}
			return count(r.EventsPerSecAfterReady)
		}},
		{name: "(a) throughput ÷ the ceiling's ↑", noRatio: true, cell: func(r *systemResult) (float64, string, bool) {
			if r.EventsPerSecVsCeiling == 0 {
				return none()
			}
			return r.EventsPerSecVsCeiling, times(r.EventsPerSecVsCeiling), true
		}},
		{name: "CPU time of the processing run, user+sys (s) ↓", cell: func(r *systemResult) (float64, string, bool) {
			if r.Ceiling != nil {
				return secs(r.Ceiling.CPUMs)
			}
			if r.Processing == nil || r.Processing.CPUMs == 0 {
				return none()
			}
			return secs(r.Processing.CPUMs)
		}},
		{name: "**CPU per event, processing run, user+sys (µs)** ↓", cell: func(r *systemResult) (float64, string, bool) {
			if r.CPUPerEventUs == 0 {
				return none()
			}
			return micros(r.CPUPerEventUs)
		}},
		{name: "(d) **peak RSS, processing run (MiB)** ↓", cell: run("processing", rss)},
		{name: "stop after SIGTERM, processing run (s) ↓", cell: run("processing", func(m *runMetrics) (float64, string, bool) {
			if m.LifetimeMs == 0 {
				return none()
			}
			return secs(m.StopMs)
		})},
		{name: "changelog records after processing", cell: func(r *systemResult) (float64, string, bool) {
			if r.Verify == nil || r.Verify.Error != "" {
				return none()
			}
			return count(float64(r.Verify.ChangelogRecords))
		}},
		{name: "correctness: changelog totals ≠ expected (of keys)", noRatio: true, cell: func(r *systemResult) (float64, string, bool) {
			if r.Verify == nil {
				return none()
			}
			v := r.Verify
			if v.Error != "" {
				return 0, "ERROR", true
			}
			bad := v.Mismatches + v.Missing + v.Extra + int(v.BadValues) + v.WrongPartition + v.MultiPartition
			s := fmt.Sprintf("%d of %s", bad, kit.Group(int64(v.KeysExpected)))
			if bad > 0 {
				s = "**" + s + " WRONG**"
			}
			return float64(bad), s, true
		}},
		{name: "(b) **full restore: start → ready (s)** ↓", cell: run("full_restore", func(m *runMetrics) (float64, string, bool) {
			if m.StartToReadyMs == 0 {
				return none()
			}
			return secs(m.StartToReadyMs)
		})},
		{name: "(b) full restore: records restored", cell: run("full_restore", func(m *runMetrics) (float64, string, bool) {
			if m.RestoredRecords < 0 {
				return none()
			}
			return count(float64(m.RestoredRecords))
		})},
		{name: "(b) full restore: restore time reported (s) ↓", cell: run("full_restore", func(m *runMetrics) (float64, string, bool) {
			if m.RestoreReportedMs < 0 {
				return none()
			}
			return secs(m.RestoreReportedMs)
		})},
		{name: "(b) full restore: records/s (reported restore time) ↑", cell: func(r *systemResult) (float64, string, bool) {
			if r.RestoreRecordsPerSec == 0 {
				return none()
			}
			return count(r.RestoreRecordsPerSec)
		}},
		{name: "(b) full restore: records/s (start → ready) ↑", cell: func(r *systemResult) (float64, string, bool) {
			if r.RestoreRecordsPerSecWall == 0 {
				return none()
			}
			return count(r.RestoreRecordsPerSecWall)
		}},
		{name: "(b) full restore: CPU time of the run, user+sys (s) ↓", cell: run("full_restore", func(m *runMetrics) (float64, string, bool) {
			if m.CPUUs == 0 {
				return none()
			}
			return secs(m.CPUMs)
		})},
		{name: "(b) full restore: CPU per restored record (µs) ↓", cell: func(r *systemResult) (float64, string, bool) {
			if r.CPUPerRestoredRecordUs == 0 {
				return none()
			}
			return micros(r.CPUPerRestoredRecordUs)
		}},
		{name: "(d) peak RSS, full restore run (MiB) ↓", cell: run("full_restore", rss)},
		{name: "(c) **restart, state intact: start → ready (s)** ↓", cell: run("restart", func(m *runMetrics) (float64, string, bool) {
			if m.StartToReadyMs == 0 {
				return none()
			}
			return secs(m.StartToReadyMs)
		})},
		{name: "(c) restart, state intact: records restored", cell: run("restart", func(m *runMetrics) (float64, string, bool) {
			if m.RestoredRecords < 0 {
				return none()
			}
			return count(float64(m.RestoredRecords))
		})},
		{name: "(d) peak RSS, restart run (MiB) ↓", cell: run("restart", rss)},
	}
}

func (rep *report) table() string {
	get := func(sys string, rw row) (float64, string, bool) {
		r := rep.Systems[sys]
		if r == nil {
			return 0, "not run", false
		}
		v, s, ok := rw.cell(r)
		if !ok {
			if r.Status != "ok" {
				return 0, "failed", false
			}
			return 0, "–", false
		}
		return v, s, true
	}
	ratio := func(a, b float64, okA, okB bool, rw row) string {
		if !okA || !okB || rw.noRatio || b == 0 {
			return "–"
		}
		return times(a / b)
	}
	cols := rep.columns()
	hasRef := false
	for _, c := range cols {
		hasRef = hasRef || rep.Systems[c].Reference != nil
	}
	withSalesagg := rep.Systems[sysSalesagg] != nil
	refRatio := withSalesagg && hasRef
	ceilRatio := withSalesagg && rep.Systems[sysCeiling] != nil

	var b strings.Builder
	b.WriteString("| metric |")
	for _, c := range cols {
		if c == rep.BestReference {
			c += " **best**"
		}
		fmt.Fprintf(&b, " %s |", c)
	}
	if refRatio {
		b.WriteString(" salesagg / best reference |")
	}
	if ceilRatio {
		b.WriteString(" salesagg / ceiling |")
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(cols)+btoi(refRatio)+btoi(ceilRatio)) + "\n")
	for _, rw := range rows() {
		fmt.Fprintf(&b, "| %s |", rw.name)
		for _, c := range cols {
			_, s, _ := get(c, rw)
			fmt.Fprintf(&b, " %s |", s)
		}
		sv, _, sok := get(sysSalesagg, rw)
		if refRatio {
			s := "–"
			if rep.BestReference != "" {
				rv, _, rok := get(rep.BestReference, rw)
				s = ratio(sv, rv, sok, rok, rw)
			}
			fmt.Fprintf(&b, " %s |", s)
		}
		if ceilRatio {
			cv, _, cok := get(sysCeiling, rw)
			fmt.Fprintf(&b, " %s |", ratio(sv, cv, sok, cok, rw))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n↓ lower is better, ↑ higher is better. ceiling: an in-process franz-go group consumer (no processing, no commits):\n" +
		"its \"ready\" is the partition assignment, its end the last input record consumed, its CPU time the harness process's\n" +
		"(getrusage) over that consume. CPU per event / per restored record: the run's whole-process CPU (start-up and shutdown\n" +
		"included) ÷ input events / records restored.\n" +
		"\"own view\": salesagg's GET /v1/tasks shows every position at the input end (processed; the commit follows);\n" +
		"the reference exposes no such view.\n")
	if hasRef {
		b.WriteString("reference (threads T, cache C): Kafka Streams with num.stream.threads T and statestore.cache.max.bytes C\n" +
			"(default: 10 MiB); **best**: the variant with the highest processing events/s, the one the salesagg / best reference\n" +
			"ratios are against.\n")
	}
	return b.String()
}

// times formats a ratio: two decimals, two significant digits below 0.1.
func times(r float64) string {
	if r >= 0.1 {
		return fmt.Sprintf("%.2f×", r)
	}
	return fmt.Sprintf("%.2g×", r)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// profileList lists the profile files of the report (markdown list), with
// any profile that failed.
func (rep *report) profileList() string {
	var b strings.Builder
	for _, name := range rep.Order {
		r := rep.Systems[name]
		if r == nil {
			continue
		}
		for _, m := range []*runMetrics{r.Processing, r.FullRestore, r.Restart} {
			if m == nil || m.Profiles == nil {
				continue
			}
			p := m.Profiles
			if p.CPU != "" {
				fmt.Fprintf(&b, "- %s %s, CPU (%d s from %.2f s after start): %s\n", name, m.Run, p.CPUSeconds, float64(p.CPUFromStartMs)/1000, p.CPU)
			}
			if p.Heap != "" {
				fmt.Fprintf(&b, "- %s %s, heap (at %.2f s after start): %s\n", name, m.Run, float64(p.HeapAtMs)/1000, p.Heap)
			}
			for _, e := range p.Errors {
				fmt.Fprintf(&b, "- %s %s: %s\n", name, m.Run, e)
			}
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "### Profiles\n\n" + b.String()
}

// notes lists failures and anomalies under the table.
func (rep *report) notes() string {
	var b strings.Builder
	for _, s := range rep.Order {
		r := rep.Systems[s]
		if r == nil {
			continue
		}
		if r.Status != "ok" {
			fmt.Fprintf(&b, "- **%s FAILED**: %s\n", s, indent(r.Error))
		}
		for _, a := range r.Anomalies {
			fmt.Fprintf(&b, "- %s: %s\n", s, a)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "### Failures and anomalies\n\n" + b.String()
}

func indent(s string) string { return strings.ReplaceAll(s, "\n", "\n    ") }

// resultsStem is the path of a report's files without the extension:
// <outDir>/<date>T<time>-<guarantee>, with -p<products> before the
// guarantee when the run has several data sets.
func resultsStem(outDir string, at time.Time, products int, several bool, guarantee string) string {
	name := at.Format("2006-01-02T150405")
	if several {
		name += "-" + datasetSlug(products)
	}
	return filepath.Join(outDir, name+"-"+guarantee)
}

// write stores the report as <stem>.json.
func (rep *report) write() (string, error) {
	path := rep.stem + ".json"
	return path, kit.WriteJSON(path, rep)
}
