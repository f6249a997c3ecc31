package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// zombieRig is the setup of the paused-instance tests: an in-process broker
// whose groups allow sessions down to 1 s, the input topic on 3 partitions,
// and a client sending events for 12 products.
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
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close) // registered first: runs after the processes and the client are gone
	broker := cluster.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, "sales-events-v1"); err != nil {
		t.Fatal(err)
	}
	return &zombieRig{t: t, broker: broker, cl: cl, prefix: prefix, want: map[string]int64{}}
}

// send produces n events of the given value, for products prefix0..prefix11
// in turn, and adds them to want.
func (r *zombieRig) send(n int, value int64) {
	r.t.Helper()
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("%s%d", r.prefix, i%12)
		r.want[p] += value
		recs = append(recs, &kgo.Record{Topic: "sales-events-v1", Key: []byte(p), Value: []byte(fmt.Sprintf(`{"product":%q,"value":%d}`, p, value))})
	}
	if err := r.cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		r.t.Fatal(err)
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
	a.waitReady()
	send(240, 150)
	a.waitTotals(want, 30*time.Second)

	// A stops mid-flight, once it folded what it polls now into its open
	// transaction.
	before := a.processed()
	send(120, 150)
	waitFor(t, 30*time.Second, "A to fold the events into its open transaction", func() bool { return a.processed() >= before+120 })
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b := startService(t, broker, filepath.Join(work, "b"), nil, args...)
	b.waitReady() // after A's session expired: B owns every partition
	send(120, 150)
	b.waitTotals(want, 60*time.Second)

	resumedAt := len(a.output()) // only what A logs after it resumes counts below
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the resumed instance to drop its lost tasks and abort", func() bool {
		out := a.output()[resumedAt:]
		return strings.Contains(out, `task [0_0] Closed: dropped: partitions lost`) || strings.Contains(out, `task [0_0] Closed: revoked; the open transaction is aborted`)
	})
	send(120, 150)
	waitFor(t, 60*time.Second, "exact committed totals in the changelog", func() bool {
		got, _ := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
		for p, w := range want {
			if got[p] != w {
				return false
			}
		}
		return true
	})
	for product, values := range notifications(t, broker, "notifications-events-v1") {
		for i := 1; i < len(values); i++ {
			if values[i] <= values[i-1] {
				t.Fatalf("committed notifications of %s do not rise (a fenced cycle was committed): %v", product, values)
			}
		}
	}
	a.stop()
	b.stop()
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
	a.waitReady()
	send(120, 100)
	waitFor(t, 30*time.Second, "A to fold the events", func() bool { return a.processed() == 120 })
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if got, n := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog"); n != 0 {
		t.Fatalf("A flushed before it was paused (changelog %v): the pause did not land with unflushed totals", got)
	}
	b := startService(t, broker, filepath.Join(work, "b"), nil, args...)
	b.waitReady() // after A's session expired: B owns every task
	send(120, 7)
	b.waitTotals(want, 60*time.Second)
	waitFor(t, 30*time.Second, "the changelog to hold B's totals", func() bool {
		got, _ := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
		for p, w := range want {
			if got[p] != w {
				return false
			}
		}
		return true
	})
	if time.Since(stopped) < 30*time.Second {
		// Let A's flush be due when it resumes.
		time.Sleep(30*time.Second - time.Since(stopped))
	}
	resumedAt := len(a.output()) // only what A logs after it resumes counts below
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the resumed instance to drop its lost tasks", func() bool {
		return strings.Contains(a.output()[resumedAt:], `task [0_0] Closed: dropped: partitions lost, nothing committed`)
	})
	if out := a.output()[resumedAt:]; strings.Contains(out, "Not flushing") {
		t.Log("the resumed instance's flush came first and found it was no longer a member")
	} else {
		t.Log("the resumed instance learned it lost its tasks before its flush was due")
	}
	got, _ := changelogTotals(t, broker, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
	for p, w := range want {
		if got[p] != w {
			t.Errorf("changelog %s = %d after A resumed, want %d (a stale write from the paused instance)", p, got[p], w)
		}
	}
	a.stop()
	b.stop()
}
