package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// binary is the salesagg binary built once for these tests.
var binary string

// changelogTopic is the changelog of the default application id.
var changelogTopic = sales.ChangelogTopic("sales-aggregator", sales.StoreName)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "salesagg-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "salesagg")
	// The test build: -tags salesaggtest carries the crash-point hook
	// (crashpoint_testbuild.go), which a release build has not.
	flags := []string{"-race", "-tags", "salesaggtest"}
	if os.Getenv("SALESAGGTEST_NORACE") != "" {
		flags = flags[1:]
	}
	root, err := harness.RepoRoot()
	if err == nil {
		var out []byte
		if out, err = harness.Build(root, binary, flags...); err != nil {
			err = fmt.Errorf("%w\n%s", err, out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// startProc starts the salesagg binary with args and extra environment.
func startProc(t *testing.T, env []string, args ...string) *harness.Proc {
	t.Helper()
	return harness.Start(t, harness.Spec{Name: "salesagg", Path: binary, Args: args, Env: env})
}

// startService runs "salesagg run" against broker with its state in
// stateDir, committing every 100 ms; extra flags come last.
func startService(t *testing.T, broker, stateDir string, env []string, extra ...string) *harness.Service {
	t.Helper()
	return harness.StartService(t, harness.ServiceConfig{Bin: binary, Broker: broker, StateDir: stateDir, CommitMs: 100, Env: env, Flags: extra})
}

// startBroker runs "salesagg broker" on addr persisting to dataDir.
func startBroker(t *testing.T, dataDir, addr string) *harness.Proc {
	t.Helper()
	return harness.StartDevBroker(t, binary, dataDir, addr)
}

// kfakeCluster starts an in-process broker whose groups allow sessions down
// to 1 s, with the input topic on partitions partitions, and returns its
// address. It closes when the test ends, after the processes and clients
// (its cleanup is registered first).
func kfakeCluster(t *testing.T, partitions int32) string {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	broker := cluster.ListenAddrs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(harness.NewClient(t, broker)).CreateTopic(ctx, partitions, 1, nil, "sales-events-v1")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	return broker
}

// changelogTotals reads the latest committed total per product from the
// changelog, and the number of records.
func changelogTotals(t *testing.T, broker string) (map[string]int64, int) {
	t.Helper()
	got, n, err := harness.ReadTotals(broker, changelogTopic)
	if err != nil {
		t.Fatal(err)
	}
	return got, n
}

// notifications reads the committed notification values per product, in
// order.
func notifications(t *testing.T, broker string) map[string][]int64 {
	t.Helper()
	got, err := harness.ReadNotifications(broker, "notifications-events-v1")
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// produceSample runs `salesagg produce` of sample_events.txt to broker and
// returns what it said.
func produceSample(t *testing.T, broker string) string {
	t.Helper()
	out, err := exec.Command(binary, "produce", "--file", filepath.Join("..", "..", "sample_events.txt"), "--bootstrap.servers", broker).CombinedOutput()
	if err != nil {
		t.Fatalf("produce: %v: %s", err, out)
	}
	return string(out)
}

// TestStreamsProtocolOnABrokerWithout: group.protocol streams against a broker without streams
// groups (the dev broker, kfake) is not ready, and /readyz and the log say why and what to use
// instead, rather than waiting for a coordinator that never answers.
func TestStreamsProtocolOnABrokerWithout(t *testing.T) {
	broker := kfakeCluster(t, 3)
	svc := startService(t, broker, t.TempDir(), nil, "--group.protocol", "streams", "--processing.guarantee", "at_least_once")
	harness.WaitFor(t, 30*time.Second, "/readyz to say the brokers have no streams groups", func() error {
		code, body, _, err := svc.Get("/readyz")
		if err != nil {
			return err
		}
		if code == 200 || !strings.Contains(string(body), "do not speak the streams group protocol") || !strings.Contains(string(body), "use group.protocol classic") {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})
	svc.Terminate(t)
}
