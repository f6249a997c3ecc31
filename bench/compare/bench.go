package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
)

// benchmark runs the whole comparison: build, broker, data, then every
// guarantee × system, one after another; prints the tables and writes the
// JSON files.
func benchmark(ctx context.Context, o options) (err error) {
	tmp, err := os.MkdirTemp("", "salesagg-bench-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keepTmp || err != nil {
			logf("temporary files (process logs, state) kept in %s", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()
	logf("temporary dir %s", tmp)
	startedAt := time.Now()
	machine := kit.DescribeMachine()

	e := &env{o: o, tmp: tmp, prefix: "bench-" + startedAt.Format("20060102-150405")}
	has := func(s string) bool { return strings.Contains(","+strings.Join(o.systems, ",")+",", ","+s+",") }

	// Builds first, untimed.
	if has(sysSalesagg) {
		e.salesagg = filepath.Join(tmp, "salesagg")
		if err := kit.BuildSalesagg(ctx, o.repo, e.salesagg, logf); err != nil {
			return err
		}
	}
	var streamsVersion string
	if has(sysReference) {
		e.refRunSh = filepath.Join(o.repo, "bench", "kstreams-reference", "run.sh")
		logf("building the reference: %s --build-only", e.refRunSh)
		cmd := exec.CommandContext(ctx, e.refRunSh, "--build-only")
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
	e.addr, e.adm = br.Addr, br.Adm
	var groups []string
	if br.External {
		defer func() { kit.DeleteRun(br.Adm, e.prefix, groups, logf) }()
	}

	// One data set per --products value, each through every guarantee ×
	// system.
	several := len(o.products) > 1
	var (
		failures []string
		reps     []*report
		paths    = map[*report]string{}
		warmed   bool
	)
	for _, products := range o.products {
		events := max(o.events, products)
		if events > o.events {
			logf("%d products: raising the events from %d to %d so that every product occurs", products, o.events, events)
		}
		topic := e.prefix + "-" + datasetSlug(products) + "-sales-events"
		logf("producing %d events over %d products (seed %d) into %s (%d partitions) at %s", events, products, o.seed, topic, o.partitions, e.addr)
		e.data = nil // the previous data set's totals can go before the next ones are made
		e.data, err = generate(ctx, e.addr, topic, events, products, o.seed, o.partitions, o.eventSpan, e.adm)
		if err != nil {
			return err
		}
		logf("produced in %.2f s (%.0f events/s); %d distinct products; end offsets %v", float64(e.data.produceMs)/1000,
			float64(events)/(float64(e.data.produceMs)/1000), e.data.distinct(), e.data.ends)

		if !warmed {
			warmed = true
			warm := e.prefix + "-warmup"
			groups = append(groups, warm)
			t0 := time.Now()
			if err := kit.WarmGroupCoordinator(ctx, e.adm, warm, topic); err != nil {
				logf("warning: warming the group coordinator: %v", err)
			} else {
				logf("group coordinator ready (%d ms)", time.Since(t0).Milliseconds())
			}
		}

		for _, g := range o.guarantees {
			e.guarantee = g
			rep := &report{
				StartedAt: time.Now(), Guarantee: g, Events: events, EventsRequested: o.events, Products: products,
				DistinctProducts: e.data.distinct(), Partitions: o.partitions, Seed: o.seed, InputTopic: topic, Bootstrap: e.addr,
				ExternalBroker: o.bootstrap != "", CommitIntervalMs: o.commitInterval.Milliseconds(), ProduceMs: e.data.produceMs,
				InputBytes: e.data.bytes, Machine: machine, Systems: map[string]*systemResult{}, Profile: o.profile,
				Windows: o.windows, EventSpanMs: o.eventSpan.Milliseconds(),
			}
			if o.profile {
				rep.ProfileSeconds = o.profileSeconds
			}
			rep.stem = resultsStem(o.outDir, rep.StartedAt, products, several, g)
			e.stem = rep.stem
			rep.Versions = kit.Versions{Go: runtime.Version(), Java: kit.JavaVersion(), Kafka: br.Version, KafkaStreams: streamsVersion}
			rep.Versions.GitCommit, rep.Versions.GitDirty = kit.GitState(o.repo)
			rep.Machine.LoadAvgStart = kit.LoadAvg()
			for i, s := range o.plan(products, g) {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				if i > 0 && o.settle > 0 {
					time.Sleep(o.settle)
				}
				var r *systemResult
				switch s.kind {
				case sysSalesagg:
					d := newSalesagg(e)
					groups = append(groups, d.appID())
					r = measure(ctx, e, d)
				case sysReference:
					d := newReference(e, s.ref)
					groups = append(groups, d.appID())
					r = measure(ctx, e, d)
					r.Reference = s.ref.settings()
				case sysCeiling:
					r = runCeiling(ctx, e)
					groups = append(groups, r.AppID)
				}
				rep.Order = append(rep.Order, s.name())
				rep.Systems[s.name()] = r
				if r.Status != "ok" {
					failures = append(failures, fmt.Sprintf("%s/%s/%s: %s", datasetSlug(products), g, s.name(), kit.FirstLine(r.Error)))
				}
			}
			rep.Machine.LoadAvgEnd = kit.LoadAvg()
			rep.FinishedAt = time.Now()
			rep.derive()
			table := rep.table()
			rep.Table = table
			fmt.Println()
			fmt.Print(rep.header())
			fmt.Println()
			fmt.Print(table)
			if notes := rep.notes(); notes != "" {
				fmt.Println()
				fmt.Print(notes)
			}
			if profs := rep.profileList(); profs != "" {
				fmt.Println()
				fmt.Print(profs)
			}
			path, err := rep.write()
			if err != nil {
				return fmt.Errorf("writing results: %w", err)
			}
			fmt.Printf("\nraw figures: %s\n\n", path)
			reps = append(reps, rep)
			paths[rep] = path
		}
	}

	if several {
		gr := newGrowth(o, startedAt, reps, paths)
		path := filepath.Join(o.outDir, startedAt.Format("2006-01-02T150405")+"-growth.json")
		fmt.Printf("## Growth with the number of products (%s)\n\n", strings.Join(o.guarantees, ", "))
		fmt.Print(gr.Table)
		if err := kit.WriteJSON(path, gr); err != nil {
			return fmt.Errorf("writing the growth results: %w", err)
		}
		fmt.Printf("\ngrowth figures: %s\n\n", path)
	}
	if len(failures) > 0 {
		return errors.New("some systems failed:\n  " + strings.Join(failures, "\n  "))
	}
	return nil
}
