package main

import (
	"fmt"
	"strings"

	"github.com/salesagg/salesagg/bench/kit"
)

// ratioRow is one figure of one scenario setting, measured on both systems.
type ratioRow struct {
	Run       string  `json:"run"` // the salesagg run's name; the reference's is <run>-ref
	Settings  string  `json:"settings"`
	Figure    string  `json:"figure"`
	Unit      string  `json:"unit"` // ms or records
	Salesagg  int64   `json:"salesagg"`
	Reference int64   `json:"reference"`
	Ratio     float64 `json:"salesagg_over_reference"` // 0 when the reference's figure is 0
}

func (r *runResult) sysName() string {
	if r.System == "" {
		return sysSalesagg
	}
	return r.System
}

// baseName is the run's name without the reference's -ref suffix: the key
// that pairs the two systems' runs of one scenario setting.
func (r *runResult) baseName() string {
	if r.sysName() == sysReference {
		return strings.TrimSuffix(r.Name, "-ref")
	}
	return r.Name
}

type figure struct {
	name, unit string
	value      int64
	ok         bool
}

// headline lists the figures of a run that the side-by-side compares; ok is
// false for a figure the run did not reach.
func headline(r *runResult) []figure {
	if r.Status != "ok" {
		return nil
	}
	var fs []figure
	add := func(name, unit string, v int64, ok bool) { fs = append(fs, figure{name, unit, v, ok && v >= 0}) }
	switch {
	case r.Kill != nil:
		k := r.Kill
		add("kill → first 200, slowest task", "ms", k.MaxFirstAnswerMs, true)
		add("kill → 200 from an active owner, slowest task", "ms", k.MaxActiveAnswerMs, true)
		add("kill → survivors ready", "ms", k.KillToSurvivorsReadyMs, k.KillToSurvivorsReadyMs > 0)
		add("records restored by the survivors", "records", k.Restored.Records, true)
		if rr := k.Restart; rr != nil {
			add("restart → serving", "ms", rr.StartToServingMs, true)
			add("restart → settled", "ms", rr.StartToSettledMs, true)
			add("records restored from the restart until settled", "records", rr.RestoredUntilSettled.Records, rr.StartToSettledMs >= 0)
		}
	case r.Rolling != nil:
		rr := r.Rolling
		add("longest a task was unanswerable at every instance", "ms", max(rr.MaxGapMs, 0), rr.Tasks != nil)
		add("unanswerable time summed over tasks", "ms", rr.TotalGapMs, rr.Tasks != nil)
		add("records restored", "records", rr.Restored.Records, rr.Tasks != nil)
		add("first SIGTERM → settled", "ms", rr.RollToSettledMs, rr.Tasks != nil)
	case r.Scale != nil:
		sr := r.Scale
		add("new → serving", "ms", sr.StartToServingMs, true)
		add("new → settled", "ms", sr.StartToSettledMs, true)
		add("records restored until settled", "records", sr.RestoredUntilSettled.Records, sr.StartToSettledMs >= 0)
		add("longest a task was unanswerable", "ms", max(sr.MaxGapMs, 0), sr.StartToSettledMs >= 0)
	}
	return fs
}

// pairRatios pairs every salesagg run with the reference's run of the same
// scenario setting and divides their headline figures.
func pairRatios(runs []*runResult) []ratioRow {
	ref := map[string]*runResult{}
	for _, r := range runs {
		if r.sysName() == sysReference {
			ref[r.baseName()] = r
		}
	}
	var out []ratioRow
	for _, s := range runs {
		if s.sysName() != sysSalesagg {
			continue
		}
		rf, ok := ref[s.baseName()]
		if !ok {
			continue
		}
		fs, fr := headline(s), headline(rf)
		for i := range fs {
			if i >= len(fr) || fs[i].name != fr[i].name || !fs[i].ok || !fr[i].ok {
				continue
			}
			row := ratioRow{Run: s.Name, Settings: s.Settings.Label, Figure: fs[i].name, Unit: fs[i].unit,
				Salesagg: fs[i].value, Reference: fr[i].value}
			if fr[i].value > 0 {
				row.Ratio = float64(fs[i].value) / float64(fr[i].value)
			}
			out = append(out, row)
		}
	}
	return out
}

func ratioCell(r ratioRow) string {
	switch {
	case r.Reference > 0:
		return fmt.Sprintf("%.3g", r.Ratio)
	case r.Salesagg == 0:
		return "– (both 0)"
	default:
		return "– (reference 0)"
	}
}

func valueCell(v int64, unit string) string {
	if unit == "ms" {
		return msCell(v)
	}
	return kit.Group(v)
}

// ratios is the side-by-side table: for every scenario setting run on both
// systems, its headline figures and salesagg ÷ reference.
func (rep *report) ratios() string {
	rep.Ratios = pairRatios(rep.Runs)
	if len(rep.Ratios) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("### salesagg vs the Kafka Streams reference, same scenario and settings\n\n")
	b.WriteString("| run | settings | figure | salesagg | reference | salesagg / reference |\n")
	b.WriteString("| --- | --- | --- | ---: | ---: | ---: |\n")
	for _, r := range rep.Ratios {
		unit := " (s)"
		if r.Unit != "ms" {
			unit = ""
		}
		fmt.Fprintf(&b, "| %s | %s | %s%s | %s | %s | %s |\n", r.Run, r.Settings, r.Figure, unit,
			valueCell(r.Salesagg, r.Unit), valueCell(r.Reference, r.Unit), ratioCell(r))
	}
	b.WriteString("\nBelow 1: salesagg is faster (times) or restores fewer records. The reference's runs are the same scenario and\n" +
		"settings with the Kafka Streams reference (bench/kstreams-reference) in place of salesagg: same products, probes, load and\n" +
		"polling, answered through its interactive-queries endpoint; records restored from its restore listener.\n\n")
	return b.String()
}
