package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/salesagg/salesagg/test/harness"
)

func TestResetReadsTheConfigAndCleansUpWithoutGroup(t *testing.T) {
	// Scenario: an application whose input is orders-v2 (set in its config file and in
	// SALESAGG_INPUT_TOPIC) ran and stopped. reset plans orders-v2, from the file and from the
	// environment, never sales-events-v1. Then its group is deleted: reset says it found no group,
	// and with --yes still deletes the internal topics and wipes the local state, exit 0.
	work := t.TempDir()
	addr, stateDir := harness.FreeAddr(t), filepath.Join(work, "state")
	startBroker(t, filepath.Join(work, "broker"), addr)
	harness.CreateTopic(t, addr, "orders-v2", 3, nil)
	svc := startService(t, addr, stateDir, []string{"SALESAGG_INPUT_TOPIC=orders-v2"})
	svc.WaitReady(t, 60*time.Second)
	svc.Terminate(t)
	file := filepath.Join(work, "salesagg.yaml")
	if err := os.WriteFile(file, []byte("input.topic: orders-v2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"reset", "--application.id", "sales-aggregator", "--bootstrap.servers", addr, "--state.dir", stateDir}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"file", nil, []string{"--config", file}},
		{"env", []string{"SALESAGG_INPUT_TOPIC=orders-v2"}, nil},
	} {
		code, stdout, stderr := runBinary(t, tc.env, append(append(base, tc.args...), "--dry-run")...)
		if code != 0 || !strings.Contains(stdout, "orders-v2 partition 0: ") || strings.Contains(stdout, "sales-events-v1") {
			t.Errorf("%s: reset --dry-run: exit %d, want 0 and a plan of orders-v2 only:\n%s%s", tc.name, code, stdout, stderr)
		}
	}

	adm := kadm.NewClient(harness.NewClient(t, addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	harness.WaitFor(t, 30*time.Second, "the group deleted", func() error {
		resp, err := adm.DeleteGroup(ctx, "sales-aggregator")
		if err == nil {
			err = resp.Err
		}
		return err
	})
	internal := []string{changelogTopic, "sales-aggregator-PRODUCT_AGGREGATED_SALES-repartition"}
	code, stdout, stderr := runBinary(t, []string{"SALESAGG_INPUT_TOPIC=orders-v2"}, append(base, "--yes")...)
	if code != 0 || !strings.Contains(stdout, "group sales-aggregator does not exist") || !strings.Contains(stdout, "Done") {
		t.Fatalf("reset --yes of an app without a group: exit %d, want 0, saying there is no group:\n%s%s", code, stdout, stderr)
	}
	for _, name := range topicNames(t, addr) {
		if slices.Contains(internal, name) {
			t.Errorf("internal topic %s left", name)
		}
	}
	if d := taskDirs(t, stateDir); len(d) != 0 {
		t.Errorf("task stores left: %v", d)
	}
}
