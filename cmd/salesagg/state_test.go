package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/test/harness"
)

func TestStateVerifyAndReset(t *testing.T) {
	// Scenario: after a run of the sample events, `state verify` finds every task's store equal to
	// its changelog (exit 0). A store tampered with (a wrong total, a lost product, a product the
	// changelog never had) is reported key by key (exit 1). `state reset --task` refuses while the
	// service runs, then wipes that task's store; the next start restores that task only, from the
	// changelog, and verify is clean again with the same totals.
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	stateDir := filepath.Join(work, "state")
	svc := startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	produceSample(t, brokerAddr)
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)

	// While the service runs, both refuse: the state dir is locked.
	for _, args := range [][]string{
		{"state", "verify", "--state.dir", stateDir, "--bootstrap.servers", brokerAddr},
		{"state", "reset", "--state.dir", stateDir, "--task", "0_1"},
	} {
		code, _, stderr := runBinary(t, nil, args...)
		if code != exitError || !strings.Contains(stderr, "refusing while the service runs") || !strings.Contains(stderr, "is held by pid=") {
			t.Fatalf("%v while the service runs: exit %d, %s", args, code, stderr)
		}
	}
	svc.Terminate(t)

	verify := func() (int, string) {
		code, stdout, stderr := runBinary(t, nil, "state", "verify", "--state.dir", stateDir, "--bootstrap.servers", brokerAddr)
		return code, stdout + stderr
	}
	if code, out := verify(); code != 0 || !strings.Contains(out, "all 3 tasks match their changelog") || strings.Count(out, "  OK: ") != 3 {
		t.Fatalf("verify after a clean stop: exit %d\n%s", code, out)
	}

	// Tamper with task 0_0's store, keeping its checkpoint.
	dir, err := state.OpenDir(stateDir, "sales-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	s, err := state.Open(dir.TaskPath(0), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	totals, err := s.Scan("", 100)
	if err != nil || len(totals) < 2 {
		t.Fatalf("task 0_0 holds %v, %v", totals, err)
	}
	cp, _, err := s.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	wrong, lost := totals[0], totals[1]
	if err := s.Apply([]state.Update{
		{Product: wrong.Product, Entry: state.Entry{Total: wrong.Total + 1}},
		{Product: lost.Product, Delete: true},
		{Product: "product-never-sold", Entry: state.Entry{Total: 5}},
	}, cp); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	_ = dir.Close()
	code, out := verify()
	if code != exitError {
		t.Fatalf("verify of a tampered store: exit %d, want 1\n%s", code, out)
	}
	for _, want := range []string{
		"1 of 3 tasks differ from the changelog",
		`DIFFERS "` + wrong.Product + `": store `,
		`DIFFERS "` + lost.Product + `": not in the store, changelog `,
		`DIFFERS "product-never-sold": store 5, changelog no record below the checkpoint`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "DIFFERS") != 3 || strings.Count(out, "  OK: ") != 2 {
		t.Errorf("want 3 differences in one task, 2 tasks OK:\n%s", out)
	}

	// Reset the tampered task: only its store goes.
	code, stdout, stderr := runBinary(t, nil, "state", "reset", "--state.dir", stateDir, "--task", "0_0", "--yes")
	if code != 0 || !strings.Contains(stdout, "task 0_0: store removed") {
		t.Fatalf("reset: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "sales-aggregator", "0_0")); !os.IsNotExist(err) {
		t.Fatalf("task 0_0's store is still there: %v", err)
	}
	for _, task := range []string{"0_1", "0_2"} {
		if _, err := os.Stat(filepath.Join(stateDir, "sales-aggregator", task)); err != nil {
			t.Fatalf("task %s's store is gone: %v", task, err)
		}
	}
	if code, _, stderr := runBinary(t, nil, "state", "reset", "--state.dir", stateDir, "--task", "0_7"); code != exitError || !strings.Contains(stderr, "no task 0_7") {
		t.Fatalf("reset of a task that is not there: exit %d %s", code, stderr)
	}

	svc = startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	if lines := svc.LogsWith("did not find checkpoint offset"); len(lines) != 1 || lines[0]["task"] != "0_0" {
		t.Fatalf("after the reset, want task 0_0 alone restored from the start: %v", lines)
	}
	svc.Terminate(t)
	if code, out := verify(); code != 0 {
		t.Fatalf("verify after the reset and a restore: exit %d\n%s", code, out)
	}
}

// stateDirWithTask creates the state dir of application app under root with
// an empty store for task 0_0, as a stopped service leaves it.
func stateDirWithTask(t *testing.T, root, app string) {
	t.Helper()
	dir, err := state.OpenDir(root, app)
	if err != nil {
		t.Fatal(err)
	}
	s, err := state.Open(dir.TaskPath(0), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	_ = dir.Close()
}

func TestStateCommandsTakeTheConfig(t *testing.T) {
	// Scenario: the state commands take --state.dir and --application.id like run, or read them from
	// --config or SALESAGG_*; the old --state-dir still works but is not in the help.
	root := t.TempDir()
	stateDirWithTask(t, root, "myapp")
	want := "state dir:  " + filepath.Join(root, "myapp")
	for name, tc := range map[string]struct {
		env  []string
		args []string
	}{
		"flags":  {args: []string{"--state.dir", root, "--application.id", "myapp"}},
		"config": {args: []string{"--config", configFile(t, "state:\n  dir: "+root+"\napplication: {id: myapp}\n")}},
		"env":    {env: []string{"SALESAGG_STATE_DIR=" + root, "SALESAGG_APPLICATION_ID=myapp"}},
		"alias":  {args: []string{"--state-dir", root, "--application.id", "myapp"}},
	} {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runBinary(t, tc.env, append([]string{"state", "inspect"}, tc.args...)...)
			if code != 0 || !strings.Contains(stdout, want) || !strings.Contains(stdout, "0_0") {
				t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
			}
			code, _, stderr = runBinary(t, tc.env, append([]string{"state", "reset", "--task", "0_7"}, tc.args...)...)
			if code != exitError || !strings.Contains(stderr, "no task 0_7") {
				t.Fatalf("reset of a task not there: exit %d, %s", code, stderr)
			}
		})
	}
	_, stdout, _ := runBinary(t, nil, "state", "inspect", "--help")
	if !strings.Contains(stdout, "--state.dir string") || !strings.Contains(stdout, "(default /tmp/salesagg)") || strings.Contains(stdout, "state-dir") {
		t.Errorf("state inspect --help:\n%s", stdout)
	}
	code, _, stderr := runBinary(t, nil, "state", "inspect", "--state.dri", root)
	if code != exitUsage || !strings.Contains(stderr, "unknown flag --state.dri: did you mean --state.dir?") {
		t.Errorf("a typo: exit %d, %s", code, stderr)
	}
}

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
