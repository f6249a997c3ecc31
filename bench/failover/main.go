// Command failover is the failover benchmark of salesagg, side by side with
// the Kafka Streams reference: three instances of one application on one
// real Apache Kafka broker, events flowing at a steady
// rate, and how long products stay unanswerable and how many changelog
// records are restored when an instance is killed with SIGKILL, when all
// three are restarted one after another, and when the group grows from two
// instances to three.
//
//	go run ./bench/failover [flags]      (quick run: --products 20000 --rate 2000)
//
// Each run (scenario × settings) uses its own application id and topics and
// runs alone. See bench/README.md ("Failover benchmark") for the figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
)

const (
	scKill    = "kill"
	scRolling = "rolling"
	scScale   = "scale"

	// partitions of the input topic, hence tasks 0_0..0_2.
	partitions = 3
	// instances of the group (kill, rolling); scale goes from 2 to 3.
	instances = 3
	guarantee = "exactly_once_v2"

	sysSalesagg  = "salesagg"
	sysReference = "reference"
)

type options struct {
	products       int
	rate           int
	scenarios      []string
	bootstrap      string
	keepTmp        bool
	outDir, repo   string
	sessionTimeout time.Duration
	commitInterval time.Duration
	steady         time.Duration // events flow this long before each disruption
	timeout        time.Duration // bound of every wait
	stopTimeout    time.Duration // SIGTERM → SIGKILL
	poll           time.Duration // probe period
	seed           uint64
	systems        []string
	// groupProtocol is every instance's group protocol: classic, or
	// streams (a KIP-1071 streams group, for both systems).
	groupProtocol string
	// The Kafka Streams reference's own settings.
	refTxnStores bool   // enable.transactional.statestores
	refRocksDB   string // run.sh --rocksdb
	refProbingMs int    // probing.rebalance.interval.ms
}

func main() { os.Exit(run()) }

func run() int {
	var o options
	var scenarios, systems string
	fs := flag.NewFlagSet("failover", flag.ContinueOnError)
	fs.IntVar(&o.products, "products", 1_000_000, "distinct products preloaded (one event each), i.e. the state of each run")
	fs.IntVar(&o.rate, "rate", 5000, "events/s produced during each measurement (keys product-<i>, i uniform over --products)")
	fs.StringVar(&scenarios, "scenarios", scKill+","+scRolling+","+scScale, "comma-separated scenarios: kill, rolling, scale")
	fs.StringVar(&o.bootstrap, "bootstrap", "", "use this Kafka broker (host:port) instead of starting one with test/kafka/kafka.sh; the run's topics and groups are deleted at the end")
	fs.BoolVar(&o.keepTmp, "keep-tmp", false, "keep the temporary directory (process logs, state dirs) after a successful run")
	fs.StringVar(&o.outDir, "out", "", "directory for the JSON results (default <repo>/bench/results)")
	fs.StringVar(&o.repo, "repo", "", "repository root (default: found from the working directory)")
	sessionMs := fs.Int("session-timeout-ms", 10000, "session.timeout.ms given to every instance")
	commitMs := fs.Int("commit-interval-ms", 100, "commit.interval.ms given to every instance")
	fs.DurationVar(&o.steady, "steady", 3*time.Second, "how long events flow with every instance serving before each disruption")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "upper bound of every wait (readiness, catch-up, failover, settling)")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 60*time.Second, "time given to a process to exit after SIGTERM before SIGKILL")
	fs.DurationVar(&o.poll, "poll", 50*time.Millisecond, "period of the product probes")
	fs.Uint64Var(&o.seed, "seed", 20240601, "seed of the steady producer's product choice")
	fs.StringVar(&systems, "systems", sysSalesagg+","+sysReference, "comma-separated systems, each run of a scenario once per system in this order: salesagg, reference (the Kafka Streams reference)")
	fs.StringVar(&o.groupProtocol, "group-protocol", "classic", "every instance's group protocol: classic, or streams (a KIP-1071 streams group: salesagg's group.protocol streams, the reference's group.protocol=streams without static membership; the group's streams.session.timeout.ms and streams.num.standby.replicas are set on the broker)")
	fs.BoolVar(&o.refTxnStores, "reference-transactional-stores", true, "run the reference with enable.transactional.statestores (KIP-892: under exactly-once its state survives a kill -9)")
	fs.StringVar(&o.refRocksDB, "reference-rocksdb", "default", "the reference's RocksDB settings: default, or tuned (run.sh --rocksdb tuned)")
	fs.IntVar(&o.refProbingMs, "reference-probing-rebalance-interval-ms", 60000, "probing.rebalance.interval.ms of the reference (Kafka Streams' default 600000, its minimum 60000): how soon a warmed-up copy takes over")
	if code, ok := kit.Parse(fs, "failover", "--products 20000 --rate 2000"); !ok {
		return code
	}
	o.sessionTimeout = time.Duration(*sessionMs) * time.Millisecond
	o.commitInterval = time.Duration(*commitMs) * time.Millisecond
	o.scenarios = kit.SplitList(scenarios)
	o.systems = kit.SplitList(systems)
	if err := o.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "failover: %v\n", err)
		return 2
	}
	return kit.Run("failover", &o.repo, &o.outDir, func(ctx context.Context) error { return benchmark(ctx, o) })
}

func (o *options) validate() error {
	var problems []string
	if o.products < partitions*10 {
		problems = append(problems, fmt.Sprintf("--products must be at least %d", partitions*10))
	}
	if o.rate < 1 || o.rate > 1_000_000 {
		problems = append(problems, "--rate must be from 1 to 1000000 events/s")
	}
	problems = append(problems, kit.OneOf("--scenarios", o.scenarios, scKill, scRolling, scScale)...)
	problems = append(problems, kit.OneOf("--systems", o.systems, sysSalesagg, sysReference)...)
	if o.groupProtocol != "classic" && o.groupProtocol != "streams" {
		problems = append(problems, "--group-protocol must be classic or streams")
	}
	if o.refRocksDB != "default" && o.refRocksDB != "tuned" {
		problems = append(problems, "--reference-rocksdb must be default or tuned")
	}
	if o.refProbingMs < 60000 {
		problems = append(problems, "--reference-probing-rebalance-interval-ms must be at least 60000 (Kafka Streams' minimum)")
	}
	if o.sessionTimeout < time.Second {
		problems = append(problems, "--session-timeout-ms must be at least 1000")
	}
	if o.commitInterval <= 0 {
		problems = append(problems, "--commit-interval-ms must be positive")
	}
	if o.timeout < 10*time.Second {
		problems = append(problems, "--timeout must be at least 10s")
	}
	if o.stopTimeout < time.Second {
		problems = append(problems, "--stop-timeout must be at least 1s")
	}
	if o.poll < 5*time.Millisecond || o.poll > 5*time.Second {
		problems = append(problems, "--poll must be from 5ms to 5s")
	}
	if o.steady < 0 {
		problems = append(problems, "--steady must not be negative")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\nfailover: "))
	}
	return nil
}

// logf logs a progress line of the benchmark to standard error.
func logf(format string, args ...any) { kit.NewLogf("failover")(format, args...) }
