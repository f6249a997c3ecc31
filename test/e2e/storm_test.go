//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestJoinStormInsideOneTransaction: on Apache Kafka, exactly-once with a 10 s commit
// interval, A runs the three tasks while events flow; three times, B joins and C joins the
// moment B runs a task, then both stop: several revokes of A's tasks land inside one of A's
// transactions (franz-go's transact session passes on only the first). No two instances ever
// run one task, every total is exact, and the changelog holds the same totals.
func TestJoinStormInsideOneTransaction(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x73746f72))
	appID, input, notif := testNames("storm")
	createTopic(t, input, scalePartitions, nil)
	events := genEvents(rng, "st", 30, 4000)
	want := totalsOf(events)

	work := t.TempDir()
	cfg := func(dir string) serviceConfig {
		return serviceConfig{appID: appID, stateDir: filepath.Join(work, dir), input: input, notif: notif, commitMs: 10000,
			extra: []string{"--processing.guarantee", "exactly_once_v2"}}
	}
	var fl scaleFleet
	start := func(name, dir string) *scaleMember {
		t.Helper()
		m := &scaleMember{name: name, service: startService(t, cfg(dir))}
		fl.add(m)
		return m
	}
	gone := func(m *scaleMember) {
		t.Helper()
		m.terminate(t)
		fl.mu.Lock()
		defer fl.mu.Unlock()
		for i, x := range fl.members {
			if x == m {
				fl.members = append(fl.members[:i], fl.members[i+1:]...)
				break
			}
		}
	}

	a := start("A", "a")
	a.waitReady(t, 90*time.Second)
	sampler := startScaleSampler(t, &fl)
	pp := startPacedProducer(t, newClient(t, kgo.RecordPartitioner(headerPartitioner{})), input, events, 20, 100*time.Millisecond)
	runsOne := func(m *scaleMember) func() error {
		return func() error {
			if len(m.running()) == 0 {
				return fmt.Errorf("%s runs no task", m.name)
			}
			return nil
		}
	}
	for round := range 3 {
		b := start(fmt.Sprintf("B%d", round), "b")
		waitFor(t, 90*time.Second, fmt.Sprintf("round %d: B running a task", round), runsOne(b))
		c := start(fmt.Sprintf("C%d", round), "c")
		waitFor(t, 90*time.Second, fmt.Sprintf("round %d: C running a task", round), runsOne(c))
		t.Logf("round %d: B and C joined (producer at %d/%d)", round, pp.sent.Load(), len(events))
		gone(c)
		gone(b)
	}
	pp.wait(t, 5*time.Minute)
	expect(t, 90*time.Second, "A to run every task and answer every exact total", func() error {
		if r := a.running(); len(r) != scalePartitions {
			return fmt.Errorf("A runs %v", r)
		}
		return a.checkTotals(want)
	})
	expect(t, 30*time.Second, "the changelog's latest committed totals to be exact", func() error {
		return checkChangelog(changelogTopic(appID), want)
	})
	reportScale(t, sampler)
	if lines := strings.Count(strings.Join(a.stderrLines(), "\n"), "Stopping tasks the latest assignment does not leave running here"); lines > 0 {
		t.Logf("A stopped tasks whose revoke it was not told of %d times", lines)
	}
	a.terminate(t)
}
