// Command latency measures how long an event takes to show in its total,
// for salesagg and the Kafka Streams reference side by side on one real
// Apache Kafka broker: the time from an event's produce to its new total
// being (a) answered over HTTP and (b) readable in the changelog with
// read_committed, at a steady input of half each system's measured maximum
// rate.
//
//	go run ./bench/latency [flags]      (quick run: --events 200000 --duration 20s --systems salesagg)
//
// Each cell (system × guarantee × commit interval) runs alone on topics of
// its own: a calibration (the system consumes a preloaded input; its
// events/s from ready until its committed offsets reach the end is its
// maximum rate), then probes among a steady input. See bench/README.md
// ("Latency benchmark").
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"flag"

	"github.com/salesagg/salesagg/bench/kit"
)

const (
	partitions   = 3
	sysSalesagg  = "salesagg"
	sysReference = "reference"

	guaranteeALOS = "at_least_once"
	guaranteeEOS  = "exactly_once_v2"

	// intervalDefault is a commit interval not passed: each system's own
	// default (see effectiveInterval).
	intervalDefault = 0
)

type options struct {
	events        int           // preloaded events of the calibration
	products      int           // products of the preload and the steady input
	fraction      float64       // steady input = fraction × the calibrated maximum
	maxRate       int           // cap of the steady input (0: none)
	duration      time.Duration // measured window of probes
	warmup        time.Duration // steady input before probes count
	probeEvery    time.Duration // one probe per period, round robin over the keys
	pollEvery     time.Duration // HTTP ask period per probe key
	probesPerPart int
	systems       []string
	guarantees    []string
	intervals     []time.Duration // intervalDefault: not passed
	bootstrap     string
	keepTmp       bool
	outDir, repo  string
	stopTimeout   time.Duration
	timeout       time.Duration // bound of each wait
	seed          uint64
	refRocksDB    string
	refTxnStores  bool // enable.transactional.statestores (KIP-892), exactly-once cells only
}

func main() { os.Exit(run()) }

func run() int {
	var o options
	var systems, guarantees, intervals string
	fs := flag.NewFlagSet("latency", flag.ContinueOnError)
	fs.IntVar(&o.events, "events", 2_000_000, "preloaded events of each cell's calibration (its maximum rate)")
	fs.IntVar(&o.products, "products", 100_000, "distinct products of the preload and of the steady input")
	fs.Float64Var(&o.fraction, "fraction", 0.5, "steady input rate as a fraction of the cell's calibrated maximum")
	fs.IntVar(&o.maxRate, "max-rate", 0, "cap of the steady input in events/s (0: none); the report says when it applied")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "measured window: probes produced in it count")
	fs.DurationVar(&o.warmup, "warmup", 5*time.Second, "steady input before the measured window")
	fs.DurationVar(&o.probeEvery, "probe-every", 10*time.Millisecond, "one probe event per period, round robin over the probe products")
	fs.DurationVar(&o.pollEvery, "poll-every", 5*time.Millisecond, "period of the HTTP asks, per probe product")
	fs.IntVar(&o.probesPerPart, "probes-per-partition", 1, "probe products per input partition")
	fs.StringVar(&systems, "systems", sysSalesagg+","+sysReference, "comma-separated: salesagg, reference (the Kafka Streams reference)")
	fs.StringVar(&guarantees, "guarantees", guaranteeALOS+","+guaranteeEOS, "comma-separated processing guarantees")
	fs.StringVar(&intervals, "commit-intervals", "default,100,1000", "comma-separated commit.interval.ms values; default: the flag not passed (each system's own default)")
	fs.StringVar(&o.bootstrap, "bootstrap", "", "use this Kafka broker (host:port) instead of starting one; the run's topics and groups are deleted at the end")
	fs.BoolVar(&o.keepTmp, "keep-tmp", false, "keep the temporary directory (process logs, state dirs) after a successful run")
	fs.StringVar(&o.outDir, "out", "", "directory for the JSON results (default <repo>/bench/results)")
	fs.StringVar(&o.repo, "repo", "", "repository root (default: found from the working directory)")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 60*time.Second, "SIGTERM → SIGKILL delay")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "upper bound of each wait (ready, calibration, the probes' drain)")
	fs.Uint64Var(&o.seed, "seed", 20240601, "seed of the input's product choice")
	fs.StringVar(&o.refRocksDB, "reference-rocksdb", "default", "the reference's RocksDB settings: default, or tuned")
	fs.BoolVar(&o.refTxnStores, "reference-transactional-stores", false, "run the reference's exactly-once cells with enable.transactional.statestores (KIP-892); Kafka Streams' default is off")
	if code, ok := kit.Parse(fs, "latency", "--events 200000 --duration 20s --systems salesagg"); !ok {
		return code
	}
	o.systems, o.guarantees = kit.SplitList(systems), kit.SplitList(guarantees)
	var problems []string
	for _, s := range kit.SplitList(intervals) {
		if s == "default" {
			o.intervals = append(o.intervals, intervalDefault)
			continue
		}
		ms, err := strconv.Atoi(s)
		if err != nil || ms < 1 || ms > 60_000 {
			problems = append(problems, fmt.Sprintf("--commit-intervals: %q is neither default nor a number of ms from 1 to 60000", s))
			continue
		}
		o.intervals = append(o.intervals, time.Duration(ms)*time.Millisecond)
	}
	if err := o.validate(problems); err != nil {
		fmt.Fprintf(os.Stderr, "latency: %v\n", err)
		return 2
	}
	return kit.Run("latency", &o.repo, &o.outDir, func(ctx context.Context) error { return benchmark(ctx, o) })
}

func (o *options) validate(problems []string) error {
	if o.events < 1000 || o.events > 100_000_000 {
		problems = append(problems, "--events must be from 1000 to 100000000")
	}
	if o.products < partitions || o.products > o.events {
		problems = append(problems, "--products must be from 3 to --events")
	}
	if o.fraction <= 0 || o.fraction > 1 {
		problems = append(problems, "--fraction must be in (0, 1]")
	}
	if o.maxRate < 0 {
		problems = append(problems, "--max-rate must be 0 or more")
	}
	if o.duration < time.Second || o.warmup < 0 {
		problems = append(problems, "--duration must be at least 1s and --warmup not negative")
	}
	if o.probeEvery < time.Millisecond || o.pollEvery < time.Millisecond {
		problems = append(problems, "--probe-every and --poll-every must be at least 1ms")
	}
	if o.probesPerPart < 1 || o.probesPerPart > 100 {
		problems = append(problems, "--probes-per-partition must be from 1 to 100")
	}
	if o.refRocksDB != "default" && o.refRocksDB != "tuned" {
		problems = append(problems, fmt.Sprintf("--reference-rocksdb %q: allowed default, tuned", o.refRocksDB))
	}
	problems = append(problems, kit.OneOf("--systems", o.systems, sysSalesagg, sysReference)...)
	problems = append(problems, kit.OneOf("--guarantees", o.guarantees, guaranteeALOS, guaranteeEOS)...)
	if len(o.intervals) == 0 {
		problems = append(problems, "--commit-intervals is empty")
	}
	if len(problems) > 0 {
		return fmt.Errorf("bad flags:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

// oneOf checks a list flag: not empty, each value allowed, none twice.
func logf(format string, args ...any) { kit.NewLogf("latency")(format, args...) }
