package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// resetCmd runs `salesagg reset args...` with standard input from
// /dev/null (no terminal) and returns its output and exit code.
func resetCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"reset"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil && !errors.As(err, new(*exec.ExitError)) {
		t.Fatal(err)
	}
	t.Logf("salesagg reset %s: exit %d\n%s%s", strings.Join(args, " "), cmd.ProcessState.ExitCode(), stdout.String(), stderr.String())
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// topicsExist returns nil when every topic exists, else an error naming
// those that do not.
func topicsExist(adm *kadm.Client, topics ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	listed, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return err
	}
	for _, tp := range topics {
		if !listed.Has(tp) {
			return fmt.Errorf("topic %s does not exist", tp)
		}
	}
	return nil
}

// taskDirs lists the task stores (0_N) under stateDir/sales-aggregator.
func taskDirs(t *testing.T, stateDir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(stateDir, "sales-aggregator", "0_*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestResetReprocessesTheInputFromTheStart(t *testing.T) {
	// Scenario: the service has processed the sample events (and a few that went through the
	// repartition topic) on the dev broker. `salesagg reset` refuses while it runs, naming the
	// member; stopped, it refuses without --yes (no terminal), --dry-run changes nothing, and
	// --yes moves the input offsets to 0, deletes the changelog and repartition topics and wipes
	// the task stores. The next start restores 0 records and reprocesses the input: the same
	// totals, over HTTP and in the new changelog.
	work := t.TempDir()
	addr, stateDir := harness.FreeAddr(t), filepath.Join(work, "state")
	startBroker(t, filepath.Join(work, "broker"), addr)
	svc := startService(t, addr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	produceSample(t, addr)
	want := maps.Clone(harness.SampleTotals)
	manual := harness.NewClient(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := range 3 { // on another partition than product1's: forwarded
		harness.Produce(t, manual, &kgo.Record{Topic: "sales-events-v1", Key: []byte("product1"), Value: []byte(`{"product":"product1","value":5}`),
			Partition: (sales.Partition([]byte("product1"), 3) + 1 + int32(i%2)) % 3})
		want["product1"] += 5
	}
	svc.WaitTotals(t, want, 30*time.Second)
	internal := []string{changelogTopic, "sales-aggregator-PRODUCT_AGGREGATED_SALES-repartition"}
	adm := kadm.NewClient(harness.NewClient(t, addr))
	base := []string{"--application.id", "sales-aggregator", "--bootstrap.servers", addr, "--state.dir", stateDir}

	// Live: refused, naming the member; nothing changed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	groups, err := adm.DescribeGroups(ctx, "sales-aggregator")
	if err != nil || len(groups["sales-aggregator"].Members) != 1 || groups["sales-aggregator"].Members[0].InstanceID == nil {
		t.Fatalf("describing the group: %v %+v", err, groups)
	}
	member := *groups["sales-aggregator"].Members[0].InstanceID
	_, stderr, code := resetCmd(t, append(base, "--yes")...)
	if code != 1 || !strings.Contains(stderr, "refusing: group sales-aggregator has 1 active members") || !strings.Contains(stderr, member) {
		t.Errorf("reset of a live group: exit %d, %q; want 1, refusing and naming %s", code, stderr, member)
	}
	if err := topicsExist(adm, internal...); err != nil {
		t.Errorf("after the refused reset: %v", err)
	}

	svc.Terminate(t)
	_, stderr, code = resetCmd(t, base...)
	if code != exitUsage || !strings.Contains(stderr, "refusing without --yes: standard input is not a terminal") {
		t.Errorf("reset without --yes nor a terminal: exit %d, %q; want 2 and the refusal", code, stderr)
	}
	stdout, _, code := resetCmd(t, append(base, "--dry-run")...)
	for _, w := range append(internal, "sales-events-v1 partition 0: ", " -> 0\n", "task stores 0_0, 0_1, 0_2", "Dry run: nothing was changed.") {
		if !strings.Contains(stdout, w) {
			t.Errorf("the dry run's plan lacks %q", w)
		}
	}
	if err := topicsExist(adm, internal...); code != 0 || err != nil || len(taskDirs(t, stateDir)) != 3 {
		t.Errorf("dry run: exit %d, %v, %d task stores: want 0, nothing changed", code, err, len(taskDirs(t, stateDir)))
	}

	stdout, _, code = resetCmd(t, append(base, "--yes")...)
	if code != 0 || !strings.Contains(stdout, "Done: ") {
		t.Fatalf("reset --yes: exit %d, want 0 and Done", code)
	}
	for _, tp := range internal {
		if topicsExist(adm, tp) == nil {
			t.Errorf("topic %s still exists after the reset", tp)
		}
	}
	if d := taskDirs(t, stateDir); len(d) != 0 {
		t.Errorf("task stores left after the reset: %v", d)
	}
	offsets, err := adm.FetchOffsets(ctx, "sales-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	offsets.Each(func(o kadm.OffsetResponse) {
		if o.Topic != "sales-events-v1" || o.At != 0 {
			t.Errorf("committed offset after the reset: %s partition %d at %d, want only sales-events-v1 at 0", o.Topic, o.Partition, o.At)
		}
	})

	again := startService(t, addr, stateDir, nil)
	if sum := again.WaitRestored(t, 60*time.Second); sum.Total != 0 {
		t.Errorf("the start after the reset restored %d records (%v), want 0", sum.Total, sum.Partitions)
	}
	again.WaitTotals(t, want, 30*time.Second)
	harness.WaitFor(t, 30*time.Second, "the 103 events reprocessed, once", func() error {
		c, err := again.Counters()
		if err == nil && c.Processed != 103 {
			err = fmt.Errorf("processed %d", c.Processed)
		}
		return err
	})
	harness.WaitFor(t, 30*time.Second, "the new changelog to hold the totals", func() error { return harness.CheckChangelog(addr, changelogTopic, want) })
}

func TestResetUsage(t *testing.T) {
	// Scenario: reset with no application id, two targets and a bad time: exit 2 naming each
	// problem, before any connection.
	_, stderr, code := resetCmd(t, "--to-latest", "--to-datetime", "yesterday", "--bootstrap.servers", "127.0.0.1:1")
	for _, w := range []string{"--application.id is required", "give at most one", `--to-datetime = "yesterday": not an RFC 3339 time`} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q", w)
		}
	}
	if code != exitUsage {
		t.Errorf("exit %d, want %d", code, exitUsage)
	}
}
