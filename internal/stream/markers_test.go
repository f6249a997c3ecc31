package stream_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestCommittedOffsetsPassTransactionMarkers(t *testing.T) {
	// Scenario, for each guarantee: input events come from a transactional producer (a marker
	// after each transaction), and some are produced to a partition their product is not owned
	// by, so the service forwards them through the repartition topic (exactly-once: in its own
	// transactions, with markers). Once the totals are exact, the group's committed offset of
	// every input and repartition partition reaches the partition's end, as kafka-consumer-groups
	// shows it: lag 0, not 1 behind the last marker.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		in := h.start(h.cfg)
		in.waitReady()
		want := map[string]int64{}
		var recs []*kgo.Record
		for i := range 30 {
			p := fmt.Sprintf("m%d", i%6)
			r := event(p, p, int64(i+1))
			// Every third event to a partition that does not own it.
			if i%3 == 0 {
				r.Partition = (sales.Partition([]byte(p), 3) + 1) % 3
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: "manual"})
			}
			want[p] += int64(i + 1)
			recs = append(recs, r)
		}
		cl := h.client(kgo.TransactionalID("upstream"), kgo.RecordPartitioner(manualOrKeyPartitioner{}), kgo.DefaultProduceTopic(h.cfg.InputTopic))
		for i := 0; i < len(recs); i += 10 {
			th.Transaction(t, cl, true, recs[i:i+10]...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		in.waitTotals(want)
		adm := kadm.NewClient(h.client())
		topics := []string{h.cfg.InputTopic}
		if h.cfg.ProcessingGuarantee == config.ExactlyOnceV2 {
			topics = append(topics, h.cfg.RepartitionTopic())
		}
		th.WaitFor(t, 30*time.Second, "committed offsets at every partition's end", func() error {
			ends, err := adm.ListEndOffsets(ctx, topics...)
			if err != nil {
				return err
			}
			offs, err := adm.FetchOffsets(ctx, h.cfg.ApplicationID)
			if err != nil {
				return err
			}
			lag := ""
			ends.Each(func(e kadm.ListedOffset) {
				o, _ := offs.Lookup(e.Topic, e.Partition)
				if e.Offset > 0 && o.At != e.Offset {
					lag += fmt.Sprintf(" %s-%d committed %d end %d", e.Topic, e.Partition, o.At, e.Offset)
				}
			})
			if lag != "" {
				return fmt.Errorf("behind:%s", lag)
			}
			return nil
		})
	})
}
