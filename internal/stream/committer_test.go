package stream

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestCommitterDoesNotPutBackForgottenOffsets(t *testing.T) {
	// Scenario (at-least-once): a commit of partition 1's offset is in flight when the partition
	// is lost (forgotten); the commit fails. The failed offset is not put back for the next
	// commit, which would rewind a partition another member owns now; an offset of a partition
	// still held is put back; and only held partitions are committed at all.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	inFlight, failNow := make(chan struct{}), make(chan struct{})
	c.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetCommitRequest)
		close(inFlight)
		c.SleepControl(func() { <-failNow })
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range req.Topics {
			t := kmsg.NewOffsetCommitResponseTopic()
			t.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				p := kmsg.NewOffsetCommitResponseTopicPartition()
				p.Partition, p.ErrorCode = rp.Partition, kerr.CoordinatorLoadInProgress.Code
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp, nil, true
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in"), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	held := map[int32]bool{0: true, 1: true}
	cm := committer{kick: make(chan struct{}, 1), held: func(_ string, p int32) bool { return held[p] },
		send: func(ctx context.Context, o map[string]map[int32]kgo.EpochOffset) error { return commitSync(ctx, cl, o) }}
	cm.report("in", 0, 10)
	cm.report("in", 1, 20)
	cm.report("in", 2, 30) // not held: never committed
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- cm.commit(ctx)
	}()
	<-inFlight
	cm.forget("in", []int32{1}) // lost while its commit is in flight
	delete(held, 1)
	close(failNow)
	if err := <-done; err == nil {
		t.Fatal("the commit did not fail")
	}
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if got := cm.pending["in"]; len(got) != 1 || got[0].Offset != 10 {
		t.Fatalf("pending after the failed commit = %v, want only partition 0 at 10 put back", got)
	}
}
