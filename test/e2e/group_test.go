//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestSeveralInstancesOneGroup: on Apache Kafka, with the default group config, one group scales 1 → 3 → 2 → 3 (SIGTERM one for good, add one, SIGKILL one and restart it on its state dir) while events flow, some with an empty key or on a partition that does not own them; no two instances ever run one task, every instance answers every product with its exact total, served by the one running its task (one forwarding hop), and the changelog holds the same totals, under each guarantee (harness.SeveralInstancesOneGroup, which cmd/salesagg runs on the in-process kfake broker).
func TestSeveralInstancesOneGroup(t *testing.T) {
	harness.EachGuarantee(t, func(t *testing.T, g string) {
		severalInstancesOneGroup(t, "scale-"+slug(g), 0x7363616c, "sc", "--processing.guarantee", g)
	})
}

// severalInstancesOneGroup runs harness.SeveralInstancesOneGroup on Apache Kafka with the
// default group config (no group.instance.id, no session.timeout.ms) and flags, on 6,000
// events of 60 products named prefix…, some with an empty key or on a partition that does not
// own them.
func severalInstancesOneGroup(t *testing.T, name string, stream uint64, prefix string, flags ...string) {
	rng, appID, input, notif := begin(t, name, stream)
	events := harness.GenEvents(rng, prefix, 60, 6000)
	harness.Scatter(rng, events, harness.ScalePartitions)
	harness.SeveralInstancesOneGroup(t, harness.ScaleSetup{
		Start: func(dir string) *harness.Service {
			return startService(t, harness.ServiceConfig{AppID: appID, StateDir: dir, Input: input, Notif: notif, CommitMs: 200, Flags: flags})
		},
		Bootstrap: bootstrap,
		Changelog: sales.ChangelogTopic(appID, sales.StoreName),
		Client:    newClient(t, kgo.RecordPartitioner(harness.HeaderPartitioner{})),
		Input:     input,
		Events:    events,
		Batch:     30, Every: 200 * time.Millisecond,
		ReadyTimeout: 90 * time.Second,
		Drain:        2 * time.Minute,
	})
}

// TestJoinStormInsideOneTransaction: on Apache Kafka, exactly-once with a 10 s commit
// interval, A runs the three tasks while events flow; three times, B joins and C joins the
// moment B runs a task, then both stop: several revokes of A's tasks land inside one of A's
// transactions (franz-go's transact session passes on only the first). No two instances ever
// run one task, every total is exact, and the changelog holds the same totals.
func TestJoinStormInsideOneTransaction(t *testing.T) { joinStorm(t, "storm") }

// TestJoinStormInStreamsGroup: TestJoinStormInsideOneTransaction with group.protocol streams:
// each revoke of A's tasks commits A's open transaction before the task goes, and the next
// owner starts from those offsets.
func TestJoinStormInStreamsGroup(t *testing.T) {
	joinStorm(t, "sgstorm", "--group.protocol", "streams")
}

func joinStorm(t *testing.T, name string, flags ...string) {
	rng, appID, input, notif := begin(t, name, 0x73746f72)
	events := harness.GenEvents(rng, "st", 30, 4000)
	want := harness.TotalsOf(events)

	work := t.TempDir()
	cfg := func(dir string) harness.ServiceConfig {
		return harness.ServiceConfig{AppID: appID, StateDir: dir, Input: input, Notif: notif, CommitMs: 10000,
			Flags: append([]string{"--processing.guarantee", "exactly_once_v2"}, flags...)}
	}
	fl := harness.NewFleet(func(dir string) *harness.Service { return startService(t, cfg(dir)) })
	start := func(name, dir string) *harness.Member {
		t.Helper()
		return fl.Start(name, filepath.Join(work, dir))
	}
	gone := func(m *harness.Member) {
		t.Helper()
		m.Terminate(t)
		fl.Forget(m)
	}

	a := start("A", "a")
	a.WaitRestored(t, 90*time.Second)
	sampler := fl.Sample(t)
	pp := harness.NewProducer(newClient(t, kgo.RecordPartitioner(harness.HeaderPartitioner{})), input, events).Start(t, 20, 100*time.Millisecond)
	runsOne := func(m *harness.Member) func() error {
		return func() error {
			if len(m.Running()) == 0 {
				return fmt.Errorf("%s runs no task", m.Name)
			}
			return nil
		}
	}
	for round := range 3 {
		b := start(fmt.Sprintf("B%d", round), "b")
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("round %d: B running a task", round), runsOne(b))
		c := start(fmt.Sprintf("C%d", round), "c")
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("round %d: C running a task", round), runsOne(c))
		t.Logf("round %d: B and C joined (producer at %d/%d)", round, pp.Sent(), len(events))
		gone(c)
		gone(b)
	}
	pp.Wait(t, 5*time.Minute)
	harness.Expect(t, 90*time.Second, "A to run every task and answer every exact total", func() error {
		if r := a.Running(); len(r) != harness.ScalePartitions {
			return fmt.Errorf("A runs %v", r)
		}
		return a.CheckTotals(want)
	})
	harness.Expect(t, 30*time.Second, "the changelog's latest committed totals to be exact", func() error {
		return checkChangelog(sales.ChangelogTopic(appID, sales.StoreName), want)
	})
	harness.ReportOwnership(t, sampler)
	if lines := strings.Count(strings.Join(a.StderrLines(), "\n"), "Stopping tasks the latest assignment does not leave running here"); lines > 0 {
		t.Logf("A stopped tasks whose revoke it was not told of %d times", lines)
	}
	a.Terminate(t)
}

// standbySession is the session timeout of the standby test: the killed
// member's tasks move once it expires.
const standbySession = 10 * time.Second

var promotedLine = regexp.MustCompile(`^task \[(0_\d+)\] standby was (\d+) records behind; restored (\d+) records`)

// promotions returns the tasks s took over from its standby copies: task →
// records restored.
func promotions(s *harness.Service) map[string]int64 {
	out := map[string]int64{}
	for _, e := range s.Logs() {
		if g := promotedLine.FindStringSubmatch(e.Msg()); g != nil {
			n, _ := e.Int("records")
			out[g[1]] = n
		}
	}
	return out
}

// copies reads GET /v1/tasks: standby or warm-up copy → changelog lag (-1
// unknown).
func copies(m *harness.Member) (map[string]int64, error) {
	ts, err := m.Tasks()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, t := range ts {
		if t.Role == "standby" || t.Role == "warmup" {
			out[t.Task] = -1
			if t.ChangelogLag != nil && t.State == "running" {
				out[t.Task] = *t.ChangelogLag
			}
		}
	}
	return out, nil
}

// TestStandbyFailoverAfterKillNine: on Apache Kafka, three instances with num.standby.replicas=1
// run one task each, and every task has a caught-up standby copy on another instance. One is
// SIGKILLed while events flow (after it folded some); once its session expires, a survivor runs
// each of its tasks again from its copy (it logs "standby was N records behind", not a cold
// restore), no two instances ever run one task, and after the events stop every product asked
// to every survivor is answered 200 with its exact total, as is the changelog. The killed
// instance restarts on its state dir and the three answer every product again.
func TestStandbyFailoverAfterKillNine(t *testing.T) { standbyFailoverAfterKillNine(t, "standby") }

// TestStandbyFailoverInStreamsGroup: TestStandbyFailoverAfterKillNine with group.protocol streams,
// under both guarantees: the coordinator places the standby copies (salesagg sets the group's
// streams.num.standby.replicas and session timeout from its own keys) and moves the killed
// instance's tasks to the survivors keeping their copies.
func TestStandbyFailoverInStreamsGroup(t *testing.T) {
	harness.EachGuarantee(t, func(t *testing.T, g string) {
		standbyFailoverAfterKillNine(t, "sgstandby-"+slug(g), "--group.protocol", "streams", "--processing.guarantee", g)
	})
}

func standbyFailoverAfterKillNine(t *testing.T, name string, flags ...string) {
	rng, appID, input, notif := begin(t, name, 0x73746e64)
	events := harness.GenEvents(rng, "sb", 300, 9000)
	want := harness.TotalsOf(events)

	work := t.TempDir()
	cfg := func(dir string) harness.ServiceConfig {
		return harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(work, dir), Input: input, Notif: notif,
			// acceptable.recovery.lag 0: only a copy at the changelog end counts as
			// caught up. With the default (10,000) a member with no copy is caught up
			// too while the killed task's changelog is short (a kill soon after the
			// start), and may take the task over with a small cold restore instead
			// of promoting the copy, which is what this test is about.
			Flags: append([]string{"--num.standby.replicas", "1", "--acceptable.recovery.lag", "0",
				"--session.timeout.ms", fmt.Sprint(standbySession.Milliseconds())}, flags...)}
	}
	fl := harness.NewFleet(func(dir string) *harness.Service { return startService(t, cfg(dir)) })
	start := fl.Start
	a := start("A", "a")
	a.WaitRestored(t, 90*time.Second)
	b := start("B", "b")
	c := start("C", "c")
	all := []*harness.Member{a, b, c}
	harness.Expect(t, harness.SpreadBound, "the 3 tasks spread over A, B, C (one running task each)", func() error {
		return harness.RunEach(all, true, harness.ScalePartitions)
	})
	sampler := fl.Sample(t)
	pp := harness.NewProducer(newClient(t), input, events).Start(t, 50, 100*time.Millisecond)

	// Every task has a copy on another instance that has caught up once.
	harness.Expect(t, 60*time.Second, "a standby copy of every task tailing on another instance", func() error {
		have := map[string]string{}
		for _, m := range all {
			cp, err := copies(m)
			if err != nil {
				return err
			}
			run := m.Running()
			for task, lag := range cp {
				if run[task] {
					return fmt.Errorf("%s runs %s and keeps a copy of it", m.Name, task)
				}
				if lag >= 0 {
					have[task] = m.Name
				}
			}
		}
		if len(have) != harness.ScalePartitions {
			return fmt.Errorf("copies tailing: %v", have)
		}
		return nil
	})
	harness.Expect(t, 30*time.Second, "C to fold events before its SIGKILL", c.Folded)
	var cTasks []string
	for task := range c.Running() {
		cTasks = append(cTasks, task)
	}
	sort.Strings(cTasks)
	if len(cTasks) == 0 {
		t.Fatal("C runs no task before its SIGKILL")
	}
	// C's folds reach its changelog only with a committed transaction. Killed before
	// its first one, C leaves empty changelogs, any member is then caught up on
	// them, and a survivor without the copy may take the task with nothing to
	// restore: the kill must land after a commit.
	adm := kadm.NewClient(newClient(t))
	harness.Expect(t, 30*time.Second, "C's changelogs to hold committed records before its SIGKILL", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stable, err := adm.ListCommittedOffsets(ctx, sales.ChangelogTopic(appID, sales.StoreName))
		if err != nil {
			return err
		}
		for p := range c.Running() {
			var part int32
			if _, err := fmt.Sscanf(p, "0_%d", &part); err != nil {
				return err
			}
			if o, ok := stable.Lookup(sales.ChangelogTopic(appID, sales.StoreName), part); !ok || o.Offset <= 0 {
				return fmt.Errorf("changelog partition %d of task %s has no committed record yet", part, p)
			}
		}
		return nil
	})
	c.Kill()
	killedAt := time.Now()
	t.Logf("C (running %v) SIGKILLed at producer %d/%d", cTasks, pp.Sent(), len(events))
	live := []*harness.Member{a, b}
	harness.Expect(t, standbySession+45*time.Second, "A and B to run all 3 tasks after C's SIGKILL", func() error {
		return harness.RunEach(live, false, harness.ScalePartitions)
	})
	t.Logf("C's tasks %v run again %s after the SIGKILL (session timeout %s)", cTasks, time.Since(killedAt).Round(time.Millisecond), standbySession)
	for _, task := range cTasks {
		var took []string
		for _, m := range live {
			if n, ok := promotions(m.Service)[task]; ok {
				took = append(took, fmt.Sprintf("%s restored %d", m.Name, n))
			}
		}
		if len(took) == 0 {
			t.Errorf("no survivor took %s over from a standby copy (no \"standby was N records behind\" line)", task)
		} else {
			t.Logf("task %s taken over from a standby copy: %s", task, strings.Join(took, ", "))
		}
	}

	pp.Wait(t, 2*time.Minute)
	harness.Expect(t, 60*time.Second, "every product answered by A and B with its exact total, from its owner", func() error {
		return harness.ServedByOwner(live, want, harness.ScalePartitions)
	})
	harness.Expect(t, 30*time.Second, "the changelog's latest committed totals to be exact", func() error {
		return checkChangelog(sales.ChangelogTopic(appID, sales.StoreName), want)
	})

	c2 := start("C2", "c")
	live = []*harness.Member{a, b, c2}
	harness.Expect(t, harness.SpreadBound, "the 3 tasks spread over A, B, C again", func() error { return harness.RunEach(live, true, harness.ScalePartitions) })
	harness.Expect(t, 60*time.Second, "every product answered by A, B and C with its exact total, from its owner", func() error {
		return harness.ServedByOwner(live, want, harness.ScalePartitions)
	})
	harness.ReportOwnership(t, sampler)
	for _, m := range live {
		m.Terminate(t)
	}
}
