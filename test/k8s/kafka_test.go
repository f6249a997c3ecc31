//go:build e2e

package k8s

import (
	"bytes"
	"context"
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

// startKafka returns the bootstrap address of a broker for the test:
// KAFKA_BOOTSTRAP_SERVERS when set (external: true), else a single-node
// Apache Kafka that test/kafka/kafka.sh starts on loopback with its data
// under dir, taken down (`kafka.sh down`) when the test ends, and by a
// watchdog if this process dies first.
func startKafka(t *testing.T, root, dir string) (addr string, external bool) {
	t.Helper()
	if addr := strings.TrimSpace(os.Getenv("KAFKA_BOOTSTRAP_SERVERS")); addr != "" {
		t.Logf("using the broker at %s (KAFKA_BOOTSTRAP_SERVERS)", addr)
		return addr, true
	}
	script := filepath.Join(root, "test", "kafka", "kafka.sh")
	kafkaDir := filepath.Join(dir, "kafka")
	run := func(timeout time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, script, args...)
		cmd.Env = append(os.Environ(), "KAFKA_DIR="+kafkaDir)
		// kafka.sh stops the broker it is starting when it gets SIGTERM.
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 30 * time.Second
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return stdout.String() + stderr.String(), err
		}
		return stdout.String(), nil
	}
	// kafka.sh runs the broker in its own session: if this process dies
	// (a panic, the -timeout alarm), the watchdog takes it down.
	wd := exec.Command("bash", "-c", `while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" down`,
		"k8s-rehearsal-watchdog", strconv.Itoa(os.Getpid()), script)
	wd.Env = append(os.Environ(), "KAFKA_DIR="+kafkaDir)
	wd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := wd.Start(); err != nil {
		t.Fatalf("starting the broker watchdog: %v", err)
	}
	t.Cleanup(func() {
		if out, err := run(2*time.Minute, "down"); err != nil {
			t.Errorf("kafka.sh down: %v\n%s", err, out)
		}
		_ = wd.Process.Kill()
		_ = wd.Wait()
	})
	t0 := time.Now()
	out, err := run(5*time.Minute, "up")
	if err != nil {
		t.Fatalf("kafka.sh up: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	addr = strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("kafka.sh up printed %q last, want 127.0.0.1:PORT", addr)
	}
	t.Logf("Apache Kafka up at %s in %s (KAFKA_DIR=%s)", addr, time.Since(t0).Round(time.Millisecond), kafkaDir)
	return addr, false
}

// buildSalesagg builds cmd/salesagg into dir, or copies the binary
// K8S_REHEARSAL_BIN names there (one built beforehand).
func buildSalesagg(t *testing.T, root, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "salesagg")
	if prebuilt := os.Getenv("K8S_REHEARSAL_BIN"); prebuilt != "" {
		b, err := os.ReadFile(prebuilt)
		if err == nil {
			err = os.WriteFile(bin, b, 0o755)
		}
		if err != nil {
			t.Fatalf("K8S_REHEARSAL_BIN: %v", err)
		}
		t.Logf("using %s (K8S_REHEARSAL_BIN)", prebuilt)
		return bin
	}
	t0 := time.Now()
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/salesagg")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building salesagg: %v\n%s", err, out)
	}
	t.Logf("built %s in %s", bin, time.Since(t0).Round(time.Millisecond))
	return bin
}

func summarize(diffs []string) error {
	if len(diffs) == 0 {
		return nil
	}
	more := ""
	if len(diffs) > 5 {
		more = fmt.Sprintf(" (and %d more)", len(diffs)-5)
		diffs = diffs[:5]
	}
	return fmt.Errorf("%s%s", strings.Join(diffs, "; "), more)
}
