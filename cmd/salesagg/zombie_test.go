package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

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
	a := startService(t, broker, filepath.Join(work, "a"), nil, append(args, "--commit.interval.ms", "10000", "--transaction.timeout.ms", "60000")...)
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
		loggedSince(a, resumedAt, `task [0_0] Closed: dropped: partitions lost`, `task [0_0] Closed: revoked; the open transaction is aborted`))
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
	// changelog, or learns it lost its tasks), and the changelog's last values stay exact.
	rig := newZombieRig(t, "alo")
	broker, want, send := rig.broker, rig.want, rig.send
	args := []string{"--session.timeout.ms", "6000", "--processing.guarantee", "at_least_once"}
	work := t.TempDir()
	// A flushes every 30 s: what it folds stays unflushed long enough to pause it with it.
	a := startService(t, broker, filepath.Join(work, "a"), nil, append(args, "--commit.interval.ms", "30000")...)
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
	harness.WaitFor(t, 60*time.Second, "the resumed instance to drop its lost tasks",
		loggedSince(a, resumedAt, `task [0_0] Closed: dropped: partitions lost, nothing committed`))
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
