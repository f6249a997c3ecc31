package stream_test

import (
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/salesagg/salesagg/internal/sales"
	th "github.com/salesagg/salesagg/test/harness"
)

// scrape reads in's /metrics as metric families.
func (in *instance) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(in.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return mfs
}

// labelsOf returns a series' labels as a map.
func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// seriesValue returns the value of family name's series with exactly the
// labels want, and whether there is one.
func seriesValue(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		got := labelsOf(m)
		if len(got) != len(want) {
			continue
		}
		same := true
		for k, v := range want {
			if got[k] != v {
				same = false
			}
		}
		if same {
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// labelNames lists the label names of every series of a family, once each.
func labelNames(mf *dto.MetricFamily) []string {
	seen := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			seen[l.GetName()] = true
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func TestMetricSeriesExistBeforeTheFirstBadEvent(t *testing.T) {
	// Scenario: a fresh instance folds one good event; its /metrics already has
	// salesagg_events_skipped_total at 0 for every reason of every task (so rate() and
	// alerts work before the first bad event), salesagg_records_produced_total is labelled by
	// the role of the topic (role="changelog"), not by a "topic" label holding a role, and
	// salesagg_input_lag_records has only the task label (the partition is the task's).
	h := newHarness(t)
	h.createInput(3)
	in := h.start(h.cfg)
	in.waitReady()
	h.produce(event("good", "good", 5))
	in.waitTotals(map[string]int64{"good": 5})

	reasons := []string{sales.ReasonEmpty, sales.ReasonNotJSON, sales.ReasonNotObject, sales.ReasonNoValue, sales.ReasonBadValue,
		sales.ReasonRange, sales.ReasonNoKey, sales.ReasonBadProduct, sales.ReasonInvalidUTF8, sales.ReasonOverflow, sales.ReasonTooLarge,
		"bad_forward"}
	var mfs map[string]*dto.MetricFamily
	th.WaitFor(t, 30*time.Second, "the changelog record to be counted", th.Holds(func() bool {
		mfs = in.scrape(t)
		for _, m := range mfs["salesagg_records_produced_total"].GetMetric() {
			if m.GetCounter().GetValue() >= 1 {
				return true
			}
		}
		return false
	}))
	var missing []string
	for _, task := range []string{"0_0", "0_1", "0_2"} {
		for _, r := range reasons {
			if v, ok := seriesValue(mfs, "salesagg_events_skipped_total", map[string]string{"task": task, "reason": r}); !ok || v != 0 {
				missing = append(missing, fmt.Sprintf("{task=%q,reason=%q}", task, r))
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("salesagg_events_skipped_total lacks a 0 series for %s", strings.Join(missing, " "))
	}
	if got := labelNames(mfs["salesagg_records_produced_total"]); strings.Join(got, ",") != "role" {
		t.Errorf("salesagg_records_produced_total is labelled %v, want [role]", got)
	}
	// The one event's changelog record is counted as a changelog record.
	if v, _ := seriesValue(mfs, "salesagg_records_produced_total", map[string]string{"role": "changelog"}); v < 1 {
		t.Errorf("salesagg_records_produced_total{role=\"changelog\"} is %v after a changelog record was acknowledged, want at least 1", v)
	}
	for _, role := range []string{"changelog", "notification", "repartition", "dead_letter"} {
		if _, ok := seriesValue(mfs, "salesagg_records_produced_total", map[string]string{"role": role}); !ok {
			t.Errorf("salesagg_records_produced_total has no series role=%q", role)
		}
	}
	if got := labelNames(mfs["salesagg_input_lag_records"]); strings.Join(got, ",") != "task" {
		t.Errorf("salesagg_input_lag_records is labelled %v, want [task]", got)
	}
	for _, task := range []string{"0_0", "0_1", "0_2"} {
		if v, ok := seriesValue(mfs, "salesagg_input_lag_records", map[string]string{"task": task}); !ok || v != 0 {
			t.Errorf("salesagg_input_lag_records{task=%q} = %v (present %v), want 0", task, v, ok)
		}
	}
}

// byClause is an aggregation's "by (labels)" and the first metric it reads.
var byClause = regexp.MustCompile(`by \(([^)]*)\) \(([^()]*\()*(salesagg_[a-z0-9_]+)`)

func TestDashboardGroupsByLabelsTheSeriesHave(t *testing.T) {
	// Scenario: a running instance's /metrics has, on every family the Grafana dashboard
	// aggregates "by (labels)", each of those labels: a renamed label is renamed in the
	// dashboard too, or its panel would show one unlabelled line.
	h := newHarness(t)
	h.createInput(3)
	in := h.start(h.cfg)
	in.waitReady()
	h.produce(event("good", "good", 5))
	in.waitTotals(map[string]int64{"good": 5})
	mfs := in.scrape(t)
	checked := 0
	for _, expr := range dashboardExprs(t) {
		for _, m := range byClause.FindAllStringSubmatch(expr, -1) {
			name := strings.TrimSuffix(m[3], "_bucket")
			mf, ok := mfs[name]
			if !ok || len(mf.GetMetric()) == 0 {
				continue // not on this instance (standbys, transactions): TestDashboardUsesOnlyScrapedMetrics
			}
			have := map[string]bool{}
			for _, l := range labelNames(mf) {
				have[l] = true
			}
			if strings.HasSuffix(m[3], "_bucket") {
				have["le"] = true
			}
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); !have[l] {
					t.Errorf("the dashboard groups %s by %q; its series have %v: %s", name, l, labelNames(mf), expr)
				}
			}
			checked++
		}
	}
	if checked < 8 {
		t.Fatalf("only %d aggregations checked", checked)
	}
}
