package stream_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
)

func TestBrokerRestartWhileRunning(t *testing.T) {
	// Scenario: the broker stops and comes back (same address, same data) while the service runs;
	// under each guarantee the service keeps running and ends with exact totals.
	for _, g := range []string{config.ExactlyOnceV2, config.AtLeastOnce} {
		t.Run(g, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			l.Close()
			data := t.TempDir()
			startBroker := func() *kfake.Cluster {
				c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(data))
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			c := startBroker()
			h := &harness{t: t, cluster: c, addr: "127.0.0.1:" + strconv.Itoa(port), stateDir: t.TempDir()}
			h.cfg = config.Default()
			h.cfg.BootstrapServers = []string{h.addr}
			h.cfg.StateDir = h.stateDir
			h.cfg.ProcessingGuarantee = g
			h.cfg.CommitInterval = 100 * time.Millisecond
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
