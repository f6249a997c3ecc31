package stream_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	th "github.com/salesagg/salesagg/test/harness"
)

// dashboardExprs returns every PromQL expression of the Grafana dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "salesagg.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/salesagg.json: %v", err)
	}
	var out []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

var metricName = regexp.MustCompile(`\b(?:salesagg|go|process)_[a-z0-9_]+\b`)

func TestDashboardUsesOnlyScrapedMetrics(t *testing.T) {
	// Scenario: two instances with a standby each, exactly-once, fold events and skip a bad
	// one; every metric name in the Grafana dashboard's expressions is a family (or a histogram's
	// _bucket/_sum/_count series) in a real scrape of /metrics, so the dashboard shows data and
	// no panel names a metric that does not exist.
	h := newHarness(t)
	_, _, a, b := h.startPairWithStandbys()
	want := spread(h, "m", 5, 2)
	bad := event("bad", "bad", 1)
	bad.Value = []byte("not json")
	h.produce(bad)
	th.WaitFor(t, 30*time.Second, "both instances to run tasks and keep standby copies", th.Holds(func() bool {
		return len(a.runningTasks()) > 0 && len(b.runningTasks()) > 0 && len(a.caughtUpCopies()) > 0
	}))
	a.waitTotals(want)

	var families map[string]bool
	th.WaitFor(t, 30*time.Second, "a scrape with the bad event counted", th.Holds(func() bool {
		resp, err := http.Get(a.http.URL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var p expfmt.TextParser
		mfs, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("parsing /metrics: %v", err)
		}
		families = map[string]bool{}
		for name := range mfs {
			families[name] = true
		}
		resp2, err := http.Get(b.http.URL + "/metrics")
		if err == nil {
			defer resp2.Body.Close()
			if mfs2, err := p.TextToMetricFamilies(resp2.Body); err == nil {
				for name := range mfs2 {
					families[name] = true
				}
			}
		}
		return families["salesagg_events_skipped_total"]
	}))
	var missing []string
	seen := map[string]bool{}
	for _, expr := range dashboardExprs(t) {
		for _, name := range metricName.FindAllString(expr, -1) {
			if seen[name] {
				continue
			}
			seen[name] = true
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if strings.HasSuffix(name, suffix) && families[strings.TrimSuffix(name, suffix)] {
					base = strings.TrimSuffix(name, suffix)
				}
			}
			if !families[base] {
				missing = append(missing, name)
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("the dashboard names only %d metrics: %v", len(seen), seen)
	}
	if len(missing) > 0 {
		var have []string
		for f := range families {
			have = append(have, f)
		}
		sort.Strings(have)
		t.Fatalf("the dashboard uses metrics no scrape has: %v\nscraped: %v", missing, have)
	}
}
