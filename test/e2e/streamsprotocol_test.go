//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/test/harness"
)

// TestSeveralInstancesOneStreamsGroup: harness.SeveralInstancesOneGroup (1 → 3 → 2 → 3: a
// SIGTERM for good, one added, a SIGKILL and a restart on the same state dir, while events
// flow) with group.protocol streams: the members form a KIP-1071 streams group whose
// coordinator assigns the tasks. No two instances ever run one task, every instance answers
// every product with its exact total from its owner, and the changelog holds the same totals.
func TestSeveralInstancesOneStreamsGroup(t *testing.T) {
	harness.EachGuarantee(t, func(t *testing.T, g string) {
		severalInstancesOneGroup(t, "sgscale-"+slug(g), 0x73677363, "sg", "--processing.guarantee", g, "--group.protocol", "streams")
	})
}

// streamsGroupsClass is kafka-streams-groups.sh's class in the kafka-tools jar.
const streamsGroupsClass = "org.apache.kafka.tools.streams.StreamsGroupCommand"

// TestStreamsGroupDescribedByKafkaTools: two instances with group.protocol streams split the
// three tasks, and kafka-streams-groups.sh (Kafka 4.4's StreamsGroupCommand from the Maven jars)
// describes the group: both members, each under its state dir's process id as member and
// process id, with the active tasks it runs by its own /v1/tasks; each instance's /v1/instances
// lists the same members with their member ids and epochs (StreamsGroupDescribe); and the group's
// lag is 0 once every event is folded and committed.
func TestStreamsGroupDescribedByKafkaTools(t *testing.T) {
	jars := kafkaJars(t)
	rng, appID, input, notif := begin(t, "sgtools", 0x7367746f)
	events := harness.GenEvents(rng, "sgt", 30, 900)
	work := t.TempDir()
	fl := harness.NewFleet(func(dir string) *harness.Service {
		return startService(t, harness.ServiceConfig{AppID: appID, StateDir: dir, Input: input, Notif: notif, CommitMs: 200,
			Flags: []string{"--processing.guarantee", "at_least_once", "--group.protocol", "streams"}})
	})
	a := fl.Start("A", filepath.Join(work, "a"))
	b := fl.Start("B", filepath.Join(work, "b"))
	members := []*harness.Member{a, b}
	harness.WaitFor(t, 90*time.Second, "A and B to run the 3 tasks between them", func() error {
		if err := harness.RunEach(members, false, 3); err != nil {
			return err
		}
		for _, m := range members {
			if ts := running(t, m); len(ts) == 0 {
				return fmt.Errorf("%s runs no task", m.Name)
			}
		}
		return nil
	})
	harness.Produce(t, newClient(t), recordsOf(input, events)...)
	want := harness.TotalsOf(events)
	harness.WaitFor(t, 90*time.Second, "every total exact from both instances", func() error {
		return harness.ServedByOwner(members, want, 3)
	})

	describe := func(args ...string) string {
		return runTool(t, jars, streamsGroupsClass, append([]string{"--bootstrap-server", bootstrap, "--describe", "--group", appID}, args...)...)
	}
	out := describe("--members")
	t.Logf("kafka-streams-groups --describe --members:\n%s", out)
	for _, m := range members {
		pid := processID(t, m.Dir, appID)
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, pid) {
				line = l
			}
		}
		if line == "" {
			t.Fatalf("no member with %s's process id %s in:\n%s", m.Name, pid, out)
		}
		// ASSIGNMENTS reads "ACTIVE: 0:[0,1];": subtopology 0, partitions 0 and 1.
		var described []string
		if i := strings.Index(line, "ACTIVE: 0:["); i >= 0 {
			list := line[i+len("ACTIVE: 0:["):]
			list = list[:strings.Index(list, "]")]
			for _, p := range strings.Split(list, ",") {
				described = append(described, "0_"+strings.TrimSpace(p))
			}
		}
		runs := running(t, m)
		slices.Sort(described)
		slices.Sort(runs)
		if !slices.Equal(described, runs) {
			t.Errorf("%s runs %v; the tool describes its member with %v: %s", m.Name, runs, described, line)
		}
	}
	// /v1/instances reads the same group: each instance lists both members under their member
	// ids (their process ids) with their epochs and the tasks they run.
	harness.WaitFor(t, 30*time.Second, "/v1/instances on each instance to describe both members", func() error {
		for _, asker := range members {
			var body struct {
				Instances []struct {
					Member      string   `json:"member"`
					MemberEpoch int32    `json:"member_epoch"`
					Tasks       []string `json:"tasks"`
				} `json:"instances"`
			}
			if _, err := asker.GetJSON("/v1/instances", &body); err != nil {
				return err
			}
			for _, m := range members {
				pid := processID(t, m.Dir, appID)
				found := false
				for _, is := range body.Instances {
					runs := running(t, m)
					slices.Sort(runs)
					slices.Sort(is.Tasks)
					if is.Member == pid && is.MemberEpoch > 0 && slices.Equal(is.Tasks, runs) {
						found = true
					}
				}
				if !found {
					return fmt.Errorf("%s's /v1/instances has no member %s (%s) with an epoch and the tasks it runs: %+v", asker.Name, pid, m.Name, body.Instances)
				}
			}
		}
		return nil
	})
	harness.WaitFor(t, 60*time.Second, "the group's lag to be 0 on every partition", func() error {
		out := describe("--offsets")
		lags := 0
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) < 2 || (f[1] != input && !strings.Contains(l, input)) {
				continue
			}
			lags++
			if f[len(f)-1] != "0" {
				return fmt.Errorf("lag not 0: %s\n%s", l, out)
			}
		}
		if lags == 0 {
			return fmt.Errorf("no offsets of %s in:\n%s", input, out)
		}
		t.Logf("kafka-streams-groups --describe --offsets:\n%s", out)
		return nil
	})
	for _, m := range members {
		m.Terminate(t)
	}
}

// running returns the tasks m runs, by its /v1/tasks.
func running(t *testing.T, m *harness.Member) []string {
	ts, err := m.Tasks()
	if err != nil {
		return nil
	}
	var out []string
	for _, task := range ts {
		if task.Active() && task.State == "running" {
			out = append(out, task.Task)
		}
	}
	return out
}

// processID reads the process id salesagg keeps in the state dir of application appID.
func processID(t *testing.T, stateDir, appID string) string {
	b, err := os.ReadFile(filepath.Join(stateDir, appID, "process-metadata"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		ProcessID string `json:"processId"`
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	return meta.ProcessID
}

// recordsOf returns events as records of topic, keyed by product.
func recordsOf(topic string, events []harness.Event) []*kgo.Record {
	out := make([]*kgo.Record, len(events))
	for i, e := range events {
		out[i] = e.Record(topic)
	}
	return out
}

// TestWarmupInStreamsGroup: the coordinator's warm-ups (group.protocol streams). A runs the
// three tasks with about 200 changelog records each; B joins with no state. salesagg sets the
// group's streams.acceptable.recovery.lag from acceptable.recovery.lag (50 here) and its
// streams.num.warmup.replicas from max.warmup.replicas; the test sets the group's
// streams.task.offset.interval.ms to 2 s, how often a member reports its stores' offsets. The
// coordinator gives B a warm-up copy before any active task; once the copy caught up (by the
// offsets B reports) a task moves to B, which takes it over from the copy, restoring at most
// acceptable.recovery.lag records. Every total is exact from both instances.
func TestWarmupInStreamsGroup(t *testing.T) {
	rng, appID, input, notif := begin(t, "sgwarm", 0x7367776d)
	setGroupConfig(t, appID, map[string]string{"streams.task.offset.interval.ms": "2000"})
	events := harness.GenEvents(rng, "wu", 600, 1200)
	work := t.TempDir()
	fl := harness.NewFleet(func(dir string) *harness.Service {
		return startService(t, harness.ServiceConfig{AppID: appID, StateDir: dir, Input: input, Notif: notif, CommitMs: 200,
			Flags: []string{"--processing.guarantee", "at_least_once", "--group.protocol", "streams", "--acceptable.recovery.lag", "50"}})
	})
	a := fl.Start("A", filepath.Join(work, "a"))
	a.WaitRestored(t, 90*time.Second)
	harness.Produce(t, newClient(t), recordsOf(input, events)...)
	want := harness.TotalsOf(events)
	a.WaitTotals(t, want, 90*time.Second)

	b := fl.Start("B", filepath.Join(work, "b"))
	var warmups []string
	harness.WaitFor(t, 120*time.Second, "a task to move to B", func() error {
		ts, err := b.Tasks()
		if err != nil {
			return err
		}
		for _, task := range ts {
			if task.Role == "warmup" && !slices.Contains(warmups, task.Task) {
				warmups = append(warmups, task.Task)
			}
		}
		if r := running(t, b); len(r) == 0 {
			return fmt.Errorf("B runs no task yet (warm-up copies seen: %v)", warmups)
		}
		return nil
	})
	runs := running(t, b)
	if len(warmups) == 0 {
		t.Fatalf("B runs %v and never showed a warm-up copy: the coordinator gave it an active task it had no state for", runs)
	}
	promoted := promotions(b.Service)
	for _, task := range runs {
		n, ok := promoted[task]
		if !ok {
			t.Fatalf("B runs %s without taking it over from its copy (warm-ups %v)", task, warmups)
		}
		if n > 50 {
			t.Fatalf("B restored %d records of %s past its warm-up copy; acceptable.recovery.lag is 50", n, task)
		}
	}
	t.Logf("B built warm-up copies of %v, then took over %v from them (records restored: %v)", warmups, runs, promoted)
	harness.WaitFor(t, 60*time.Second, "every total exact from both instances", func() error {
		return harness.ServedByOwner([]*harness.Member{a, b}, want, 3)
	})
}

// setGroupConfig sets configs of group (IncrementalAlterConfigs).
func setGroupConfig(t *testing.T, group string, configs map[string]string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for k, v := range configs {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, newClient(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("setting %v on group %s: %v", configs, group, err)
		}
	}
}
