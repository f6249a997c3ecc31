//go:build e2e

package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
