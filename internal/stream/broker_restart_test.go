package stream_test

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
	th "github.com/salesagg/salesagg/test/harness"
	"github.com/salesagg/salesagg/test/port"
)

func TestBrokerRestartWhileRunning(t *testing.T) {
	// Scenario: the broker stops and comes back (same address, same data) while the service runs;
	// under each guarantee the service keeps running and ends with exact totals.
	for _, g := range []string{config.ExactlyOnceV2, config.AtLeastOnce} {
		t.Run(g, func(t *testing.T) {
			port := freePort(t)
			data := t.TempDir()
			startBroker := func() *kfake.Cluster {
				c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(data))
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			c := startBroker()
			h := harnessOn(t, c, "127.0.0.1:"+strconv.Itoa(port))
			h.cfg.ProcessingGuarantee = g
			h.createInput(3)
			in := h.start(h.cfg)
			in.waitReady()
			want := map[string]int64{}
			send := func(n int) {
				var recs []*kgo.Record
				for i := 0; i < n; i++ {
					p := "r" + strconv.Itoa(i%9)
					want[p] += 3
					recs = append(recs, event(p, p, 3))
				}
				h.produce(recs...)
			}
			send(90)
			in.waitTotals(want)
			c.Close()
			time.Sleep(2 * time.Second)
			c = startBroker()
			defer c.Close()
			send(90)
			in.waitTotals(want)
			if err := in.stop(); err != nil {
				t.Fatalf("stop: %v", err)
			}
		})
	}
}

func TestBrokerDownAtStart(t *testing.T) {
	// Scenario: the service starts before Kafka: it logs that it waits, retries with backoff, is
	// alive but not ready, and serves once the broker comes up.
	port := freePort(t)
	h := harnessOn(t, nil, "127.0.0.1:"+strconv.Itoa(port))
	in := h.start(h.cfg)
	th.WaitFor(t, 20*time.Second, "a 'Waiting for Kafka' line", th.Holds(func() bool {
		return in.logs.FilterMessage("Waiting for Kafka").Len() >= 2
	}))
	if code, body := get(t, in.http.URL+"/readyz"); code != 503 || !strings.Contains(body, "Kafka unreachable since ") {
		t.Fatalf("/readyz without Kafka = %d %s", code, body)
	}
	if code, _ := get(t, in.http.URL+"/healthz"); code != 200 {
		t.Fatalf("/healthz without Kafka = %d", code)
	}
	select {
	case err := <-in.done:
		t.Fatalf("runtime gave up without Kafka: %v", err)
	default:
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	in.waitReady()
	h.produce(event("late", "late", 5))
	in.waitTotals(map[string]int64{"late": 5})
}

// freePort returns a free loopback port below the ephemeral range, so that no
// client connection takes it while the broker is down.
func freePort(t *testing.T) int {
	t.Helper()
	addr, err := port.Free()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(addr)
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
