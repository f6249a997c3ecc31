// Command compare is the side-by-side benchmark of salesagg against the Kafka
// Streams reference (bench/kstreams-reference) and a consume-only franz-go
// group consumer (the ceiling), on one real Kafka broker and one data set.
//
//	go run ./bench/compare [flags]      (or bench/compare.sh [flags])
//
// The systems run one after another, never concurrently. See bench/README.md
// for what is measured and how.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

const (
	sysSalesagg  = "salesagg"
	sysReference = "reference"
	sysCeiling   = "ceiling"

	atLeastOnce   = "at_least_once"
	exactlyOnceV2 = "exactly_once_v2"
)

// salesaggGuarantees lists the processing guarantees salesagg supports today.
var salesaggGuarantees = []string{atLeastOnce, exactlyOnceV2}

type options struct {
	events, products, partitions int
	seed                         uint64
	guarantees, systems          []string
	bootstrap                    string
	commitInterval               time.Duration
	phaseTimeout, stopTimeout    time.Duration
	settle                       time.Duration
	outDir, repo                 string
	keepTmp                      bool
}

func main() { os.Exit(run()) }

func run() int {
	var o options
	var guarantees, systems string
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.IntVar(&o.events, "events", 1_000_000, "number of input events")
	fs.IntVar(&o.products, "products", 100_000, "number of distinct products (record keys)")
	fs.IntVar(&o.partitions, "partitions", 3, "partitions of the input topic")
	fs.Uint64Var(&o.seed, "seed", 20240601, "seed of the data generator (same seed, same data)")
	fs.StringVar(&guarantees, "guarantees", atLeastOnce+","+exactlyOnceV2, "comma-separated processing guarantees: at_least_once, exactly_once_v2")
	fs.StringVar(&systems, "systems", "ceiling,salesagg,reference", "comma-separated systems to run, in this order: salesagg, reference, ceiling")
	fs.StringVar(&o.bootstrap, "bootstrap", "", "use this Kafka broker (host:port) instead of starting one with test/kafka/kafka.sh")
	commitMs := fs.Int("commit-interval-ms", 1000, "commit interval given to salesagg (--commit.interval.ms) and the reference (--commit-interval-ms)")
	fs.DurationVar(&o.phaseTimeout, "phase-timeout", 20*time.Minute, "upper bound of each phase (processing, restore, restart)")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 60*time.Second, "time given to a process to exit after SIGTERM before SIGKILL")
	fs.DurationVar(&o.settle, "settle", 3*time.Second, "pause between systems (lets the broker and the page cache settle)")
	fs.StringVar(&o.outDir, "out", "", "directory for the JSON results (default <repo>/bench/results)")
	fs.StringVar(&o.repo, "repo", "", "repository root (default: found from the working directory)")
	fs.BoolVar(&o.keepTmp, "keep-tmp", false, "keep the temporary directory (process logs, state dirs, broker) after the run")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./bench/compare [flags]    (quick run: --events 20000 --products 2000)\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "compare: unexpected arguments %q\n", fs.Args())
		return 2
	}
	o.commitInterval = time.Duration(*commitMs) * time.Millisecond
	o.guarantees = splitList(guarantees)
	o.systems = splitList(systems)
	if err := o.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		return 2
	}
	if o.repo == "" {
		r, err := findRepo()
		if err != nil {
			fmt.Fprintf(os.Stderr, "compare: %v (pass --repo)\n", err)
			return 2
		}
		o.repo = r
	}
	if o.outDir == "" {
		o.outDir = filepath.Join(o.repo, "bench", "results")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := benchmark(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		return 1
	}
	return 0
}

func (o *options) validate() error {
	var problems []string
	if o.events < 1 {
		problems = append(problems, "--events must be at least 1")
	}
	if o.products < 1 {
		problems = append(problems, "--products must be at least 1")
	}
	if o.partitions < 1 {
		problems = append(problems, "--partitions must be at least 1")
	}
	if o.commitInterval <= 0 {
		problems = append(problems, "--commit-interval-ms must be positive")
	}
	if len(o.guarantees) == 0 {
		problems = append(problems, "--guarantees is empty")
	}
	for _, g := range o.guarantees {
		if g != atLeastOnce && g != exactlyOnceV2 {
			problems = append(problems, fmt.Sprintf("--guarantees: unknown guarantee %q (allowed: %s, %s)", g, atLeastOnce, exactlyOnceV2))
		}
	}
	if len(o.systems) == 0 {
		problems = append(problems, "--systems is empty")
	}
	seen := map[string]bool{}
	for _, s := range o.systems {
		if s != sysSalesagg && s != sysReference && s != sysCeiling {
			problems = append(problems, fmt.Sprintf("--systems: unknown system %q (allowed: %s, %s, %s)", s, sysSalesagg, sysReference, sysCeiling))
		}
		if seen[s] {
			problems = append(problems, fmt.Sprintf("--systems: %q listed twice", s))
		}
		seen[s] = true
	}
	if seen[sysSalesagg] {
		for _, g := range o.guarantees {
			if !slices.Contains(salesaggGuarantees, g) {
				problems = append(problems, fmt.Sprintf(
					"salesagg does not support processing.guarantee=%s (supported today: %s); measure %s for the reference only with --guarantees %s --systems reference,ceiling",
					g, strings.Join(salesaggGuarantees, ", "), g, g))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\ncompare: "))
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// findRepo walks up from the working directory to the salesagg module root.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/salesagg/salesagg\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the salesagg repository (no go.mod of github.com/salesagg/salesagg above the working directory)")
		}
		dir = parent
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s compare: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
