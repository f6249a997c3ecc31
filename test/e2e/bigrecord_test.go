//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// TestMegabyteEventsAreDeadLettered: on Apache Kafka, under each guarantee, with a dead-letter
// topic: among ordinary events come one with a 1,000,000-byte value and one with a
// 1,000,000-byte key. The service stays up, every other total is exact, and both reach the
// dead-letter topic cut to dlq.max.record.bytes and marked so (before, the copy exceeded the
// producer's batch limit: under exactly-once it was committed past and lost, under
// at-least-once every instance taking the partition exited).
func TestMegabyteEventsAreDeadLettered(t *testing.T) {
	harness.EachGuarantee(t, func(t *testing.T, g string) {
		rng, appID, input, notif := begin(t, "mb-"+slug(g), 0x6d6567)
		dlq := appID + "-dead-letters"
		events := harness.GenEvents(rng, "mb", 20, 400)
		want := harness.TotalsOf(events)
		svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(t.TempDir(), "state"), Input: input, Notif: notif,
			Flags: []string{"--processing.guarantee", g, "--dlq.topic", dlq}})
		svc.WaitRestored(t, 90*time.Second)

		huge := strings.Repeat("m", 1_000_000)
		cl := newClient(t, kgo.ProducerBatchMaxBytes(1_040_000))
		var recs []*kgo.Record
		for i, e := range events {
			recs = append(recs, e.Record(input))
			if i == len(events)/2 {
				recs = append(recs,
					&kgo.Record{Topic: input, Key: []byte("mb-big"), Value: []byte(`{"product":"mb-big","value":1,"pad":"` + huge[:1_000_000-48] + `"}`)},
					&kgo.Record{Topic: input, Key: []byte(huge), Value: []byte(`{"value":1}`)})
			}
		}
		for _, r := range recs {
			if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
				t.Fatalf("producing a %d-byte record: %v", len(r.Key)+len(r.Value), err)
			}
		}
		harness.WaitFor(t, 2*time.Minute, "exact totals over HTTP", func() error {
			if !svc.Alive() {
				t.Fatalf("the service exited: %s", svc.DescribeExit())
			}
			return svc.CheckTotals(want)
		})
		harness.WaitFor(t, time.Minute, "both megabyte events in the dead-letter topic, cut and marked", func() error {
			c, err := readTopic(dlq, 30*time.Second)
			if err != nil {
				return err
			}
			if len(c.Records) != 2 {
				return fmt.Errorf("%d dead letters", len(c.Records))
			}
			for _, r := range c.Records {
				hd := map[string]string{}
				size := len(r.Key) + len(r.Value)
				for _, h := range r.Headers {
					hd[h.Key] = string(h.Value)
					size += len(h.Key) + len(h.Value)
				}
				if hd["salesagg.dlq.reason"] != "too_large" || hd["salesagg.dlq.truncated"] != "true" || size > 262144 {
					return fmt.Errorf("dead letter of %d bytes with headers %v", size, hd)
				}
			}
			return nil
		})
		if err := svc.Ready(); err != nil {
			t.Fatalf("not ready after the megabyte events: %v", err)
		}
		svc.Terminate(t)
	})
}
