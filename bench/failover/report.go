package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
)

// benchmark builds salesagg, starts (or uses) the broker, runs every run of
// the chosen scenarios one after another, prints the tables and writes the
// JSON file.
func benchmark(ctx context.Context, o options) (err error) {
	tmp, err := os.MkdirTemp("", "salesagg-failover-")
	if err != nil {
		return err
	}
	failed := false
	defer func() {
		if o.keepTmp || err != nil || failed {
			logf("temporary files (process logs, state) kept in %s", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()
	logf("temporary dir %s", tmp)
	startedAt := time.Now()
	rep := &report{
		StartedAt: startedAt, Benchmark: "failover", Machine: kit.DescribeMachine(),
		Parameters: parameters{
			Products: o.products, RateEventsPerS: o.rate, Partitions: partitions, Instances: instances,
			Scenarios: o.scenarios, ProcessingGuarantee: guarantee,
			SessionTimeoutMs: o.sessionTimeout.Milliseconds(), CommitIntervalMs: o.commitInterval.Milliseconds(),
			SteadyMs: o.steady.Milliseconds(), PollMs: o.poll.Milliseconds(), TimeoutMs: o.timeout.Milliseconds(),
			StopTimeoutMs: o.stopTimeout.Milliseconds(), Seed: o.seed, Systems: o.systems, GroupProtocol: o.groupProtocol,
			ReferenceTransactionalStores: o.refTxnStores, ReferenceRocksDB: o.refRocksDB, ReferenceProbingMs: o.refProbingMs,
		},
		ExternalBroker: o.bootstrap != "",
	}
	rep.Machine.LoadAvgStart = kit.LoadAvg()
	e := &env{o: o, tmp: tmp, prefix: "fo-" + startedAt.Format("20060102-150405")}

	// Builds, untimed.
	if slices.Contains(o.systems, sysSalesagg) {
		e.bin = filepath.Join(tmp, "salesagg")
		if err := kit.BuildSalesagg(ctx, o.repo, e.bin, logf); err != nil {
			return err
		}
	}
	streamsVersion := ""
	if slices.Contains(o.systems, sysReference) {
		e.refSh = filepath.Join(o.repo, "bench", "kstreams-reference", "run.sh")
		logf("building the reference: %s --build-only", e.refSh)
		cmd := exec.CommandContext(ctx, e.refSh, "--build-only")
		cmd.Dir, cmd.Stdout, cmd.Stderr = o.repo, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the reference: %w", err)
		}
		streamsVersion = kit.ReferenceStreamsVersion(o.repo)
	}

	// Broker.
	br, err := kit.OpenBroker(ctx, o.repo, tmp, o.bootstrap, logf)
	defer br.Close() // always, even after a failed start
	if err != nil {
		return err
	}
	e.addr, e.adm, e.kc = br.Addr, br.Adm, br.Client
	rep.Bootstrap = e.addr
	rep.Versions = kit.Versions{Go: runtime.Version(), Java: kit.JavaVersion(), Kafka: br.Version, KafkaStreams: streamsVersion}
	rep.Versions.GitCommit, rep.Versions.GitDirty = kit.GitState(o.repo)

	warm := e.prefix + "-warmup"
	warmTopic := e.prefix + "-warmup"
	if err := kit.CreateTopic(ctx, e.adm, warmTopic, 1); err != nil {
		return err
	}
	if err := kit.WarmGroupCoordinator(ctx, e.adm, warm, warmTopic); err != nil {
		logf("warning: warming the group coordinator: %v", err)
	}
	kit.DeleteRun(e.adm, warmTopic, []string{warm}, logf)

	for _, sp := range specs(o.scenarios, o.systems) {
		if ctx.Err() != nil {
			rep.Interrupted = true
			break
		}
		r := runOne(ctx, e, sp.sys, sp.scenario, sp.name, sp.set, sp.total, sp.initial, sp.body)
		rep.Runs = append(rep.Runs, r)
		if r.Status != "ok" {
			failed = true
		}
	}
	if ctx.Err() != nil {
		rep.Interrupted = true
	}
	rep.Machine.LoadAvgEnd = kit.LoadAvg()
	rep.FinishedAt = time.Now()
	rep.Table = rep.tables()
	fmt.Println()
	fmt.Print(rep.header())
	fmt.Println()
	fmt.Print(rep.Table)
	if notes := rep.notes(); notes != "" {
		fmt.Println()
		fmt.Print(notes)
	}
	path, werr := rep.write(o.outDir)
	if werr != nil {
		return fmt.Errorf("writing results: %w", werr)
	}
	fmt.Printf("\nraw figures: %s\n\n", path)
	switch {
	case rep.Interrupted:
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	case failed:
		var fs []string
		for _, r := range rep.Runs {
			if r.Status != "ok" {
				fs = append(fs, r.Name+": "+kit.FirstLine(r.Error))
			}
		}
		return fmt.Errorf("some runs failed:\n  %s", strings.Join(fs, "\n  "))
	}
	return nil
}

type parameters struct {
	Products            int      `json:"products"`
	RateEventsPerS      int      `json:"rate_events_per_s"`
	Partitions          int      `json:"partitions"`
	Instances           int      `json:"instances"`
	Scenarios           []string `json:"scenarios"`
	ProcessingGuarantee string   `json:"processing_guarantee"`
	SessionTimeoutMs    int64    `json:"session_timeout_ms"`
	CommitIntervalMs    int64    `json:"commit_interval_ms"`
	SteadyMs            int64    `json:"steady_ms"`
	PollMs              int64    `json:"poll_ms"`
	TimeoutMs           int64    `json:"timeout_ms"`
	StopTimeoutMs       int64    `json:"stop_timeout_ms"`
	Seed                uint64   `json:"seed"`
	Systems             []string `json:"systems"`
	GroupProtocol       string   `json:"group_protocol"`
	// The reference's settings (when it runs).
	ReferenceTransactionalStores bool   `json:"reference_transactional_state_stores"`
	ReferenceRocksDB             string `json:"reference_rocksdb"`
	ReferenceProbingMs           int    `json:"reference_probing_rebalance_interval_ms"`
}

type report struct {
	StartedAt      time.Time    `json:"started_at"`
	FinishedAt     time.Time    `json:"finished_at"`
	Benchmark      string       `json:"benchmark"`
	Parameters     parameters   `json:"parameters"`
	Bootstrap      string       `json:"bootstrap"`
	ExternalBroker bool         `json:"external_broker"`
	Machine        kit.Machine  `json:"machine"`
	Versions       kit.Versions `json:"versions"`
	Interrupted    bool         `json:"interrupted,omitempty"`
	Runs           []*runResult `json:"runs"`
	Ratios         []ratioRow   `json:"salesagg_vs_reference"`
	Table          string       `json:"table_markdown"`
}

// ---------------------------------------------------------------------------
// Tables

func (rep *report) header() string {
	var b strings.Builder
	p, m, v := rep.Parameters, rep.Machine, rep.Versions
	fmt.Fprintf(&b, "## Failover benchmark: %s\n\n", strings.Join(rep.Parameters.Systems, " vs "))
	fmt.Fprintf(&b, "- state: %s products preloaded per run (one event each), %d input partitions (tasks), %d instances (scale: %d → %d), %s, commit.interval.ms %d, session.timeout.ms %d, group protocol %s\n",
		kit.Group(int64(p.Products)), p.Partitions, p.Instances, p.Instances-1, p.Instances, p.ProcessingGuarantee, p.CommitIntervalMs, p.SessionTimeoutMs, cmp.Or(p.GroupProtocol, "classic"))
	fmt.Fprintf(&b, "- load: %d events/s over all products while measuring (%s of steady state before each disruption); probes every %d ms\n",
		p.RateEventsPerS, time.Duration(p.SteadyMs)*time.Millisecond, p.PollMs)
	fmt.Fprintf(&b, "- machine: %d cores (%s), %s RAM, load average %s at start, %s at end\n",
		m.Cores, m.CPUModel, kit.GiB(m.MemTotalBytes), m.LoadAvgStart, m.LoadAvgEnd)
	dirty := ""
	if v.GitDirty {
		dirty = " (work tree modified)"
	}
	fmt.Fprintf(&b, "- versions: %s, Java %s, Kafka broker %s, Kafka Streams %s, git %s%s; broker %s\n", v.Go, v.Java, v.Kafka, v.KafkaStreams, kit.Short(v.GitCommit), dirty, rep.Bootstrap)
	if slices.Contains(p.Systems, sysReference) {
		membership := "static membership (group.instance.id = the instance name)"
		if p.GroupProtocol == "streams" {
			membership = "group.protocol=streams (no static membership; the group's session and standbys set on the broker)"
		}
		fmt.Fprintf(&b, "- reference: one stream thread, %s, enable.transactional.statestores %t, RocksDB %s, probing.rebalance.interval.ms %d; products asked through its own HTTP endpoint, which forwards to the key's active owner (queryMetadataForKey + application.server) and falls back to a standby\n",
			membership, p.ReferenceTransactionalStores, p.ReferenceRocksDB, p.ReferenceProbingMs)
	}
	return b.String()
}

func (rep *report) tables() string {
	var b strings.Builder
	byScenario := map[string][]*runResult{}
	for _, r := range rep.Runs {
		byScenario[r.Scenario] = append(byScenario[r.Scenario], r)
	}
	if rs := byScenario[scKill]; len(rs) > 0 {
		b.WriteString("### kill -9 of one instance, then its restart on the same state dir\n\n")
		b.WriteString("| system | num.standby.replicas | killed (its tasks) | kill → first 200 (s) | kill → 200 from an active owner (s) | kill → survivors ready (s) | records restored (take-over; from standby) | copy catch-up: records behind (copies) | restart → ready (s) | restart → serving (s) | restart → settled (s) | records restored by the restarted instance (copy catch-up) | records restored until settled (copy catch-up) |\n")
		b.WriteString("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range rs {
			k := r.Kill
			if k == nil || k.Victim == "" {
				fmt.Fprintf(&b, "| %s | %d | %s |\n", r.sysName(), r.Settings.Standbys, failedCell(r))
				continue
			}
			cells := []string{r.sysName(), strconv.Itoa(r.Settings.Standbys), fmt.Sprintf("%s (%s)", k.Victim, strings.Join(k.VictimTasks, ", "))}
			var first, active []string
			for _, tf := range k.Tasks {
				pre := ""
				if len(k.Tasks) > 1 {
					pre = tf.Task + ": "
				}
				st := ""
				if tf.FirstStandby {
					st = " (standby)"
					if tf.FirstLag >= 0 {
						st = fmt.Sprintf(" (standby, lag %d)", tf.FirstLag)
					}
				}
				first = append(first, pre+msCell(tf.FirstAnswerMs)+st)
				active = append(active, pre+msCell(tf.ActiveAnswerMs))
			}
			cells = append(cells, strings.Join(first, "; "), strings.Join(active, "; "))
			if k.KillToSurvivorsReadyMs > 0 {
				cells = append(cells, msCell(k.KillToSurvivorsReadyMs),
					fmt.Sprintf("%s (%s; %s)", kit.Group(k.Restored.Records), kit.Group(k.Restored.TakeoverRecords), kit.Group(k.Restored.StandbyRecords)),
					copyCell(k.Restored))
			} else {
				cells = append(cells, failedCell(r), "–", "–")
			}
			if rr := k.Restart; rr != nil && rr.StartToSettledMs >= 0 {
				cells = append(cells, msCell(rr.StartToReadyMs), msCell(rr.StartToServingMs), msCell(rr.StartToSettledMs),
					withCopies(rr.RestoredByRestarted), withCopies(rr.RestoredUntilSettled))
			} else {
				cells = append(cells, failedCell(r), "–", "–", "–", "–")
			}
			b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
		}
		b.WriteString("\nkill → first 200: the first 200 for a product of each task the killed instance ran, asked on every survivor every probe period\n" +
			"(also a standby's answer); from an active owner: X-Served-By without \"; standby\". Records restored: the survivors'\n" +
			"\"Finished restoring changelog\" lines from the kill until they are ready (of which \"Took over from\" and standby lines).\n" +
			"Copy catch-up: standby/warm-up copies that started tailing a changelog in the window, and how far behind its end they started.\n" +
			"Serving: /readyz 200, tasks of its own in its /v1/instances, and a product of one answered by itself. Settled: every\n" +
			"instance ready, the same owners in every /v1/instances, tasks balanced, unchanged for 2 s (the start of that stretch).\n\n")
	}
	if rs := byScenario[scRolling]; len(rs) > 0 {
		b.WriteString("### rolling restart of all three (SIGTERM, wait for the exit, start again on the same state dir, wait for /readyz 200, next)\n\n")
		b.WriteString("| system | num.standby.replicas | leave.group.on.close | **longest a task was unanswerable at every instance (s)** | that task | unanswerable time summed over tasks (s) | gaps | 200s from a standby (max lag) | records restored | copy catch-up: records behind (copies) | SIGTERM → exit per instance (s) | start → ready per instance (s) | first SIGTERM → settled (s) |\n")
		b.WriteString("| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |\n")
		for _, r := range rs {
			rr := r.Rolling
			if rr == nil || rr.Tasks == nil {
				fmt.Fprintf(&b, "| %s | %d | %t | %s |\n", r.sysName(), r.Settings.Standbys, r.Settings.LeaveGroupOnClose, failedCell(r))
				continue
			}
			gaps := 0
			for _, tg := range rr.Tasks {
				gaps += tg.Gaps
			}
			var stops, readies []string
			for _, st := range rr.Steps {
				stops = append(stops, msCell(st.StopMs))
				readies = append(readies, msCell(st.StartToReadyMs))
			}
			task := rr.MaxGapTask
			if rr.MaxGapMs <= 0 {
				task = "–"
			}
			fmt.Fprintf(&b, "| %s | %d | %t | %s | %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", r.sysName(), r.Settings.Standbys, r.Settings.LeaveGroupOnClose,
				msCell(max(rr.MaxGapMs, 0)), task, msCell(rr.TotalGapMs), gaps, standbyCell(rr.Tasks), kit.Group(rr.Restored.Records), copyCell(rr.Restored),
				strings.Join(stops, " / "), strings.Join(readies, " / "), msCell(rr.RollToSettledMs))
		}
		b.WriteString("\nUnanswerable: every instance's latest answer for a product of that task was not a 200 (503, 404, a transport error or\n" +
			"no answer within 1 s); each instance is asked for one product of every task every probe period, so a gap is accurate to\n" +
			"about one period plus a request. Records restored: every \"Finished restoring changelog\" line from the first SIGTERM\n" +
			"until the group settled.\n\n")
	}
	if rs := byScenario[scScale]; len(rs) > 0 {
		b.WriteString("### scale 2 → 3 (a third instance with an empty state dir joins two that hold all the state)\n\n")
		b.WriteString("| system | settings | new → ready (s) | new → serving (s) | its tasks | records restored before it serves (copy catch-up) | new → settled (s) | records restored until settled (copy catch-up) | longest a task was unanswerable (s) | 200s from a standby (max lag) |\n")
		b.WriteString("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range rs {
			sr := r.Scale
			if sr == nil || sr.StartToSettledMs < 0 {
				fmt.Fprintf(&b, "| %s | %s | %s |\n", r.sysName(), r.Settings.Label, failedCell(r))
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.sysName(), r.Settings.Label, msCell(sr.StartToReadyMs), msCell(sr.StartToServingMs),
				strings.Join(sr.ServingTasks, ", "), withCopies(sr.RestoredBeforeServing), msCell(sr.StartToSettledMs),
				withCopies(sr.RestoredUntilSettled), msCell(max(sr.MaxGapMs, 0)), standbyCell(sr.Tasks))
		}
		b.WriteString("\nServing: the new instance's /readyz 200 and tasks of its own in its /v1/instances. Records restored: every instance's\n" +
			"\"Finished restoring changelog\" lines from the new instance's start (until it serves / until settled, plus 0.5 s for\n" +
			"the log lines to be read). Unanswerable: as in the rolling restart, asked on the two first instances.\n\n")
	}
	b.WriteString(rep.ratios())
	if len(rep.Runs) > 0 {
		b.WriteString("### preload of each run\n\n")
		b.WriteString("| run | produce (s) | instances | start → all ready (s) | start → committed offsets = input end (s) | start → settled (s) | steady producer: events/s achieved (target) |\n")
		b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range rep.Runs {
			p := r.Preload
			if p == nil || p.StartToSettledMs == 0 {
				fmt.Fprintf(&b, "| %s | %s |\n", r.Name, failedCell(r))
				continue
			}
			prod := "–"
			if r.Producer != nil {
				prod = fmt.Sprintf("%s (%d)", kit.Group(int64(r.Producer.RateAchieved+0.5)), r.Producer.RateTarget)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s |\n", r.Name, msCell(p.ProduceMs), p.Instances, msCell(p.StartToAllReadyMs),
				msCell(p.StartToCaughtUpMs), msCell(p.StartToSettledMs), prod)
		}
	}
	return b.String()
}

// standbyCell: how many probe answers came from a standby copy, and the
// largest X-Salesagg-Standby-Lag among them.
func standbyCell(ts []*taskGaps) string {
	n, lag := 0, int64(-1)
	for _, tg := range ts {
		n += tg.Standby
		lag = max(lag, tg.MaxLag)
	}
	if n == 0 {
		return "0"
	}
	if lag < 0 {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%d (%s)", n, kit.Group(lag))
}

// copyCell: the catch-up of the copies started in a window.
func copyCell(s restoreSummary) string {
	return fmt.Sprintf("%s (%d)", kit.Group(s.CopyBehind), s.CopyCatchups)
}

// withCopies: records restored, then the copies' catch-up.
func withCopies(s restoreSummary) string {
	return fmt.Sprintf("%s (%s in %d)", kit.Group(s.Records), kit.Group(s.CopyBehind), s.CopyCatchups)
}

func failedCell(r *runResult) string {
	if r.Status == "ok" {
		return "–"
	}
	s := kit.FirstLine(r.Error)
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return "**FAILED**: " + strings.ReplaceAll(s, "|", "\\|")
}

func msCell(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return fmt.Sprintf("%.2f", float64(ms)/1000)
}

// notes lists failures and anomalies under the tables.
func (rep *report) notes() string {
	var b strings.Builder
	for _, r := range rep.Runs {
		if r.Status != "ok" {
			fmt.Fprintf(&b, "- **%s FAILED**: %s\n", r.Name, strings.ReplaceAll(r.Error, "\n", "\n    "))
		}
		for _, a := range r.Anomalies {
			fmt.Fprintf(&b, "- %s: %s\n", r.Name, a)
		}
	}
	if rep.Interrupted {
		b.WriteString("- interrupted: the runs after the last one listed did not run\n")
	}
	if b.Len() == 0 {
		return ""
	}
	return "### Failures and anomalies\n\n" + b.String()
}

// write stores the report as <outDir>/<date>T<time>-failover.json (via a
// .tmp file and a rename).
func (rep *report) write(outDir string) (string, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(outDir, rep.StartedAt.Format("2006-01-02T150405")+"-failover.json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
