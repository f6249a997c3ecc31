//go:build torture

package torture

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// faultRecord is one fault as the run injected it.
type faultRecord struct {
	Kind        string    `json:"kind"`
	Detail      string    `json:"detail"`
	Start       time.Time `json:"start"`
	HeldMs      int64     `json:"held_ms"`
	RecoveryMs  int64     `json:"recovery_ms"`
	NotInjected bool      `json:"not_injected,omitempty"`
	Anomaly     string    `json:"anomaly,omitempty"`
}

// checkResult is one of the checker's checks.
type checkResult struct {
	Name      string `json:"name"`
	Anomalies int    `json:"anomalies"`
	Detail    string `json:"detail"`
}

// kindRow is the table's row of one fault kind.
type kindRow struct {
	Kind              string `json:"kind"`
	Count             int    `json:"count"`
	NotInjected       int    `json:"not_injected"`
	LongestRecoveryMs int64  `json:"longest_recovery_ms"`
	Anomalies         int    `json:"anomalies"`
}

// report is what a run found; written as JSON beside the logs.
type report struct {
	Guarantee string        `json:"guarantee"`
	Protocol  string        `json:"group_protocol"`
	Seed      uint64        `json:"seed"`
	Events    int64         `json:"events_acknowledged"`
	Kinds     []kindRow     `json:"kinds"`
	Checks    []checkResult `json:"checks"`
	Faults    []faultRecord `json:"faults"`
}

func newReport(guarantee, protocol string, seed uint64) *report {
	return &report{Guarantee: guarantee, Protocol: protocol, Seed: seed}
}

// record adds a fault.
func (r *run) record(f faultRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rep.Faults = append(r.rep.Faults, f)
}

// addCheck adds a check's result.
func (r *run) addCheck(name string, problems []string) {
	c := checkResult{Name: name, Anomalies: len(problems), Detail: "ok"}
	if len(problems) > 0 {
		shown := problems[:min(5, len(problems))]
		c.Detail = strings.Join(shown, "; ")
		if len(problems) > 5 {
			c.Detail += fmt.Sprintf(" (and %d more)", len(problems)-5)
		}
	}
	r.t.Logf("check %-40s %d anomalies: %s", name, c.Anomalies, c.Detail)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rep.Checks = append(r.rep.Checks, c)
}

// report returns the report with its table rows.
func (r *run) report() *report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rows := map[string]*kindRow{}
	for _, f := range r.rep.Faults {
		row := rows[f.Kind]
		if row == nil {
			row = &kindRow{Kind: f.Kind}
			rows[f.Kind] = row
		}
		row.Count++
		if f.NotInjected {
			row.NotInjected++
		}
		row.LongestRecoveryMs = max(row.LongestRecoveryMs, f.RecoveryMs)
		if f.Anomaly != "" {
			row.Anomalies++
		}
	}
	r.rep.Kinds = nil
	for _, k := range sortedKeys(rows) {
		r.rep.Kinds = append(r.rep.Kinds, *rows[k])
	}
	return r.rep
}

// anomalies counts every anomaly: of the faults and of the checks.
func (rep *report) anomalies() int {
	n := 0
	for _, k := range rep.Kinds {
		n += k.Anomalies
	}
	for _, c := range rep.Checks {
		n += c.Anomalies
	}
	return n
}

// table is the report as a text table.
func (rep *report) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n== torture %s, group.protocol %s, seed %d: %d faults, %d events, %d anomalies\n", rep.Guarantee, rep.Protocol, rep.Seed, len(rep.Faults), rep.Events, rep.anomalies())
	fmt.Fprintf(&b, "%-38s %6s %12s %18s %10s\n", "fault", "count", "not injected", "longest recovery", "anomalies")
	for _, k := range rep.Kinds {
		fmt.Fprintf(&b, "%-38s %6d %12d %16.1f s %10d\n", k.Kind, k.Count, k.NotInjected, float64(k.LongestRecoveryMs)/1000, k.Anomalies)
	}
	fmt.Fprintf(&b, "%-38s %10s  %s\n", "check", "anomalies", "detail")
	for _, c := range rep.Checks {
		fmt.Fprintf(&b, "%-38s %10d  %s\n", c.Name, c.Anomalies, c.Detail)
	}
	return b.String()
}

// check compares what the service serves and wrote with the truth computed
// from the input topic.
func (r *run) check(violations []string) {
	t := r.t
	boot := r.cluster.Bootstrap()

	// The truth: every event of the input, each id once.
	in, err := harness.ReadTopic(boot, r.input, 3*time.Minute)
	if err != nil {
		t.Fatalf("reading the input back: %v", err)
	}
	truth := map[string]int64{}
	ids := map[string]int{}
	var bad []string
	for _, rec := range in.Records {
		ev, err := sales.Decode(rec.Key, rec.Value)
		if err != nil {
			bad = append(bad, fmt.Sprintf("input %d@%d: %v", rec.Partition, rec.Offset, err))
			continue
		}
		truth[ev.Key] += ev.Value
		for _, h := range rec.Headers {
			if h.Key == "id" {
				ids[string(h.Value)]++
			}
		}
	}
	var dups []string
	for _, id := range sortedKeys(ids) {
		if ids[id] > 1 {
			dups = append(dups, fmt.Sprintf("event id %s in the input %d times", id, ids[id]))
		}
	}
	t.Logf("truth: %d events, %d products, from the input topic", len(in.Records), len(truth))
	r.addCheck("input: each event once (idempotent producer)", append(bad, dups...))

	// Every instance answers every product's total (from its own store, a
	// standby's or the owner's).
	// One bound for all of them: each round asks every instance that has not
	// yet answered every product right, and says who still differs.
	pending := r.alive()
	lastErr := map[string]error{}
	started := time.Now()
	nextNote := started.Add(30 * time.Second)
	harness.Poll(2*time.Minute, func() error {
		var still []*harness.Member
		for _, m := range pending {
			if err := m.CheckTotals(truth); err != nil {
				lastErr[m.Name] = err
				still = append(still, m)
			}
		}
		pending = still
		if len(pending) > 0 && time.Now().After(nextNote) {
			nextNote = time.Now().Add(30 * time.Second)
			t.Logf("HTTP totals after %s: %d instance(s) still differ, e.g. %s: %v",
				time.Since(started).Round(time.Second), len(pending), pending[0].Name, lastErr[pending[0].Name])
		}
		if len(pending) > 0 {
			return fmt.Errorf("%d instance(s) differ", len(pending))
		}
		return nil
	})
	var http []string
	for _, m := range pending {
		http = append(http, fmt.Sprintf("%s: %v", m.Name, lastErr[m.Name]))
	}
	r.addCheck("HTTP totals = truth, from every instance", http)

	// The changelog: the last committed value of each product is the truth,
	// and read committed no product's value ever goes down.
	cl, err := harness.ReadTopic(boot, r.changelog, 3*time.Minute)
	if err != nil {
		t.Fatalf("reading the changelog: %v", err)
	}
	held := map[string]map[int64]bool{}
	last := map[string]int64{}
	lastAt := map[string]string{} // where the last value was, and the input offsets it reflects
	var downs, malformed []string
	for _, rec := range cl.Records {
		p := string(rec.Key)
		if len(rec.Value) != 8 {
			malformed = append(malformed, fmt.Sprintf("%s at %d@%d: %d bytes", p, rec.Partition, rec.Offset, len(rec.Value)))
			continue
		}
		v := int64(binary.BigEndian.Uint64(rec.Value))
		at := fmt.Sprintf("%d@%d (input %s)", rec.Partition, rec.Offset, offsetsHeader(rec.Headers))
		if prev, ok := last[p]; ok && v < prev {
			downs = append(downs, fmt.Sprintf("%s went from %d at %s down to %d at %s", p, prev, lastAt[p], v, at))
		}
		last[p], lastAt[p] = v, at
		if held[p] == nil {
			held[p] = map[int64]bool{}
		}
		held[p][v] = true
	}
	var lastDiff []string
	if err := harness.DiffTotals("changelog", last, truth); err != nil {
		lastDiff = append(lastDiff, err.Error())
	}
	r.addCheck("changelog: last committed value = truth", append(malformed, lastDiff...))
	if len(lastDiff) > 0 {
		// Where it went wrong, for the next engineer: the first record of
		// each product whose value differs from the input it says it
		// reflects.
		var inputID [16]byte
		if ids, err := harness.TopicIDs(boot, r.input); err == nil {
			inputID = ids[r.input]
		}
		for _, l := range localizeMismatches(in.Records, cl.Records, inputID) {
			t.Logf("changelog mismatch: %s", l)
		}
	}
	// Both guarantees: under at-least-once, a dropped task's records in
	// flight are cut off (internal/stream/cutoff.go) so that none lands
	// after its next owner's.
	r.addCheck("changelog: no value goes down (read committed)", downs)

	// Notifications: every product at or over the threshold has one with a
	// total the changelog held; exactly-once, none carries a value the
	// changelog never committed.
	nc, err := harness.ReadTopic(boot, r.notif, 3*time.Minute)
	if err != nil {
		t.Fatalf("reading the notifications: %v", err)
	}
	notified := map[string]bool{}
	var foreign []string
	for _, rec := range nc.Records {
		var n sales.Notification
		if err := json.Unmarshal(rec.Value, &n); err != nil {
			foreign = append(foreign, fmt.Sprintf("notification %d@%d %q: %v", rec.Partition, rec.Offset, rec.Value, err))
			continue
		}
		if held[n.SKU][n.Value] {
			notified[n.SKU] = true
		} else if r.guarantee == "exactly_once_v2" {
			foreign = append(foreign, fmt.Sprintf("%s notified %d, a total its changelog never committed", n.SKU, n.Value))
		}
	}
	var missing []string
	for _, p := range sortedKeys(truth) {
		if truth[p] >= threshold && !notified[p] {
			missing = append(missing, fmt.Sprintf("%s (total %d) has no notification with a total its changelog held", p, truth[p]))
		}
	}
	r.addCheck("notifications: one per product over the threshold", missing)
	if r.guarantee == "exactly_once_v2" {
		r.addCheck("notifications: only committed totals", foreign)
	}

	sort.Strings(violations)
	r.addCheck("no task active on two instances at once", violations)
	r.addCheck("no instance exited on its own", r.allExits())
}

// offsetsHeader is the input offsets a changelog record says its total
// reflects, as written.
func offsetsHeader(hs []kgo.RecordHeader) string {
	for _, h := range hs {
		if h.Key == sales.OffsetsHeader {
			if o, err := sales.DecodeOffsets(h.Value); err == nil {
				return fmt.Sprintf("%v", o.Parts)
			}
			return fmt.Sprintf("%q", h.Value)
		}
	}
	return "?"
}
