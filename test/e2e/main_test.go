//go:build e2e

package e2e

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// Set up by TestMain.
var (
	// repoRoot is the module root, two levels above this directory.
	repoRoot string
	// binPath is the salesagg binary built for this run.
	binPath string
	// bootstrap is the broker address, 127.0.0.1:PORT (or whatever
	// KAFKA_BOOTSTRAP_SERVERS says).
	bootstrap string
	// kafka is the broker this run started (test/kafka/kafka.sh); its Dir
	// is empty when the broker came from KAFKA_BOOTSTRAP_SERVERS.
	kafka harness.Kafka
	// runHelp is the output of `salesagg run --help`.
	runHelp string
)

// runSupports reports whether `salesagg run` has the flag --name.
func runSupports(name string) bool { return strings.Contains(runHelp, "--"+name+" ") }

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	root, err := harness.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	repoRoot = root
	tmp, err := os.MkdirTemp("", "salesagg-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(tmp) // runs last: after the broker is down

	binPath = filepath.Join(tmp, "salesagg")
	t0 := time.Now()
	// The crash-point hook is test-build only.
	if out, err := harness.Build(repoRoot, binPath, "-tags", "salesaggtest"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n%s", err, out)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: built %s in %s\n", binPath, time.Since(t0).Round(time.Millisecond))
	help, _ := exec.Command(binPath, "run", "--help").CombinedOutput()
	runHelp = string(help)

	if addr := strings.TrimSpace(os.Getenv("KAFKA_BOOTSTRAP_SERVERS")); addr != "" {
		bootstrap = addr
		fmt.Fprintf(os.Stderr, "e2e: using the broker at %s (KAFKA_BOOTSTRAP_SERVERS)\n", bootstrap)
		return m.Run()
	}

	kafka = harness.NewKafka(repoRoot, filepath.Join(tmp, "kafka"))
	// The watchdog takes the broker down (and removes tmp) if this process
	// dies without doing it.
	watchdog, err := kafka.Watchdog("e2e-watchdog", tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer func() {
		_ = watchdog.Process.Kill()
		_ = watchdog.Wait()
	}()
	defer func() {
		if out, err := kafka.Run(2*time.Minute, "down"); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: kafka.sh down: %v\n%s", err, out)
		}
	}()
	t0 = time.Now()
	bootstrap, err = kafka.Up(5 * time.Minute)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: broker up at %s in %s (KAFKA_DIR=%s)\n", bootstrap, time.Since(t0).Round(time.Millisecond), kafka.Dir)
	return m.Run()
}

// requireOwnBroker skips a test that must stop and start the broker when the
// broker came from KAFKA_BOOTSTRAP_SERVERS.
func requireOwnBroker(t *testing.T) {
	t.Helper()
	if kafka.Dir == "" {
		t.Skipf("the broker at %s comes from KAFKA_BOOTSTRAP_SERVERS: this test restarts the broker, which it can only do for one it started itself with test/kafka/kafka.sh", bootstrap)
	}
}

// The test/harness helpers, on this run's binary and broker.

// startService starts `salesagg run` (this run's binary, in the repository
// root) against the broker, with JSON logs, on a free loopback port. Each
// test's input topic is new: the service creates it (topics.input.create;
// a flag of cfg.Flags wins). It does not wait for anything.
func startService(t *testing.T, cfg harness.ServiceConfig) *harness.Service {
	t.Helper()
	cfg.Bin, cfg.Broker, cfg.Dir = binPath, bootstrap, repoRoot
	cfg.Flags = append([]string{"--topics.input.create"}, cfg.Flags...)
	return harness.StartService(t, cfg)
}

// newClient returns a franz-go client for the broker, closed when the test
// ends.
func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return harness.NewClient(t, bootstrap, opts...)
}

// createTopic creates topic with partitions and configs (replication 1).
func createTopic(t *testing.T, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	harness.CreateTopic(t, bootstrap, topic, partitions, configs)
}

// readTopic reads the committed records of topic (harness.ReadTopic).
func readTopic(topic string, timeout time.Duration) (harness.TopicContent, error) {
	return harness.ReadTopic(bootstrap, topic, timeout)
}

// checkChangelog returns nil when the changelog's latest committed totals
// equal want exactly.
func checkChangelog(topic string, want map[string]int64) error {
	return harness.CheckChangelog(bootstrap, topic, want)
}

// testNames returns an application id and input and notification topics
// unique to this test and this run, so that tests (and reruns against a
// long-lived broker) never share a topic or a consumer group.
func testNames(short string) (appID, input, notif string) {
	appID = fmt.Sprintf("e2e-%s-%s-%04d", short, time.Now().Format("150405"), rand.IntN(10000))
	return appID, appID + "-sales", appID + "-notifications"
}

// slug is a guarantee's short name in application ids.
func slug(guarantee string) string {
	return map[string]string{"exactly_once_v2": "eos", "at_least_once": "alos"}[guarantee]
}

// sampleRecords returns the records of sample_events.txt for topic, read
// as kafka-console-producer with parse.key=true does: the key ends at the
// first ':'.
func sampleRecords(t *testing.T, topic string) []*kgo.Record {
	t.Helper()
	path := filepath.Join(repoRoot, "sample_events.txt")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*kgo.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("%s: line without ':': %q", path, line)
		}
		out = append(out, &kgo.Record{Topic: topic, Key: []byte(k), Value: []byte(v)})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// begin opens a scenario: names unique to this test (testNames(short)), its
// input topic created with harness.ScalePartitions partitions (tasks
// 0_0..0_2), and a random source on stream seeded from the clock, the seed
// logged.
func begin(t *testing.T, short string, stream uint64) (rng *rand.Rand, appID, input, notif string) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	appID, input, notif = testNames(short)
	createTopic(t, input, harness.ScalePartitions, nil)
	return rand.New(rand.NewPCG(seed, stream)), appID, input, notif
}
