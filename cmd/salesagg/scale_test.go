package main

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

const (
	// killRestartBound: a single instance SIGKILLed and restarted on its
	// state dir logs its first "Finished restoring changelog" line well
	// before the 45 s session timeout (a dynamic member is assigned nothing
	// until the killed member's session expires).
	killRestartBound = 30 * time.Second
	// scaleProducts is how many products the scale tests' events cover.
	scaleProducts = 60
)

// scaleEvents returns n events over scaleProducts products, scattered
// (harness.Scatter) over the input partitions.
func scaleEvents(rng *rand.Rand, n int) []harness.Event {
	events := harness.GenEvents(rng, "scale-", scaleProducts, n)
	harness.Scatter(rng, events, harness.ScalePartitions)
	return events
}

func TestSeveralInstancesOneGroup(t *testing.T) {
	// Scenario: with the default group config, one group scales 1 → 3 → 2 → 3 (SIGTERM one, add one, SIGKILL and restart one) while events flow; no two instances ever run one task, every instance answers every product with its exact total, served by the instance running its task, and the changelog holds the same totals (harness.SeveralInstancesOneGroup, which test/e2e runs on Apache Kafka).
	harness.EachGuarantee(t, func(t *testing.T, g string) {
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		broker := kfakeCluster(t, harness.ScalePartitions)
		harness.SeveralInstancesOneGroup(t, harness.ScaleSetup{
			Start: func(dir string) *harness.Service {
				return startService(t, broker, dir, nil, "--processing.guarantee", g)
			},
			Bootstrap: broker,
			Changelog: changelogTopic,
			Client:    harness.NewClient(t, broker, kgo.RecordPartitioner(harness.HeaderPartitioner{})),
			Input:     "sales-events-v1",
			// 10 every 100 ms: the producer is stopped once the group is
			// back to three, well before its 8,000.
			Events: scaleEvents(rand.New(rand.NewPCG(seed, 11)), 8000),
			Batch:  10, Every: 100 * time.Millisecond,
			ReadyTimeout: 60 * time.Second,
		})
	})
}

func TestRestartAfterKillNineRejoinsAtOnce(t *testing.T) {
	// Scenario: one instance with the default group config (45 s session timeout, no group.instance.id flag) is SIGKILLed while events flow and restarted on its state dir: it is assigned its tasks at once (static membership by default), not after the session timeout, and totals are exact.
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	broker := kfakeCluster(t, harness.ScalePartitions)
	stateDir := t.TempDir()
	cl := harness.NewClient(t, broker, kgo.RecordPartitioner(harness.HeaderPartitioner{}))
	prod := harness.NewProducer(cl, "sales-events-v1", scaleEvents(rand.New(rand.NewPCG(seed, 11)), 3000)).Start(t, 10, 100*time.Millisecond)

	p := startService(t, broker, stateDir, nil)
	p.WaitReady(t, 60*time.Second)
	harness.WaitFor(t, 30*time.Second, "the instance to fold at least one event", p.Folded)
	p.Kill()

	restartAt := time.Now()
	p = startService(t, broker, stateDir, nil)
	// Wait past the session timeout, so that a late assignment is measured, not only reported.
	harness.WaitFor(t, 60*time.Second, `the restarted instance's first "Finished restoring changelog" line`, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		if p.Restored(t).Lines == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	firstRestore := time.Since(restartAt)
	p.WaitReady(t, 60*time.Second)
	d := time.Since(restartAt)
	t.Logf("restart after SIGKILL: first task restored in %s", firstRestore.Round(time.Millisecond))
	t.Logf("restart after SIGKILL: ready in %s", d.Round(time.Millisecond))
	if firstRestore > killRestartBound {
		t.Errorf(`restart after SIGKILL: first "Finished restoring changelog" line %s after the restart, want within %s: the restarted process waited for the killed member's session (45 s) instead of replacing it`,
			firstRestore.Round(time.Millisecond), killRestartBound)
	}

	if err := prod.Stop(); err != nil {
		t.Fatal(err)
	}
	want := prod.Totals()
	t.Logf("producer done: %d events", prod.Sent())
	p.WaitTotals(t, want, 60*time.Second)
	if err := harness.CheckChangelog(broker, changelogTopic, want); err != nil {
		t.Error(err)
	}
	p.Terminate(t)
}
