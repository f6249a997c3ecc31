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

func TestPausedInstanceIsFencedWhenItResumes(t *testing.T) {
	// Scenario (exactly-once): instance A is paused with SIGSTOP past its session timeout while
	// instance B takes over its partitions; when A resumes, its open transaction is fenced and
	// aborted, and the committed changelog and notifications stay exact.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, "sales-events-v1"); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	send := func(n int) {
		t.Helper()
		var recs []*kgo.Record
		for i := 0; i < n; i++ {
			p := fmt.Sprintf("z%d", i%12)
			want[p] += 150
			recs = append(recs, &kgo.Record{Topic: "sales-events-v1", Key: []byte(p), Value: []byte(fmt.Sprintf(`{"product":%q,"value":150}`, p))})
		}
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--session.timeout.ms", "3000", "--processing.guarantee", "exactly_once_v2"}
	work := t.TempDir()
	a := startService(t, broker, filepath.Join(work, "a"), nil, args...)
	a.waitReady()
	send(240)
	a.waitTotals(want, 30*time.Second)

	// A stops mid-flight: events it polls now sit in its open transaction.
	send(120)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b := startService(t, broker, filepath.Join(work, "b"), nil, args...)
	b.waitReady() // after A's session expired: B owns every partition
	send(120)
	b.waitTotals(want, 60*time.Second)

	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the resumed instance to drop its lost tasks and abort", func() bool {
		return strings.Contains(a.output(), `task [0_0] Closed","task":"0_0","partition":0,"flushed":false`)
	})
	send(120)
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
