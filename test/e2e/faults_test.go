//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// TestKillNineWhileEventsFlow: 20,000 events flow while the service is SIGKILLed at random moments and once at each commit-cycle crash point, restarting each time; a clean start then has exact totals (HTTP and changelog), under each guarantee.
func TestKillNineWhileEventsFlow(t *testing.T) {
	harness.EachGuarantee(t, killNine)
}

func killNine(t *testing.T, guarantee string) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("E2E_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("E2E_SEED=%q: %v", s, err)
		}
		seed = n
	}
	t.Logf("seed %d (rerun with E2E_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))

	appID, input, notif := testNames("kill-" + slug(guarantee))
	createTopic(t, input, 3, nil)
	events := harness.GenEvents(rng, "kp", 50, 20_000)

	cfg := harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(t.TempDir(), "state"), Input: input, Notif: notif, CommitMs: 200}
	cfg.Flags = append(cfg.Flags, "--processing.guarantee", guarantee)
	// A SIGKILLed member stays in the group until its session times out,
	// and a dynamic member joining meanwhile waits for that. With static
	// membership (a fixed group.instance.id, as a StatefulSet pod name gives)
	// the restarted process takes its place at once, so kills land while it
	// restores and processes; without it, each kill waits for readiness.
	static := runSupports("group.instance.id") && os.Getenv("E2E_DYNAMIC_MEMBERSHIP") == ""
	if static {
		cfg.Flags = append(cfg.Flags, "--group.instance.id", appID+"-0")
	}
	if runSupports("session.timeout.ms") {
		cfg.Flags = append(cfg.Flags, "--session.timeout.ms", "6000") // the broker's minimum
	}
	t.Logf("static membership: %v; extra flags %v", static, cfg.Flags)

	svc := startService(t, cfg)
	svc.WaitRestored(t, 90*time.Second)
	pp := harness.NewProducer(newClient(t), input, events).Start(t, 40, 70*time.Millisecond)
	topUp := newClient(t)
	var extra []harness.Event // events sent to top up crash runs, see below

	// describe says what the service was doing, for the log of each kill.
	describe := func(s *harness.Service) string {
		c, err := s.Counters()
		if err != nil {
			return "not serving: " + err.Error()
		}
		return fmt.Sprintf("tasks %v, processed %d since its start (%d redelivered skipped)", c.States, c.Processed, c.Duplicates)
	}

	// topUpNow sends 10 more events once the paced producer is done, so
	// that a started service always has something to fold.
	lastTopUp := time.Time{}
	topUpNow := func() {
		t.Helper()
		if !pp.Finished() || time.Since(lastTopUp) < 100*time.Millisecond {
			return
		}
		evs := harness.GenEvents(rng, "kp", 50, 10)
		harness.Produce(t, topUp, harness.Records(input, evs)...)
		extra = append(extra, evs...)
		lastTopUp = time.Now()
	}

	// killLater SIGKILLs the running service at a random moment. After a
	// fold (afterFold): once it processed an event, 0-1.5 s later, so the
	// kill lands among commit cycles with work in them; otherwise 0.5-3 s
	// after its start (after readiness without static membership), which
	// can land in the join or the restore.
	kills, afterFolds := 0, 0
	killLater := func(afterFold bool) {
		t.Helper()
		if !static {
			svc.WaitRestored(t, 120*time.Second)
		}
		var d time.Duration
		if afterFold {
			harness.WaitFor(t, 2*time.Minute, svc.Name+" to fold an event", func() error {
				topUpNow()
				return svc.Folded()
			})
			d = time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
		} else {
			d = 500*time.Millisecond + time.Duration(rng.Int64N(int64(2500*time.Millisecond)))
		}
		// The chaos schedule itself: the moment of the kill is the point.
		select {
		case <-time.After(d):
		case <-svc.Done():
			t.Fatalf("%s exited on its own (%s)", svc.Name, svc.DescribeExit())
		}
		state := describe(svc)
		svc.Kill()
		kills++
		if afterFold {
			afterFolds++
		}
		t.Logf("SIGKILL #%d of %s %s after %s: %s; it had restored %d records at its start; producer at %d/%d",
			kills, svc.Name, d.Round(time.Millisecond), map[bool]string{true: "its first fold", false: map[bool]string{true: "its start", false: "readiness"}[static]}[afterFold],
			state, svc.Restored(t).Total, pp.Sent(), len(events))
	}

	for round := range 8 {
		killLater(round%4 != 0) // 6 of 8 after a fold
		svc = startService(t, cfg)
	}
	if afterFolds < 6 {
		t.Fatalf("only %d of %d kills came after a fold", afterFolds, kills)
	}
	for _, point := range harness.CrashPoints[guarantee] {
		killLater(false) // one process per state dir: the running one goes first
		spec := fmt.Sprintf("%s:%d", point, 2+rng.IntN(6))
		crashCfg := cfg
		crashCfg.CrashPoint = spec
		svc = startService(t, crashCfg)
		// A crash point needs a commit cycle with something to commit: if
		// the producer is done, top it up (10 events every 100 ms).
		harness.WaitFor(t, 2*time.Minute, svc.Name+" to kill itself at "+spec, func() error {
			if !svc.Alive() {
				return nil
			}
			topUpNow()
			return fmt.Errorf("%s still runs", svc.Name)
		})
		if !svc.KilledBy(syscall.SIGKILL) {
			t.Fatalf("%s with SALESAGGTEST_CRASH_POINT=%s ended with %s, want killed by SIGKILL at the crash point", svc.Name, spec, svc.DescribeExit())
		}
		t.Logf("%s killed itself at %s; producer at %d/%d", svc.Name, spec, pp.Sent(), len(events))
		svc = startService(t, cfg)
	}
	if pp.Finished() {
		t.Logf("note: the producer finished during the kills; the later ones hit a service with little or no live traffic (crash runs were topped up)")
	}

	// The last start runs without a crash point and is not killed.
	pp.Wait(t, 5*time.Minute)
	want := harness.TotalsOf(events, extra)
	t.Logf("producer done: %d events (and %d topping up the crash runs) over %d products", len(events), len(extra), len(want))
	last := svc.WaitRestored(t, 120*time.Second)
	t.Logf("last start restored %d records %v", last.Total, last.Partitions)
	harness.WaitFor(t, 2*time.Minute, "exact totals over HTTP", func() error { return svc.CheckTotals(want) })
	if err := checkChangelog(harness.ChangelogTopic(appID), want); err != nil {
		t.Error(err)
	}
	if c, err := svc.Counters(); err == nil {
		t.Logf("last instance: %d events processed, %d redelivered events skipped as already counted", c.Processed, c.Duplicates)
	}
	svc.Terminate(t)
}
