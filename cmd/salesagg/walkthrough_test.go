package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

func TestSecondProcessOnStateDirFails(t *testing.T) {
	// Scenario: a second service on the same state dir fails at start naming the lock file and the holder.
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, "", brokerAddr)
	first := startService(t, brokerAddr, work, nil)
	first.WaitReady(t, 60*time.Second)
	second := startService(t, brokerAddr, work, nil)
	if !second.WaitExit(30 * time.Second) {
		t.Fatal("second process did not fail")
	}
	if second.ExitCode() != exitError {
		t.Fatalf("second process: %s", second.DescribeExit())
	}
	msg := second.Stderr()
	for _, want := range []string{filepath.Join(work, "sales-aggregator", ".lock"), "pid=", "host="} {
		if !strings.Contains(msg, want) {
			t.Fatalf("error lacks %q: %s", want, msg)
		}
	}
	first.Terminate(t)
}

func TestBadConfigFailsAtStart(t *testing.T) {
	// Scenario: a bad value fails the start with exit code 2, naming key, value and what is allowed.
	p := startProc(t, []string{"SALESAGG_NOTIFICATION_THRESHOLD=high"}, "run", "--processing.guarantee", "sometimes", "--http.addr", harness.FreeAddr(t))
	<-p.Done()
	if p.ExitCode() != exitUsage {
		t.Fatalf("exit: %s", p.DescribeExit())
	}
	if !strings.Contains(p.Stderr(), `notification.threshold = "high"`) {
		t.Fatalf("output: %s", p.Stderr())
	}
	p = startProc(t, nil, "run", "--processing.guarantee", "sometimes", "--http.addr", harness.FreeAddr(t))
	<-p.Done()
	if !strings.Contains(p.Stderr(), `processing.guarantee = "sometimes": allowed: exactly_once_v2, at_least_once`) {
		t.Fatalf("output: %s", p.Stderr())
	}
}

func TestProduceRejectsLinesWithoutSeparator(t *testing.T) {
	// Scenario: a produce file with a line lacking "key:" sends nothing and names the line.
	f := filepath.Join(t.TempDir(), "events.txt")
	if err := os.WriteFile(f, []byte("p1:{\"value\":1}\n\nno separator here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary, "produce", "--file", f, "--bootstrap.servers", "127.0.0.1:1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "line 3: no ':' between key and value") {
		t.Fatalf("produce: %v: %s", err, out)
	}
}
