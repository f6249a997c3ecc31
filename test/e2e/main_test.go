//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
	// kafkaDir is the KAFKA_DIR of the broker this run started; empty when
	// the broker came from KAFKA_BOOTSTRAP_SERVERS.
	kafkaDir string
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
	root, err := filepath.Abs(filepath.Join("..", ".."))
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
	build := exec.Command("go", "build", "-tags", "salesaggtest", "-o", binPath, "./cmd/salesagg") // the crash-point hook is test-build only
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building salesagg: %v\n%s", err, out)
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

	kafkaDir = filepath.Join(tmp, "kafka")
	// The watchdog takes the broker down if this process dies without
	// doing it (a panic, the -timeout alarm, a signal): kafka.sh starts the
	// broker in its own session, so nothing else would stop it.
	watchdog, err := startWatchdog(tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the broker watchdog:", err)
		return 1
	}
	defer func() {
		_ = watchdog.Process.Kill()
		_ = watchdog.Wait()
	}()
	defer func() {
		if out, err := kafkaCommand(2*time.Minute, "down"); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: kafka.sh down: %v\n%s", err, out)
		}
	}()
	t0 = time.Now()
	out, err := kafkaCommand(5*time.Minute, "up")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: kafka.sh up: %v\n%s", err, out)
		return 1
	}
	bootstrap = lastLine(out)
	fmt.Fprintf(os.Stderr, "e2e: broker up at %s in %s (KAFKA_DIR=%s)\n", bootstrap, time.Since(t0).Round(time.Millisecond), kafkaDir)
	return m.Run()
}

// kafkaScript is test/kafka/kafka.sh.
func kafkaScript() string { return filepath.Join(repoRoot, "test", "kafka", "kafka.sh") }

// kafkaCommand runs kafka.sh with KAFKA_DIR set to this run's broker dir. It
// returns stdout on success, stdout and stderr on failure.
func kafkaCommand(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, kafkaScript(), args...)
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+kafkaDir)
	// kafka.sh kills the broker it started if it is itself stopped while
	// waiting for readiness; SIGTERM lets it do so.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// startWatchdog starts a shell in its own session that waits for this
// process to end, then runs `kafka.sh down` and removes dir. In a normal run
// TestMain takes the broker down itself and kills the watchdog.
func startWatchdog(dir string) (*exec.Cmd, error) {
	script := `while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" down; rm -rf "$3"`
	cmd := exec.Command("bash", "-c", script, "e2e-watchdog", strconv.Itoa(os.Getpid()), kafkaScript(), dir)
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+kafkaDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// requireOwnBroker skips a test that must stop and start the broker when the
// broker came from KAFKA_BOOTSTRAP_SERVERS.
func requireOwnBroker(t *testing.T) {
	t.Helper()
	if kafkaDir == "" {
		t.Skipf("the broker at %s comes from KAFKA_BOOTSTRAP_SERVERS: this test restarts the broker, which it can only do for one it started itself with test/kafka/kafka.sh", bootstrap)
	}
}
