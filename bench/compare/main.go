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
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
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
	events, partitions        int
	products                  []int // one data set each, in this order
	seed                      uint64
	guarantees, systems       []string
	refThreads                []int         // --reference-threads
	refCaches                 []int64       // --reference-cache; cacheDefault: Kafka Streams' own
	refRocksDB                []string      // --reference-rocksdb: default, tuned
	refTxn                    []bool        // --reference-transactional-stores (exactly-once only)
	refProducts               []int         // --reference-products; empty: every data set
	refTimeLimit              time.Duration // --reference-time-limit; 0: none
	bootstrap                 string
	commitInterval            time.Duration
	phaseTimeout, stopTimeout time.Duration
	settle                    time.Duration
	outDir, repo              string
	keepTmp                   bool
	profile                   bool
	profileSeconds            int
	// windows are the window sizes given to both systems ("" : none);
	// eventSpan spreads the events' timestamps over that span up to the
	// start of the produce (0: the produce time).
	windows   string
	eventSpan time.Duration
}

// cacheDefault in options.refCaches leaves statestore.cache.max.bytes at
// Kafka Streams' default (10 MiB).
const cacheDefault = -1

// maxProfileSeconds bounds a CPU profile: salesagg's HTTP server has a 30 s
// write timeout.
const maxProfileSeconds = 29

func main() { os.Exit(run()) }

func run() int {
	var o options
	var guarantees, systems, products, refThreads, refCaches, refRocks, refTxn, refProducts string
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.IntVar(&o.events, "events", 1_000_000, "number of input events per data set (raised to the product count when lower)")
	fs.StringVar(&products, "products", "100000", "comma-separated product counts (distinct record keys): one data set, and one full round of every guarantee and system, each")
	fs.IntVar(&o.partitions, "partitions", 3, "partitions of the input topic")
	fs.Uint64Var(&o.seed, "seed", 20240601, "seed of the data generator (same seed, same data)")
	fs.StringVar(&guarantees, "guarantees", atLeastOnce+","+exactlyOnceV2, "comma-separated processing guarantees: at_least_once, exactly_once_v2")
	fs.StringVar(&systems, "systems", "ceiling,salesagg,reference", "comma-separated systems to run, in this order: salesagg, reference (every reference variant), ceiling")
	fs.StringVar(&refThreads, "reference-threads", "1,2", "comma-separated num.stream.threads of the reference; each × --reference-cache is one reference variant")
	fs.StringVar(&refCaches, "reference-cache", "default,67108864", "comma-separated statestore.cache.max.bytes of the reference, in bytes, or default (Kafka Streams' 10 MiB)")
	fs.StringVar(&refRocks, "reference-rocksdb", "default,tuned", "comma-separated RocksDB settings of the reference: default (Kafka Streams') and/or tuned (its RocksDBConfigSetter salesagg.reference.RocksDBTuning); one more variant dimension")
	fs.StringVar(&refTxn, "reference-transactional-stores", "false", "comma-separated enable.transactional.statestores of the reference's exactly-once variants: false and/or true (at-least-once variants always run without)")
	fs.StringVar(&refProducts, "reference-products", "all", "comma-separated --products values at which the reference runs, or all")
	fs.DurationVar(&o.refTimeLimit, "reference-time-limit", 0, "bound of the reference's processing run (0: --phase-timeout): when reached, the throughput so far (committed offsets ÷ time) is reported, marked cut, the changelog is not verified, and the restore runs go on")
	fs.StringVar(&o.bootstrap, "bootstrap", "", "use this Kafka broker (host:port) instead of starting one with test/kafka/kafka.sh")
	commitMs := fs.Int("commit-interval-ms", 1000, "commit interval given to salesagg (--commit.interval.ms) and the reference (--commit-interval-ms)")
	fs.DurationVar(&o.phaseTimeout, "phase-timeout", 20*time.Minute, "upper bound of each phase (processing, restore, restart)")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 60*time.Second, "time given to a process to exit after SIGTERM before SIGKILL")
	fs.DurationVar(&o.settle, "settle", 3*time.Second, "pause between systems (lets the broker and the page cache settle)")
	fs.StringVar(&o.outDir, "out", "", "directory for the JSON results (default <repo>/bench/results)")
	fs.StringVar(&o.repo, "repo", "", "repository root (default: found from the working directory)")
	fs.BoolVar(&o.keepTmp, "keep-tmp", false, "keep the temporary directory (process logs, state dirs, broker) after the run")
	fs.BoolVar(&o.profile, "profile", false, "run salesagg with --http.pprof true and save CPU and heap profiles of its processing and full restore runs next to the JSON")
	fs.StringVar(&o.windows, "windows", "", "comma-separated tumbling window sizes (1h,24h; units ms, s, m, h) that both systems keep beside the totals: salesagg --windows.sizes, the reference --windows")
	fs.DurationVar(&o.eventSpan, "event-span", 0, "spread the events' record timestamps evenly over this span, oldest first, ending when the produce starts (0: the produce time); with --windows, how many windows the events open")
	fs.IntVar(&o.profileSeconds, "profile-seconds", maxProfileSeconds, "length of each CPU profile with --profile, 1..29 s (the harness waits for it before stopping salesagg)")
	if code, ok := kit.Parse(fs, "compare", "--events 20000 --products 2000"); !ok {
		return code
	}
	o.commitInterval = time.Duration(*commitMs) * time.Millisecond
	o.guarantees = kit.SplitList(guarantees)
	o.systems = kit.SplitList(systems)
	var problems []string
	var err error
	if o.products, err = parseInts(products); err != nil {
		problems = append(problems, "--products: "+err.Error())
	}
	if o.refThreads, err = parseInts(refThreads); err != nil {
		problems = append(problems, "--reference-threads: "+err.Error())
	}
	if o.refCaches, err = parseCaches(refCaches); err != nil {
		problems = append(problems, "--reference-cache: "+err.Error())
	}
	if o.refRocksDB = kit.SplitList(refRocks); len(o.refRocksDB) == 0 {
		problems = append(problems, "--reference-rocksdb is empty")
	}
	if o.refTxn, err = parseBools(refTxn); err != nil {
		problems = append(problems, "--reference-transactional-stores: "+err.Error())
	}
	if refProducts != "all" {
		if o.refProducts, err = parseInts(refProducts); err != nil {
			problems = append(problems, "--reference-products: "+err.Error())
		}
	}
	if err := o.validate(problems); err != nil {
		fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		return 2
	}
	return kit.Run("compare", &o.repo, &o.outDir, func(ctx context.Context) error { return benchmark(ctx, o) })
}

// validate adds what is wrong with o to problems (those of parsing) and
// returns them all as one error.
func (o *options) validate(problems []string) error {
	if o.events < 1 {
		problems = append(problems, "--events must be at least 1")
	}
	problems = append(problems, checkList("--products", o.products, 1, math.MaxInt32)...)
	problems = append(problems, checkList("--reference-threads", o.refThreads, 1, 64)...)
	for i, c := range o.refCaches {
		if slices.Contains(o.refCaches[:i], c) {
			problems = append(problems, fmt.Sprintf("--reference-cache: %s listed twice", cacheName(c)))
		}
	}
	for i, r := range o.refRocksDB {
		if r != rocksDefault && r != rocksTuned {
			problems = append(problems, fmt.Sprintf("--reference-rocksdb: unknown setting %q (allowed: %s, %s)", r, rocksDefault, rocksTuned))
		}
		if slices.Contains(o.refRocksDB[:i], r) {
			problems = append(problems, fmt.Sprintf("--reference-rocksdb: %s listed twice", r))
		}
	}
	for _, p := range o.refProducts {
		if !slices.Contains(o.products, p) {
			problems = append(problems, fmt.Sprintf("--reference-products: %d is not one of --products", p))
		}
	}
	if o.refTimeLimit < 0 {
		problems = append(problems, "--reference-time-limit must not be negative")
	}
	if o.profileSeconds < 1 || o.profileSeconds > maxProfileSeconds {
		problems = append(problems, fmt.Sprintf("--profile-seconds must be within 1..%d (salesagg's HTTP write timeout is 30 s)", maxProfileSeconds))
	}
	if o.partitions < 1 {
		problems = append(problems, "--partitions must be at least 1")
	}
	for i, w := range kit.SplitList(o.windows) {
		if !windowSizeRe.MatchString(w) {
			problems = append(problems, fmt.Sprintf("--windows: %q is not a size such as 90s, 15m or 1h (a number and one of ms, s, m, h)", w))
		}
		if slices.Contains(kit.SplitList(o.windows)[:i], w) {
			problems = append(problems, fmt.Sprintf("--windows: %s listed twice", w))
		}
	}
	if o.eventSpan < 0 {
		problems = append(problems, "--event-span must not be negative")
	}
	if o.commitInterval <= 0 {
		problems = append(problems, "--commit-interval-ms must be positive")
	}
	problems = append(problems, kit.OneOf("--guarantees", o.guarantees, atLeastOnce, exactlyOnceV2)...)
	problems = append(problems, kit.OneOf("--systems", o.systems, sysSalesagg, sysReference, sysCeiling)...)
	if slices.Contains(o.systems, sysSalesagg) {
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

// windowSizeRe is a window size both systems read the same way.
var windowSizeRe = regexp.MustCompile(`^[1-9][0-9]*(ms|s|m|h)$`)

// checkList reports values outside [lo, hi] and duplicates.
func checkList(flagName string, vs []int, lo, hi int) []string {
	var problems []string
	for i, v := range vs {
		if v < lo || v > hi {
			problems = append(problems, fmt.Sprintf("%s: %d is outside %d..%d", flagName, v, lo, hi))
		}
		if slices.Contains(vs[:i], v) {
			problems = append(problems, fmt.Sprintf("%s: %d listed twice", flagName, v))
		}
	}
	return problems
}

// parseInts parses a non-empty comma-separated list of integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range kit.SplitList(s) {
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty")
	}
	return out, nil
}

// parseBools parses a non-empty comma-separated list of true/false, each
// at most once.
func parseBools(s string) ([]bool, error) {
	var out []bool
	for _, p := range kit.SplitList(s) {
		b, err := strconv.ParseBool(p)
		if err != nil || (p != "true" && p != "false") {
			return nil, fmt.Errorf("%q is neither true nor false", p)
		}
		if slices.Contains(out, b) {
			return nil, fmt.Errorf("%s listed twice", p)
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, errors.New("empty")
	}
	return out, nil
}

// parseCaches parses --reference-cache: byte counts (≥ 0) or "default".
func parseCaches(s string) ([]int64, error) {
	var out []int64
	for _, p := range kit.SplitList(s) {
		if p == "default" {
			out = append(out, cacheDefault)
			continue
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is neither a byte count (≥ 0) nor default", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty")
	}
	return out, nil
}

// logf logs a progress line of the comparison to standard error.
func logf(format string, args ...any) { kit.NewLogf("compare")(format, args...) }
