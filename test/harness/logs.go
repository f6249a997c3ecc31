package harness

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// LogEntry is one JSON log line of salesagg.
type LogEntry map[string]any

// Msg is the line's message.
func (e LogEntry) Msg() string { s, _ := e["msg"].(string); return s }

// Int returns the integer field key.
func (e LogEntry) Int(key string) (int64, bool) {
	switch v := e[key].(type) {
	case float64:
		return int64(v), true
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	}
	return 0, false
}

// JSONLines decodes the JSON lines among lines (others are skipped).
func JSONLines(lines []string) []LogEntry {
	var out []LogEntry
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var e LogEntry
		if json.Unmarshal([]byte(l), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// Logs returns the JSON lines the process wrote to standard error so far.
func (p *Proc) Logs() []LogEntry { return JSONLines(p.StderrLines()) }

// LogsWith returns the JSON lines so far whose message contains snippet.
func (p *Proc) LogsWith(snippet string) []LogEntry {
	var out []LogEntry
	for _, e := range p.Logs() {
		if strings.Contains(e.Msg(), snippet) {
			out = append(out, e)
		}
	}
	return out
}

var finishedRestoring = regexp.MustCompile(`^Finished restoring changelog (\S+)-(\d+) to store (\S+) with a total number of (\d+) records`)

// RestoreLine is one "Finished restoring changelog <topic>-<p> to store S
// with a total number of N records" line.
type RestoreLine struct {
	Msg       string
	Store     string
	Partition int
	// Records is the line's field "records"; Agrees whether it is there
	// and equals the N of the message.
	Records int64
	Agrees  bool
}

// RestoreLines returns the "Finished restoring changelog" lines among es.
func RestoreLines(es []LogEntry) []RestoreLine {
	var out []RestoreLine
	for _, e := range es {
		g := finishedRestoring.FindStringSubmatch(e.Msg())
		if g == nil {
			continue
		}
		p, _ := strconv.Atoi(g[2])
		inMsg, _ := strconv.ParseInt(g[4], 10, 64)
		n, ok := e.Int("records")
		out = append(out, RestoreLine{Msg: e.Msg(), Store: g[3], Partition: p, Records: n, Agrees: ok && n == inMsg})
	}
	return out
}

// RestoreSummary is what a start logged about restoring its tasks.
type RestoreSummary struct {
	Partitions map[int]int64 // changelog partition → records restored
	Lines      int           // "Finished restoring changelog" lines
	// ByStore are the records restored per store (the totals' and, with
	// windows, one per window size).
	ByStore  map[string]int64
	Total    int64
	TookLine string // the "Restoration took ..." line, "" if none yet
}

// Restored reads the "Finished restoring changelog" and "Restoration took"
// lines logged so far. The record count comes from the JSON field
// "records": a line where it disagrees with the number in the message fails
// the test.
func (p *Proc) Restored(t testing.TB) RestoreSummary {
	t.Helper()
	es := p.Logs()
	sum := RestoreSummary{Partitions: map[int]int64{}, ByStore: map[string]int64{}}
	for _, e := range es {
		if m := e.Msg(); strings.HasPrefix(m, "Restoration took ") {
			sum.TookLine = m
		}
	}
	for _, l := range RestoreLines(es) {
		if !l.Agrees {
			t.Errorf("%s: restore line %q has field records=%d, which disagrees with its message", p.Name, l.Msg, l.Records)
		}
		sum.Partitions[l.Partition] += l.Records
		sum.ByStore[l.Store] += l.Records
		sum.Total += l.Records
		sum.Lines++
	}
	return sum
}
