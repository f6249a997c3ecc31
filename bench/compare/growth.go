package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
)

// growthPoint is one system under one guarantee on one data set, as a row of
// the growth table.
type growthPoint struct {
	Products int    `json:"products"`
	Events   int    `json:"events"`
	Status   string `json:"status"`
	// Zero where not measured (a failed run, or the ceiling's restores).
	EventsPerSec              float64 `json:"events_per_s"`
	ProcessingPeakRSSBytes    int64   `json:"processing_peak_rss_bytes"`
	FullRestoreStartToReadyMs int64   `json:"full_restore_start_to_ready_ms"`
	RestoredRecords           int64   `json:"full_restore_records"`
	RestoreRecordsPerSecWall  float64 `json:"restore_records_per_s_wall"`
	FullRestorePeakRSSBytes   int64   `json:"full_restore_peak_rss_bytes"`
	RestartStartToReadyMs     int64   `json:"restart_start_to_ready_ms"`
	RestartPeakRSSBytes       int64   `json:"restart_peak_rss_bytes"`
	CPUPerEventUs             float64 `json:"cpu_us_per_event"`
	Results                   string  `json:"results_file"`
	// The processing run was cut at --reference-time-limit: events/s so far.
	Cut bool `json:"cut,omitempty"`
}

// growthSeries is one system under one guarantee over every data set.
type growthSeries struct {
	System    string        `json:"system"`
	Guarantee string        `json:"guarantee"`
	Points    []growthPoint `json:"points"`
}

// growthReport is <ts>-growth.json: how the figures change with the number
// of products.
type growthReport struct {
	StartedAt       time.Time      `json:"started_at"`
	FinishedAt      time.Time      `json:"finished_at"`
	EventsRequested int            `json:"events_requested"`
	Products        []int          `json:"products"`
	Partitions      int            `json:"partitions"`
	Seed            uint64         `json:"seed"`
	Guarantees      []string       `json:"guarantees"`
	Profile         bool           `json:"profile"`
	Machine         kit.Machine    `json:"machine"`
	Versions        kit.Versions   `json:"versions"`
	Series          []growthSeries `json:"series"`
	Table           string         `json:"table_markdown"`
}

// newGrowth arranges the reports (one per data set and guarantee, with the
// path each was written to) by system and guarantee, rows in the order of
// --products.
func newGrowth(o options, startedAt time.Time, reps []*report, paths map[*report]string) *growthReport {
	g := &growthReport{StartedAt: startedAt, FinishedAt: time.Now(), EventsRequested: o.events, Products: o.products,
		Partitions: o.partitions, Seed: o.seed, Guarantees: o.guarantees, Profile: o.profile}
	if len(reps) > 0 {
		g.Machine, g.Versions = reps[0].Machine, reps[0].Versions
	}
	for _, sys := range o.allSystems() {
		for _, gu := range o.guarantees {
			s := growthSeries{System: sys.name(), Guarantee: gu}
			for _, rep := range reps {
				r := rep.Systems[sys.name()]
				if rep.Guarantee != gu || r == nil {
					continue
				}
				s.Points = append(s.Points, pointOf(rep, r, paths[rep]))
			}
			if len(s.Points) > 0 {
				g.Series = append(g.Series, s)
			}
		}
	}
	g.Table = g.table()
	return g
}

func pointOf(rep *report, r *systemResult, path string) growthPoint {
	p := growthPoint{Products: rep.Products, Events: rep.Events, Status: r.Status, EventsPerSec: r.EventsPerSec,
		RestoreRecordsPerSecWall: r.RestoreRecordsPerSecWall, CPUPerEventUs: r.CPUPerEventUs, Results: path, RestoredRecords: -1,
		Cut: r.Cut != nil}
	if m := r.Processing; m != nil {
		p.ProcessingPeakRSSBytes = m.PeakRSSBytes
	}
	if m := r.FullRestore; m != nil {
		p.FullRestoreStartToReadyMs, p.FullRestorePeakRSSBytes, p.RestoredRecords = m.StartToReadyMs, m.PeakRSSBytes, m.RestoredRecords
	}
	if m := r.Restart; m != nil {
		p.RestartStartToReadyMs, p.RestartPeakRSSBytes = m.StartToReadyMs, m.PeakRSSBytes
	}
	return p
}

// table is one markdown table per system and guarantee.
func (g *growthReport) table() string {
	orDash := func(ok bool, s string) string {
		if !ok {
			return "–"
		}
		return s
	}
	var b strings.Builder
	for i, s := range g.Series {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "### Growth: %s, %s\n\n", s.System, s.Guarantee)
		b.WriteString("| products | events | processing events/s ↑ | processing peak RSS (MiB) ↓ | full restore start → ready (s) ↓ | restored records/s (start → ready) ↑ | full restore peak RSS (MiB) ↓ | restart start → ready (s) ↓ | restart peak RSS (MiB) ↓ | CPU µs/event ↓ |\n")
		b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, p := range s.Points {
			_, cpu, _ := micros(p.CPUPerEventUs)
			products := kit.Group(int64(p.Products))
			if p.Status != "ok" {
				products += " (" + p.Status + ")"
			}
			if p.Cut {
				products += " (cut)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				products, kit.Group(int64(p.Events)),
				orDash(p.EventsPerSec > 0, kit.Group(int64(p.EventsPerSec+0.5))),
				orDash(p.ProcessingPeakRSSBytes > 0, fmt.Sprintf("%.0f", float64(p.ProcessingPeakRSSBytes)/(1<<20))),
				orDash(p.FullRestoreStartToReadyMs > 0, fmt.Sprintf("%.2f", float64(p.FullRestoreStartToReadyMs)/1000)),
				orDash(p.RestoreRecordsPerSecWall > 0, kit.Group(int64(p.RestoreRecordsPerSecWall+0.5))),
				orDash(p.FullRestorePeakRSSBytes > 0, fmt.Sprintf("%.0f", float64(p.FullRestorePeakRSSBytes)/(1<<20))),
				orDash(p.RestartStartToReadyMs > 0, fmt.Sprintf("%.2f", float64(p.RestartStartToReadyMs)/1000)),
				orDash(p.RestartPeakRSSBytes > 0, fmt.Sprintf("%.0f", float64(p.RestartPeakRSSBytes)/(1<<20))),
				orDash(p.CPUPerEventUs > 0, cpu))
		}
	}
	b.WriteString(g.sideBySide())
	if b.Len() > 0 {
		b.WriteString("\nRestored records/s = records restored ÷ the full restore's start → ready; CPU µs/event: the processing run's\n" +
			"whole-process user+sys CPU ÷ events (the ceiling: the harness's CPU over its consume). Every row is its own data set\n" +
			"(every product occurs at least once); per-run details in each row's results file.\n")
	}
	return b.String()
}

// sideBySide is, per guarantee, one row per data set on which salesagg and a
// reference variant both ran: salesagg's processing events/s and full restore
// time next to the best reference variant's (highest events/s) at that data
// set, and salesagg ÷ reference.
func (g *growthReport) sideBySide() string {
	var b strings.Builder
	for _, gu := range g.Guarantees {
		var sal *growthSeries
		var refs []*growthSeries
		for i := range g.Series {
			s := &g.Series[i]
			switch {
			case s.Guarantee != gu:
			case s.System == sysSalesagg:
				sal = s
			case strings.HasPrefix(s.System, sysReference):
				refs = append(refs, s)
			}
		}
		if sal == nil || len(refs) == 0 {
			continue
		}
		var rows []string
		for _, sp := range sal.Points {
			var best *growthPoint
			var bestSys string
			for _, rs := range refs {
				for i := range rs.Points {
					rp := &rs.Points[i]
					if rp.Products == sp.Products && rp.Status == "ok" && (best == nil || rp.EventsPerSec > best.EventsPerSec) {
						best, bestSys = rp, rs.System
					}
				}
			}
			if best == nil || sp.Status != "ok" {
				continue
			}
			cut := ""
			if best.Cut {
				cut = " (cut at the time limit: events/s so far)"
			}
			ratio := "–"
			if best.EventsPerSec > 0 {
				ratio = fmt.Sprintf("%.1f", sp.EventsPerSec/best.EventsPerSec)
			}
			restoreRatio := "–"
			if best.FullRestoreStartToReadyMs > 0 && sp.FullRestoreStartToReadyMs > 0 {
				restoreRatio = fmt.Sprintf("%.2f", float64(sp.FullRestoreStartToReadyMs)/float64(best.FullRestoreStartToReadyMs))
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %s%s | %s | %s | %s | %s | %s |\n", kit.Group(int64(sp.Products)),
				kit.Group(int64(sp.EventsPerSec+0.5)), kit.Group(int64(best.EventsPerSec+0.5)), cut, ratio,
				secsOrDash(sp.FullRestoreStartToReadyMs), secsOrDash(best.FullRestoreStartToReadyMs), restoreRatio, bestSys))
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n### Growth side by side: salesagg vs the best reference variant, %s\n\n", gu)
		b.WriteString("| products | salesagg events/s ↑ | reference events/s ↑ | salesagg / reference | salesagg full restore (s) ↓ | reference full restore (s) ↓ | salesagg / reference | reference variant |\n")
		b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
		for _, r := range rows {
			b.WriteString(r)
		}
	}
	return b.String()
}

func secsOrDash(ms int64) string {
	if ms <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", float64(ms)/1000)
}
