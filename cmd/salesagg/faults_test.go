package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

func TestSIGKILLAtEveryCommitStepKeepsTotalsExact(t *testing.T) {
	// Scenario: while events flow, the service is SIGKILLed at each step of the commit cycle and at
	// random moments, and restarted each time; at the end every total is exact (nothing lost, nothing
	// counted twice), over HTTP and in the changelog, under both guarantees, and so is every window
	// of the two window sizes (1m and 1h by record timestamp, in their changelogs).
	t.Run("exactly_once_v2", func(t *testing.T) { crashTest(t, "exactly_once_v2", 50) })
	t.Run("at_least_once", func(t *testing.T) { crashTest(t, "at_least_once", 8) })
}

func crashTest(t *testing.T, guarantee string, randomKills int) {
	eos := guarantee == "exactly_once_v2"
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))

	broker := kfakeCluster(t, 3)
	stateDir := t.TempDir()
	// Windows of 1m and 1h with a grace of 1h: the run crosses several
	// minute boundaries, and no event is late (a forwarded one arrives
	// after its task's stream time moved on, within the grace).
	groupArgs := []string{"--group.instance.id", "crash-test", "--session.timeout.ms", "6000", "--processing.guarantee", guarantee,
		"--windows.sizes", "1m,1h", "--windows.grace.ms", "3600000"}

	// Events: 40 products; some with an empty key, some sent to a partition that does not own them.
	// Exactly-once, values are positive so that committed notifications of a product must rise
	// strictly: a repeated or lower value would come from a cycle counted twice.
	cl := harness.NewClient(t, broker, kgo.RecordPartitioner(harness.HeaderPartitioner{}))
	events := make([]harness.Event, 4000+100*randomKills)
	for i := range events {
		e := harness.Event{Product: fmt.Sprintf("sku-%02d", rng.IntN(40)), Value: int64(rng.IntN(550) - 50)}
		if eos {
			e.Value = int64(1 + rng.IntN(500))
		}
		switch rng.IntN(10) {
		case 0:
			e.NoKey = true
		case 1:
			e.Misroute, e.To = true, int32(rng.IntN(3))
		}
		events[i] = e
	}
	want := harness.TotalsOf(events)
	prod := harness.NewProducer(cl, "sales-events-v1", events).Start(t, 20, 40*time.Millisecond)
	// topUp sends 5 more events when the producer is done, so that a started
	// process always has something to fold.
	toppedUp := 0
	topUp := func() {
		t.Helper()
		if !prod.Finished() {
			return
		}
		more := make([]harness.Event, 5)
		for i := range more {
			more[i] = harness.Event{Product: fmt.Sprintf("sku-%02d", rng.IntN(40)), Value: int64(1 + rng.IntN(500))}
			want[more[i].Product] += more[i].Value
		}
		toppedUp += len(more)
		harness.Produce(t, cl, harness.Records("sales-events-v1", more)...)
	}

	points := harness.CrashPoints[guarantee]
	for round, point := range append(points, points...) {
		nth := 1 + rng.IntN(4)
		p := startService(t, broker, stateDir, []string{fmt.Sprintf("SALESAGGTEST_CRASH_POINT=%s:%d", point, nth)}, groupArgs...)
		// A crash point needs commit cycles with something to commit: once
		// the paced producer is done (a slow start can outlast it), top up
		// until the process reaches its point.
		harness.WaitFor(t, 90*time.Second, fmt.Sprintf("round %d: crash point %s:%d to be reached", round, point, nth), func() error {
			if !p.Alive() {
				return nil
			}
			topUp()
			return errors.New("still running")
		})
		if !p.KilledBy(syscall.SIGKILL) {
			t.Fatalf("round %d: crash point %s: process ended with %s, not SIGKILL", round, point, p.DescribeExit())
		}
	}
	var toFirstFold time.Duration
	for round := 0; round < randomKills; round++ {
		p := startService(t, broker, stateDir, nil, groupArgs...)
		started := time.Now()
		// Kill only once processing has begun: a kill before the first fold
		// would only test a start-up.
		lastTopUp := time.Time{}
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("random kill round %d: a processed event in /v1/tasks", round), func() error {
			if time.Since(lastTopUp) >= 200*time.Millisecond {
				topUp()
				lastTopUp = time.Now()
			}
			return p.Folded()
		})
		toFirstFold += time.Since(started)
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		p.Kill()
	}
	if randomKills > 0 {
		t.Logf("%d random kills, each after the first fold (%s from the start on average); %d events topped up", randomKills,
			(toFirstFold / time.Duration(randomKills)).Round(time.Millisecond), toppedUp)
	}
	prod.Wait(t, 5*time.Minute)

	p := startService(t, broker, stateDir, nil, groupArgs...)
	p.WaitReady(t, 60*time.Second)
	p.WaitTotals(t, want, 60*time.Second)
	got, records := changelogTotals(t, broker)
	if restored := p.RestoredTasks(t, 9).ByStore[sales.StoreName]; eos && restored*4 > int64(records) {
		// After a SIGKILL only the tail past the local checkpoint is restored, never the whole changelog.
		t.Errorf("restart after SIGKILL restored %d records of a changelog of %d", restored, records)
	}
	if eos {
		for product, values := range notifications(t, broker) {
			for i := 1; i < len(values); i++ {
				if values[i] <= values[i-1] {
					t.Fatalf("committed notifications of %s do not rise: %v", product, values)
				}
			}
			if w := want[product]; w >= 2000 && values[len(values)-1] != w {
				t.Errorf("last notification of %s = %d, want %d", product, values[len(values)-1], w)
			}
		}
	}
	for product, w := range want {
		if got[product] != w {
			t.Errorf("changelog %s = %d, want %d", product, got[product], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("changelog has %d products, want %d", len(got), len(want))
	}
	input, err := harness.ReadTopic(broker, "sales-events-v1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []time.Duration{time.Minute, time.Hour} {
		topic := sales.ChangelogTopic("sales-aggregator", sales.WindowStoreName(sales.StoreName, size))
		gotW, err := harness.ReadWindows(broker, topic)
		if err != nil {
			t.Fatal(err)
		}
		if err := harness.DiffTotals("window changelog "+topic, gotW, harness.WindowTruth(input.Records, size)); err != nil {
			t.Error(err)
		}
		t.Logf("%s: %d windows exact", topic, len(gotW))
	}
	p.Terminate(t)

	// After a clean stop, nothing is restored.
	p = startService(t, broker, stateDir, nil, groupArgs...)
	p.WaitReady(t, 60*time.Second)
	// The restore lines reach the test through the process's log pipe:
	// wait for all three rather than take readiness for their arrival.
	if sum := p.RestoredTasks(t, 9); sum.Total != 0 || sum.Lines != 9 {
		t.Fatalf("restart after clean stop restored %d records in %d lines, want 0 in 9 (3 tasks, 3 stores each)", sum.Total, sum.Lines)
	}
	p.WaitTotals(t, want, 30*time.Second)
	p.Terminate(t)
}

// zombieRig is the setup of the paused-instance tests: an in-process broker
// (kfakeCluster, the input topic on 3 partitions) and a client sending
// events for 12 products.
type zombieRig struct {
	t      *testing.T
	broker string
	cl     *kgo.Client
	prefix string
	// want holds the totals of the events sent.
	want map[string]int64
}

func newZombieRig(t *testing.T, prefix string) *zombieRig {
	t.Helper()
	broker := kfakeCluster(t, 3)
	return &zombieRig{t: t, broker: broker, cl: harness.NewClient(t, broker), prefix: prefix, want: map[string]int64{}}
}

// send produces n events of the given value, for products prefix0..prefix11
// in turn, and adds them to want.
func (r *zombieRig) send(n int, value int64) {
	r.t.Helper()
	evs := make([]harness.Event, n)
	for i := range evs {
		evs[i] = harness.Event{Product: fmt.Sprintf("%s%d", r.prefix, i%12), Value: value}
		r.want[evs[i].Product] += value
	}
	harness.Produce(r.t, r.cl, harness.Records("sales-events-v1", evs)...)
}

// changelogIs returns nil when the changelog holds every total of want.
func (r *zombieRig) changelogIs(want map[string]int64) func() error {
	return func() error {
		got, _ := changelogTotals(r.t, r.broker)
		for p, w := range want {
			if got[p] != w {
				return fmt.Errorf("changelog %s = %d, want %d", p, got[p], w)
			}
		}
		return nil
	}
}

// processed returns nil once s's tasks have processed at least n events.
func processed(s *harness.Service, n int64) func() error {
	return func() error {
		c, err := s.Counters()
		if err == nil && c.Processed < n {
			err = fmt.Errorf("%s processed %d", s.Name, c.Processed)
		}
		return err
	}
}

// loggedSince returns nil once s logged, after the offset at of its
// standard error, a line holding one of lines.
func loggedSince(s *harness.Service, at int, lines ...string) func() error {
	return func() error {
		out := s.Stderr()[at:]
		for _, l := range lines {
			if strings.Contains(out, l) {
				return nil
			}
		}
		return fmt.Errorf("none of %q logged yet", lines)
	}
}

func TestPausedInstanceIsFencedWhenItResumes(t *testing.T) {
	// Scenario (exactly-once): instance A is paused with SIGSTOP past its session timeout while
	// instance B takes over its partitions; when A resumes, its open transaction is fenced and
	// aborted, and the committed changelog and notifications stay exact.
	rig := newZombieRig(t, "z")
	broker, want, send := rig.broker, rig.want, rig.send
	// Twice franz-go's 3 s heartbeat interval, so that no member is expired while it runs.
	args := []string{"--session.timeout.ms", "6000", "--processing.guarantee", "exactly_once_v2"}
	work := t.TempDir()
	// A commits every 10 s: what it folds sits in its open transaction
	// long enough to pause it there.
	a := startService(t, broker, filepath.Join(work, "a"), nil, append(args, "--commit.interval.ms", "10000", "--commit.idle.ms", "0", "--transaction.timeout.ms", "60000")...)
	a.WaitReady(t, 60*time.Second)
	send(240, 150)
	a.WaitTotals(t, want, 30*time.Second)

	// A stops mid-flight, once it folded what it polls now into its open
	// transaction.
	before, err := a.Counters()
	if err != nil {
		t.Fatal(err)
	}
	send(120, 150)
	harness.WaitFor(t, 30*time.Second, "A to fold the events into its open transaction", processed(a, before.Processed+120))
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b := startService(t, broker, filepath.Join(work, "b"), nil, args...)
	b.WaitReady(t, 60*time.Second) // after A's session expired: B owns every partition
	send(120, 150)
	b.WaitTotals(t, want, 60*time.Second)

	resumedAt := len(a.Stderr()) // only what A logs after it resumes counts below
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 60*time.Second, "the resumed instance to drop its lost tasks and abort",
		loggedSince(a, resumedAt, `task [0_0] Closed: dropped: partitions lost`, `task [0_0] Closed: revoked; the open transaction is aborted`,
			`task [0_0] Closed: dropped: no heartbeat answered within the session timeout`))
	send(120, 150)
	harness.WaitFor(t, 60*time.Second, "exact committed totals in the changelog", rig.changelogIs(want))
	for product, values := range notifications(t, broker) {
		for i := 1; i < len(values); i++ {
			if values[i] <= values[i-1] {
				t.Fatalf("committed notifications of %s do not rise (a fenced cycle was committed): %v", product, values)
			}
		}
	}
	a.Terminate(t)
	b.Terminate(t)
}

func TestPausedInstanceWritesNothingAtLeastOnce(t *testing.T) {
	// Scenario (at-least-once): instance A folds events it has not flushed yet and is paused with
	// SIGSTOP past its session timeout; B takes over its tasks and writes newer totals; when A
	// resumes, it writes nothing over them (it checks its membership before writing the
	// changelog, its lease lapses, or it learns it lost its tasks), and the changelog's last
	// values stay exact.
	rig := newZombieRig(t, "alo")
	broker, want, send := rig.broker, rig.want, rig.send
	args := []string{"--session.timeout.ms", "6000", "--processing.guarantee", "at_least_once"}
	work := t.TempDir()
	// A flushes every 30 s: what it folds stays unflushed long enough to pause it with it.
	a := startService(t, broker, filepath.Join(work, "a"), nil, append(args, "--commit.interval.ms", "30000", "--commit.idle.ms", "0")...)
	a.WaitReady(t, 60*time.Second)
	send(120, 100)
	harness.WaitFor(t, 30*time.Second, "A to fold the events", func() error {
		c, err := a.Counters()
		if err == nil && c.Processed != 120 {
			err = fmt.Errorf("A processed %d", c.Processed)
		}
		return err
	})
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if got, n := changelogTotals(t, broker); n != 0 {
		t.Fatalf("A flushed before it was paused (changelog %v): the pause did not land with unflushed totals", got)
	}
	b := startService(t, broker, filepath.Join(work, "b"), nil, args...)
	b.WaitReady(t, 60*time.Second) // after A's session expired: B owns every task
	send(120, 7)
	b.WaitTotals(t, want, 60*time.Second)
	harness.WaitFor(t, 30*time.Second, "the changelog to hold B's totals", rig.changelogIs(want))
	if time.Since(stopped) < 30*time.Second {
		// Let A's flush be due when it resumes.
		time.Sleep(30*time.Second - time.Since(stopped))
	}
	resumedAt := len(a.Stderr()) // only what A logs after it resumes counts below
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Its lease (no heartbeat answered for a session) or the group (the
	// partitions lost) drops the tasks first, whichever it sees first.
	harness.WaitFor(t, 60*time.Second, "the resumed instance to drop its lost tasks",
		loggedSince(a, resumedAt, `task [0_0] Closed: dropped: partitions lost, nothing committed`,
			`task [0_0] Closed: dropped: no heartbeat answered within the session timeout, nothing committed`))
	if out := a.Stderr()[resumedAt:]; strings.Contains(out, "Not flushing") {
		t.Log("the resumed instance's flush came first and found it was no longer a member")
	} else {
		t.Log("the resumed instance learned it lost its tasks before its flush was due")
	}
	got, _ := changelogTotals(t, broker)
	for p, w := range want {
		if got[p] != w {
			t.Errorf("changelog %s = %d after A resumed, want %d (a stale write from the paused instance)", p, got[p], w)
		}
	}
	a.Terminate(t)
	b.Terminate(t)
}

func TestIdleConnectionsDoNotStopProcessing(t *testing.T) {
	// Scenario: the service runs with a limit of 400 file descriptors, and clients open 450
	// connections to its HTTP server and leave them idle. It lowers http.max.connections to fit
	// the limit (saying so), so the connections cannot take the descriptors its stores and Kafka
	// need: events keep being folded into the changelog, no task stalls as if the disk were full,
	// and once the clients go the HTTP server answers again.
	if testing.Short() {
		t.Skip("starts a broker and the service")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("needs sh for ulimit: ", err)
	}
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	addr := harness.FreeAddr(t)
	// sh sets the limit (soft and hard, so that Go cannot raise it) and
	// becomes the service.
	p := &harness.Service{API: harness.NewAPI(addr), Proc: harness.Start(t, harness.Spec{Name: "salesagg", Path: "sh", Args: []string{
		"-c", `ulimit -n 400 && exec "$0" "$@"`, binary, "run", "--bootstrap.servers", brokerAddr,
		"--state.dir", filepath.Join(work, "state"), "--http.addr", addr, "--log.format", "json", "--commit.interval.ms", "100"}})}
	p.WaitReady(t, 60*time.Second)
	if len(p.LogsWith("Lowering http.max.connections")) != 1 {
		t.Fatalf("the service did not lower http.max.connections to its file descriptor limit:\n%s", p.Stderr())
	}

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 450 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dialing connection %d: %v", len(conns), err)
		}
		// One request, then the connection stays open, idle.
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	produceSample(t, brokerAddr)
	// Read from Kafka, not over HTTP: the server may have no connection
	// left to give the test.
	harness.WaitFor(t, 60*time.Second, "the sample totals in the changelog while 450 connections are open", func() error {
		got, _ := changelogTotals(t, brokerAddr)
		for prod, want := range harness.SampleTotals {
			if got[prod] != want {
				return fmt.Errorf("changelog %s = %d, want %d", prod, got[prod], want)
			}
		}
		return nil
	})
	if strings.Contains(p.Stderr(), "Cannot write its store") {
		t.Fatalf("a task stalled as if its store could not be written:\n%s", p.Stderr())
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	p.WaitTotals(t, harness.SampleTotals, 60*time.Second)
	p.Terminate(t)
}

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
