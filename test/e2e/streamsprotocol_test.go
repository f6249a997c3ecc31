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

// TestWarmupInStreamsGroup: a member with no state joins a streams group whose tasks hold
// state. A runs the three tasks with about 200 changelog records each; B joins with no state.
// salesagg sets the group's streams.acceptable.recovery.lag from acceptable.recovery.lag (50
// here) and streams.num.warmup.replicas from max.warmup.replicas; the test sets the group's
// streams.task.offset.interval.ms to 2 s, and B joins once A reported every task's changelog
// end. What the coordinator does next is the broker's: Apache Kafka 4.4's AssignmentRefiner
// returns the assignor's target unchanged (its refine is a no-op in the 4.4.0 jar), so B is
// given an active task at once and restores it whole; a broker that refines hands B a warm-up
// copy first, and the task moves once the copy is within the recovery lag. The test takes
// either path, and checks what salesagg does in it: the whole changelog restored (and said so)
// for a cold start, at most 50 records past the copy for a warm-up; every total exact from
// both instances.
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
	// The coordinator weighs a newcomer's lag against the changelog ends the members report
	// (every streams.task.offset.interval.ms): B joins once A's report has every task's end.
	pid := processID(t, a.Dir, appID)
	harness.WaitFor(t, 30*time.Second, "A to report every task's changelog end to the coordinator", func() error {
		ends, err := reportedEnds(appID, pid)
		if err != nil {
			return err
		}
		for p := range int32(3) {
			if ends[p] < 100 {
				return fmt.Errorf("A reported changelog ends %v", ends)
			}
		}
		return nil
	})

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
	promoted := promotions(b.Service)
	if len(warmups) == 0 {
		// The coordinator moved the task at once: B restores its whole changelog.
		ends, err := reportedEnds(appID, pid)
		if err != nil {
			t.Fatal(err)
		}
		restored := restoredRecords(b.Service)
		for _, task := range runs {
			var p int32
			fmt.Sscanf(task, "0_%d", &p)
			if restored[task] < ends[p]/2 || restored[task] > ends[p] {
				t.Fatalf("B runs %s with no copy of it, and restored %d of its %d changelog records", task, restored[task], ends[p])
			}
		}
		t.Logf("the coordinator built no warm-up copy: B runs %v at once, restoring %v records (changelog ends %v)", runs, restored, ends)
	} else {
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
	}
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

// reportedEnds returns the changelog ends (by partition of subtopology "0") that the member of
// group with process id pid last reported to the coordinator (StreamsGroupDescribe).
func reportedEnds(group, pid string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	coord := kmsg.NewPtrFindCoordinatorRequest()
	coord.CoordinatorKey, coord.CoordinatorKeys = group, []string{group}
	cresp, err := coord.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	node := cresp.NodeID
	for _, c := range cresp.Coordinators {
		node = c.NodeID
	}
	req := kmsg.NewPtrStreamsGroupDescribeRequest()
	req.Groups = []string{group}
	kresp, err := cl.Broker(int(node)).Request(ctx, req)
	if err != nil {
		return nil, err
	}
	ends := map[int32]int64{}
	for _, g := range kresp.(*kmsg.StreamsGroupDescribeResponse).Groups {
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return nil, err
		}
		for _, m := range g.Members {
			if m.ProcessID != pid {
				continue
			}
			for _, o := range m.TaskEndOffsets {
				if o.SubtopologyID == "0" {
					ends[o.Partition] = o.Offset
				}
			}
		}
	}
	return ends, nil
}

// restoredRecords returns the records s's "Finished restoring changelog" lines counted, by task.
func restoredRecords(s *harness.Service) map[string]int64 {
	out := map[string]int64{}
	for _, e := range s.Logs() {
		if strings.HasPrefix(e.Msg(), "Finished restoring changelog") {
			task, _ := e["task"].(string)
			n, _ := e.Int("records")
			out[task] += n
		}
	}
	return out
}
