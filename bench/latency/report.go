package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
)

// report is one run: every cell, and what it ran on.
type report struct {
	StartedAt  time.Time      `json:"started_at"`
	DurationMs int64          `json:"duration_ms"`
	Machine    kit.Machine    `json:"machine"`
	Versions   kit.Versions   `json:"versions"`
	Options    map[string]any `json:"options"`
	Cells      []*cell        `json:"cells"`
}

func (o options) summary() map[string]any {
	var ivs []string
	for _, iv := range o.intervals {
		ivs = append(ivs, intervalName(iv.Milliseconds()))
	}
	return map[string]any{
		"events": o.events, "products": o.products, "fraction": o.fraction, "max_rate": o.maxRate,
		"duration": o.duration.String(), "warmup": o.warmup.String(), "probe_every": o.probeEvery.String(),
		"poll_every": o.pollEvery.String(), "probes_per_partition": o.probesPerPart, "partitions": partitions,
		"systems": o.systems, "guarantees": o.guarantees, "commit_intervals": ivs, "seed": o.seed,
		"reference_rocksdb": o.refRocksDB, "reference_transactional_stores": o.refTxnStores,
	}
}

func (rep *report) write(dir string) (string, error) {
	path := filepath.Join(dir, rep.StartedAt.UTC().Format("2006-01-02T150405")+"-latency.json")
	return path, kit.WriteJSON(path, rep)
}

// table is the report as a Markdown table, one row per cell, then the
// anomalies.
func (rep *report) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Latency from produce to the new total, %s; commit %s, %d products, input %.0f%% of each cell's calibrated maximum\n\n",
		rep.Versions.GitCommit, rep.Options["commit_intervals"], rep.Options["products"], rep.Options["fraction"].(float64)*100)
	b.WriteString("| system | guarantee | commit interval | max events/s (calibration commit) | input events/s | CPU µs/event | HTTP p50 / p99 / max ms | changelog (read committed) p50 / p99 / max ms | probes |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range rep.Cells {
		if c.Status != "ok" || c.Calibration == nil {
			fmt.Fprintf(&b, "| %s | %s | %s | failed: %s | | | | | |\n", c.System, shortGuarantee(c.Guarantee), intervalName(c.CommitIntervalMs), kit.FirstLine(c.Error))
			continue
		}
		capped := ""
		if c.Capped {
			capped = " (capped)"
		}
		iv := intervalName(c.CommitIntervalMs)
		if c.CommitIntervalMs == 0 {
			iv = fmt.Sprintf("default (%d ms)", c.EffectiveMs)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s (%d ms) | %s%s | %.2f | %s | %s | %d |\n", c.System, shortGuarantee(c.Guarantee), iv,
			kit.Group(int64(c.Calibration.EventsPerSec)), c.Calibration.CommitIntervalMs, kit.Group(int64(c.InputRate)), capped,
			c.CPUUsPerEvent, triple(c.HTTP), triple(c.Changelog), c.ProbesProduced)
	}
	for _, c := range rep.Cells {
		for _, a := range c.Anomalies {
			fmt.Fprintf(&b, "\nANOMALY %s: %s", c.name(), a)
		}
	}
	return b.String()
}

func triple(d dist) string {
	if d.N == 0 {
		return "none seen"
	}
	s := fmt.Sprintf("%.1f / %.1f / %.1f", d.P50, d.P99, d.Max)
	if d.Unseen > 0 {
		s += fmt.Sprintf(" (%d unseen)", d.Unseen)
	}
	return s
}
