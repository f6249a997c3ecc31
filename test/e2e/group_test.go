//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// TestSeveralInstancesOneGroup: on Apache Kafka, with the default group config, one group scales 1 → 3 → 2 → 3 (SIGTERM one for good, add one, SIGKILL one and restart it on its state dir) while events flow, some with an empty key or on a partition that does not own them; no two instances ever run one task, every instance answers every product with its exact total, served by the one running its task (one forwarding hop), and the changelog holds the same totals, under each guarantee (harness.SeveralInstancesOneGroup, which cmd/salesagg runs on the in-process kfake broker).
func TestSeveralInstancesOneGroup(t *testing.T) {
	harness.EachGuarantee(t, func(t *testing.T, g string) {
		rng, appID, input, notif := begin(t, "scale-"+slug(g), 0x7363616c)
		events := harness.GenEvents(rng, "sc", 60, 6000)
		harness.Scatter(rng, events, harness.ScalePartitions)
		harness.SeveralInstancesOneGroup(t, harness.ScaleSetup{
			// Default group config: no group.instance.id, no session.timeout.ms.
			Start: func(dir string) *harness.Service {
				return startService(t, harness.ServiceConfig{AppID: appID, StateDir: dir, Input: input, Notif: notif, CommitMs: 200,
					Flags: []string{"--processing.guarantee", g}})
			},
			Bootstrap: bootstrap,
			Changelog: harness.ChangelogTopic(appID),
			Client:    newClient(t, kgo.RecordPartitioner(harness.HeaderPartitioner{})),
			Input:     input,
			Events:    events,
			Batch:     30, Every: 200 * time.Millisecond,
			ReadyTimeout: 90 * time.Second,
			Drain:        2 * time.Minute,
		})
	})
}
