package stream

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/salesagg/salesagg/internal/sales"
)

// Metrics.
//
// The runtime is a prometheus.Collector: what it keeps anyway (per-task
// counters, restore progress, lag, cache and standby figures) is read at
// scrape time, so the hot path pays nothing for it. What only exists as it
// happens (cycle and transaction latencies, records produced, transactions
// by outcome) is observed into the instruments below.

// Kinds of records produced, by the role of their topic: the role label of
// salesagg_records_produced_total.
const (
	producedChangelog = iota
	producedNotification
	producedRepartition
	producedDeadLetter
	producedKinds
)

var producedNames = [producedKinds]string{"changelog", "notification", "repartition", "dead_letter"}

// instruments are the runtime's observed metrics.
type instruments struct {
	commitSeconds prometheus.Histogram
	txnEndSeconds prometheus.Histogram
	produced      [producedKinds]atomic.Int64
	txnCommitted  atomic.Int64
	txnAborted    atomic.Int64
	// restoreFailures counts failed restore attempts, produceFailures the
	// cycles that committed nothing because a record failed to produce.
	restoreFailures atomic.Int64
	produceFailures atomic.Int64
	// records counts the records tasks took from the input and
	// repartition topics, taskCommits the commit cycles that wrote a
	// task's store: the periodic summary's figures (summary.go).
	records     atomic.Int64
	taskCommits atomic.Int64
}

func newInstruments(guarantee string) *instruments {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	return &instruments{
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "salesagg_commit_duration_seconds",
			Help:        "Duration of a commit cycle: changelog produced and acknowledged, store written, offsets committed (per task at-least-once, per transaction exactly-once).",
			ConstLabels: prometheus.Labels{"guarantee": guarantee},
			Buckets:     buckets,
		}),
		txnEndSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "salesagg_transaction_end_duration_seconds",
			Help:    "Duration of ending a transaction (commit or abort, with the offsets), exactly-once only.",
			Buckets: buckets,
		}),
	}
}

// reasonBadForward is the reason of a repartition record without the
// headers naming its source.
const reasonBadForward = "bad_forward"

// knownBadReasons are the reasons salesagg_events_skipped_total shows from
// the start, at 0 until an event is skipped for them.
var knownBadReasons = append(sales.Reasons(), reasonBadForward)

// badReasons counts a task's bad events by reason.
type badReasons struct {
	mu sync.Mutex       // guards n
	n  map[string]int64 // guarded by mu: the counts by reason (nil: none yet)
}

func (b *badReasons) add(reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == nil {
		b.n = map[string]int64{}
	}
	b.n[reason]++
}

// snapshot returns the counts by reason, every known reason included.
func (b *badReasons) snapshot() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int64, len(knownBadReasons)+len(b.n))
	for _, r := range knownBadReasons {
		out[r] = 0
	}
	for k, v := range b.n {
		out[k] = v
	}
	return out
}

type desc struct {
	*prometheus.Desc
	typ prometheus.ValueType
}

func newDesc(name, help string, typ prometheus.ValueType, labels ...string) desc {
	return desc{prometheus.NewDesc(name, help, labels, nil), typ}
}

var (
	descReady      = newDesc("salesagg_ready", "1 when every task assigned here is restored and running (GET /readyz 200).", prometheus.GaugeValue)
	descProcessed  = newDesc("salesagg_events_processed_total", "Events folded into the task's totals.", prometheus.CounterValue, "task")
	descDuplicates = newDesc("salesagg_events_duplicates_skipped_total", "Redelivered events recognised and skipped.", prometheus.CounterValue, "task")
	descForwarded  = newDesc("salesagg_events_forwarded_total", "Events forwarded to the task owning their product, through the repartition topic.", prometheus.CounterValue, "task")
	descSkipped    = newDesc("salesagg_events_skipped_total", "Bad events skipped (dead-lettered when dlq.topic is set), by reason.", prometheus.CounterValue, "task", "reason")
	descWarned     = newDesc("salesagg_events_folded_with_warning_total", "Events folded although something about them is off, by reason (key_product_mismatch: folded under the record key, which differs from the product field).", prometheus.CounterValue, "task", "reason")
	descWindowSkip = newDesc("salesagg_window_events_skipped_total", "Events left out of their window of a size (they count in the product's total), by reason (late: the window had closed; bad_time: the time field could not be read).", prometheus.CounterValue, "task", "window", "reason")
	descTaskState  = newDesc("salesagg_task_state", "1 for the state each task and standby copy is in.", prometheus.GaugeValue, "task", "role", "state")
	descLag        = newDesc("salesagg_input_lag_records", "Input records of the task's partition not processed yet: high watermark minus position.", prometheus.GaugeValue, "task")
	descCheckpoint = newDesc("salesagg_checkpoint_offset", "Next changelog offset the task's store reflects.", prometheus.GaugeValue, "task", "role")
	descRestored   = newDesc("salesagg_restore_records", "Changelog records restored by the task's latest restore.", prometheus.GaugeValue, "task")
	descRemaining  = newDesc("salesagg_restore_remaining_records", "Changelog offsets the task still has to restore (0 once running).", prometheus.GaugeValue, "task")
	descRestoreSec = newDesc("salesagg_restore_duration_seconds", "Duration of the task's latest restore, start to ready.", prometheus.GaugeValue, "task")
	descStoreBytes = newDesc("salesagg_store_size_bytes", "Bytes the task's store takes on disk.", prometheus.GaugeValue, "task", "role")
	descCacheHits  = newDesc("salesagg_cache_hits_total", "Entry cache lookups answered without reading the store.", prometheus.CounterValue, "task")
	descCacheMiss  = newDesc("salesagg_cache_misses_total", "Entry cache lookups that read the store.", prometheus.CounterValue, "task")
	descCacheEvict = newDesc("salesagg_cache_evictions_total", "Entries evicted from the cache to stay within cache.max.bytes.", prometheus.CounterValue, "task")
	descCacheBytes = newDesc("salesagg_cache_bytes", "Estimated bytes the task's entry cache holds.", prometheus.GaugeValue, "task")
	descStandbyLag = newDesc("salesagg_standby_lag_records", "Changelog records a standby copy is behind the last stable offset it saw.", prometheus.GaugeValue, "task", "kind")
	descProduced   = newDesc("salesagg_records_produced_total", "Records acknowledged by Kafka, by the role of the topic they went to (changelog, notification, repartition, dead_letter).", prometheus.CounterValue, "role")
	descTxns       = newDesc("salesagg_transactions_total", "Transactions ended, by result (exactly-once only).", prometheus.CounterValue, "result")
	descBadTotal   = newDesc("salesagg_bad_events_total", "Bad events skipped since start, all tasks.", prometheus.CounterValue)
	descHealthy    = newDesc("salesagg_healthy", "1 unless a task kept failing longer than task.timeout.ms (GET /healthz 503).", prometheus.GaugeValue)
	descFailures   = newDesc("salesagg_task_failures_total", "Failed attempts retried with backoff: restores that errored, commit cycles whose records could not be produced.", prometheus.CounterValue, "kind")
)

var allDescs = []desc{descReady, descProcessed, descDuplicates, descForwarded, descSkipped, descWarned, descWindowSkip, descTaskState, descLag, descCheckpoint,
	descRestored, descRemaining, descRestoreSec, descStoreBytes, descCacheHits, descCacheMiss, descCacheEvict, descCacheBytes,
	descStandbyLag, descProduced, descTxns, descBadTotal, descHealthy, descFailures}

var _ prometheus.Collector = (*Runtime)(nil)

// Describe implements prometheus.Collector.
func (rt *Runtime) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d.Desc
	}
	rt.env.metrics.commitSeconds.Describe(ch)
	rt.env.metrics.txnEndSeconds.Describe(ch)
}

// Collect implements prometheus.Collector.
func (rt *Runtime) Collect(ch chan<- prometheus.Metric) {
	emit := func(d desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.Desc, d.typ, v, labels...)
	}
	m := rt.env.metrics
	ready, _ := rt.Ready()
	emit(descReady, b2f(ready))
	emit(descBadTotal, float64(rt.env.badEvents.Load()))
	healthy, _ := rt.Healthy()
	emit(descHealthy, b2f(healthy))
	emit(descFailures, float64(m.restoreFailures.Load()), "restore")
	emit(descFailures, float64(m.produceFailures.Load()), "produce")
	for _, t := range rt.reg.tasks() {
		collectTask(emit, t)
	}
	for _, sb := range rt.reg.standbys() {
		emit(descTaskState, 1, sb.name, sb.role(), sb.State().String())
		emit(descCheckpoint, float64(sb.pos.position.Load()), sb.name, sb.role())
		if lag := sb.lag(); lag >= 0 {
			emit(descStandbyLag, float64(lag), sb.name, sb.role())
		}
		if s := sb.store.Load(); s != nil {
			emit(descStoreBytes, float64(s.DiskUsage()), sb.name, sb.role())
		}
	}
	for k := range producedKinds {
		emit(descProduced, float64(m.produced[k].Load()), producedNames[k])
	}
	if rt.env.eos {
		emit(descTxns, float64(m.txnCommitted.Load()), "committed")
		emit(descTxns, float64(m.txnAborted.Load()), "aborted")
	}
	m.commitSeconds.Collect(ch)
	m.txnEndSeconds.Collect(ch)
}

// collectTask emits an active task's metrics.
func collectTask(emit func(d desc, v float64, labels ...string), t *task) {
	st := t.State()
	emit(descProcessed, float64(t.stats.processed.Load()), t.name)
	emit(descDuplicates, float64(t.stats.duplicates.Load()), t.name)
	emit(descForwarded, float64(t.stats.forwarded.Load()), t.name)
	reasons := t.stats.badReasons.snapshot()
	names := make([]string, 0, len(reasons))
	for r := range reasons {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		emit(descSkipped, float64(reasons[r]), t.name, r)
	}
	emit(descWarned, float64(t.stats.keyMismatches.Load()), t.name, sales.WarnKeyProductMismatch)
	for _, w := range t.windows {
		size := sales.FormatWindowSize(w.size)
		emit(descWindowSkip, float64(w.late.Load()), t.name, size, reasonLate)
		emit(descWindowSkip, float64(w.badTime.Load()), t.name, size, sales.ReasonBadTime)
	}
	emit(descTaskState, 1, t.name, "active", st.String())
	emit(descLag, float64(t.inputLag()), t.name)
	emit(descCheckpoint, float64(t.stats.checkpoint.Load()), t.name, "active")
	emit(descRestored, float64(t.stats.restored.Load()), t.name)
	remaining := int64(0)
	if st == taskRestoring {
		remaining = max(0, t.stats.restoreTo.Load()-max(t.stats.checkpoint.Load(), t.stats.restoreFrom.Load()))
	}
	emit(descRemaining, float64(remaining), t.name)
	emit(descRestoreSec, (time.Duration(t.stats.restoreMillis.Load()) * time.Millisecond).Seconds(), t.name)
	if s := t.totals.store.Load(); s != nil {
		emit(descStoreBytes, float64(s.DiskUsage()), t.name, "active")
	}
	emit(descCacheHits, float64(t.totals.cache.stats.hits.Load()), t.name)
	emit(descCacheMiss, float64(t.totals.cache.stats.misses.Load()), t.name)
	emit(descCacheEvict, float64(t.totals.cache.stats.evictions.Load()), t.name)
	emit(descCacheBytes, float64(t.totals.cache.stats.bytes.Load()), t.name)
}

// inputLag is the task's input high watermark minus its position, as of the
// last batch it processed (0 before the first).
func (t *task) inputLag() int64 {
	if pos, hwm := t.stats.inputPos.Load(), t.stats.inputHWM.Load(); pos >= 0 && hwm > pos {
		return hwm - pos
	}
	return 0
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
