package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

func TestNewUserWalkthroughWithDevBroker(t *testing.T) {
	// Scenario: as the README tells a new user: start the dev broker, run the service, produce the
	// sample file, read totals over HTTP, restart (0 restored), restart the broker, wipe the state
	// (full restore), with the same totals every time.
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	b := startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	stateDir := filepath.Join(work, "state")

	svc := startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	if out := produceSample(t, brokerAddr); !strings.Contains(out, "sent 100 records to sales-events-v1") {
		t.Fatalf("produce said: %s", out)
	}
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	code, body, _, _ := svc.Get("/v1/products?limit=4")
	var page struct {
		Products []struct {
			Product string
			Total   int64
		}
		Next string
	}
	if err := json.Unmarshal(body, &page); err != nil || code != 200 || len(page.Products) != 4 || page.Next != "product3" {
		t.Fatalf("GET /v1/products?limit=4 = %d %s", code, body)
	}
	if code, body, _, _ := svc.Get("/v1/products/nope"); code != 404 {
		t.Fatalf("unknown product: %d %s", code, body)
	}
	if code, body, _, _ := svc.Get("/v1/tasks"); code != 200 || strings.Count(string(body), `"state":"running"`) != 3 {
		t.Fatalf("GET /v1/tasks = %d %s", code, body)
	}
	svc.Terminate(t)

	// The broker restarts with its data; the service restores nothing.
	b.Terminate(t)
	b = startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	svc = startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	if sum := svc.RestoredTasks(t, 3); sum.Total != 0 || sum.Lines != 3 {
		t.Fatalf("restart restored %d records over %d tasks, want 0 over 3", sum.Total, sum.Lines)
	}
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	svc.Terminate(t)

	// Offline inspection sees three tasks holding the ten products.
	out, err := exec.Command(binary, "state", "inspect", "--state-dir", stateDir, "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("state inspect: %v: %s", err, out)
	}
	var view struct {
		Tasks []struct {
			Task        string
			Products    int64
			SumOfTotals int64 `json:"sum_of_totals"`
		}
	}
	if err := json.Unmarshal(out, &view); err != nil {
		t.Fatalf("state inspect output: %v: %s", err, out)
	}
	var products, sum int64
	for _, tv := range view.Tasks {
		products += tv.Products
		sum += tv.SumOfTotals
	}
	if len(view.Tasks) != 3 || products != 10 || sum != 83450 {
		t.Fatalf("state inspect: %d tasks, %d products, sum %d; want 3, 10, 83450: %s", len(view.Tasks), products, sum, out)
	}

	// Lose the volume: the full changelog is restored.
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	svc = startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	if n := svc.RestoredTasks(t, 3).Total; n < 10 {
		t.Fatalf("restore after wipe: %d records, want at least one per product (10)", n)
	}
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	svc.Terminate(t)
	b.Terminate(t)
}

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
