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
	machine := describeMachine()

	e := &env{o: o, tmp: tmp, prefix: "bench-" + startedAt.Format("20060102-150405")}
	has := func(s string) bool { return strings.Contains(","+strings.Join(o.systems, ",")+",", ","+s+",") }

	// Builds first, untimed.
	if has(sysSalesagg) {
		e.salesagg = filepath.Join(tmp, "salesagg")
		logf("building salesagg: go build -o %s ./cmd/salesagg", e.salesagg)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", e.salesagg, "./cmd/salesagg")
		cmd.Dir, cmd.Stdout, cmd.Stderr = o.repo, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building salesagg: %w", err)
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
		streamsVersion = referenceStreamsVersion(o.repo)
	}

	// Broker.
	var br *broker
	if o.bootstrap != "" {
		br = &broker{addr: o.bootstrap}
	} else {
		br, err = startBroker(ctx, o.repo, tmp)
		defer br.down() // always, even after a failed start
		if err != nil {
			return err
		}
	}
	e.addr = br.addr
	admCl, adm, err := newAdmin(e.addr)
	if err != nil {
		return err
	}
	defer admCl.Close()
	e.adm = adm
	if br.version == "" {
		br.version = brokerVersionGuess(ctx, adm)
	}
	var groups []string
	if o.bootstrap != "" {
		defer func() { deleteRunTopics(e.addr, e.prefix, groups) }()
	}

	// Data.
	topic := e.prefix + "-sales-events"
	logf("producing %d events over %d products (seed %d) into %s (%d partitions) at %s", o.events, o.products, o.seed, topic, o.partitions, e.addr)
	e.data, err = generate(ctx, e.addr, topic, o, adm)
	if err != nil {
		return err
	}
	logf("produced in %.2f s (%.0f events/s); %d distinct products; end offsets %v", float64(e.data.produceMs)/1000,
		float64(o.events)/(float64(e.data.produceMs)/1000), len(e.data.expected), e.data.ends)

	warm := e.prefix + "-warmup"
	groups = append(groups, warm)
	t0 := time.Now()
	if err := warmGroupCoordinator(ctx, adm, warm, topic); err != nil {
		logf("warning: warming the group coordinator: %v", err)
	} else {
		logf("group coordinator ready (%d ms)", time.Since(t0).Milliseconds())
	}

	var failures []string
	for _, g := range o.guarantees {
		e.guarantee = g
		rep := &report{
			StartedAt: time.Now(), Guarantee: g, Events: o.events, Products: o.products, DistinctProducts: len(e.data.expected),
			Partitions: o.partitions, Seed: o.seed, InputTopic: topic, Bootstrap: e.addr, ExternalBroker: o.bootstrap != "",
			CommitIntervalMs: o.commitInterval.Milliseconds(), ProduceMs: e.data.produceMs, InputBytes: e.data.bytes,
			Machine: machine, Systems: map[string]*systemResult{}, Order: o.systems,
		}
		rep.Versions = versions{Go: runtime.Version(), Java: javaVersion(), Kafka: br.version, KafkaStreams: streamsVersion}
		rep.Versions.GitCommit, rep.Versions.GitDirty = gitState(o.repo)
		rep.Machine.LoadAvgStart = loadAvg()
		for i, s := range o.systems {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if i > 0 && o.settle > 0 {
				time.Sleep(o.settle)
			}
			var r *systemResult
			switch s {
			case sysSalesagg:
				d := newSalesagg(e)
				groups = append(groups, d.appID())
				r = measure(ctx, e, d)
			case sysReference:
				d := newReference(e)
				groups = append(groups, d.appID())
				r = measure(ctx, e, d)
			case sysCeiling:
				r = runCeiling(ctx, e)
				groups = append(groups, r.AppID)
			}
			rep.Systems[s] = r
			if r.Status != "ok" {
				failures = append(failures, fmt.Sprintf("%s/%s: %s", g, s, firstLine(r.Error)))
			}
		}
		rep.Machine.LoadAvgEnd = loadAvg()
		rep.FinishedAt = time.Now()
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
		path, err := rep.write(o.outDir)
		if err != nil {
			return fmt.Errorf("writing results: %w", err)
		}
		fmt.Printf("\nraw figures: %s\n\n", path)
	}
	if len(failures) > 0 {
		return errors.New("some systems failed:\n  " + strings.Join(failures, "\n  "))
	}
	return nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
