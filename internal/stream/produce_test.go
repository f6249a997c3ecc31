package stream_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	th "github.com/salesagg/salesagg/test/harness"
)

// readAll reads every committed record of topic until want arrived or
// timeout passed.
func (h *harness) readAll(topic string, want int, timeout time.Duration) []*kgo.Record {
	h.t.Helper()
	cl := h.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxBytes(4<<20), kgo.FetchMaxPartitionBytes(4<<20))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*kgo.Record
	for len(got) < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	return got
}

func headers(r *kgo.Record) map[string]string {
	out := map[string]string{}
	for _, h := range r.Headers {
		out[h.Key] = string(h.Value)
	}
	return out
}

func TestMegabyteRecordsAreDeadLetteredCut(t *testing.T) {
	// Scenario, for both guarantees: among ordinary events come one with a 1,000,000-byte value
	// and one with a 1,000,000-byte key. Both are bad events (too_large); their dead-letter copies
	// are cut to dlq.max.record.bytes and marked with their original sizes, the producer's own
	// salesagg.dlq.* header is replaced, the service stays up, and every other total is exact.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		cfg := h.cfg
		cfg.DLQTopic = "sales-dead-letters"
		in := h.start(cfg)
		in.waitReady()

		huge := strings.Repeat("x", 1_000_000)
		bigValue := &kgo.Record{Key: []byte("p1"), Value: []byte(`{"product":"p1","value":1,"pad":"` + huge[:1_000_000-40] + `"}`),
			Headers: []kgo.RecordHeader{{Key: sales.DLQReasonHeader, Value: []byte("forged")}, {Key: "trace", Value: []byte("value")}}}
		bigKey := &kgo.Record{Key: []byte(huge), Value: []byte(`{"value":1}`), Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("key")}}}
		want := map[string]int64{}
		var recs []*kgo.Record
		for i := range 30 {
			p := fmt.Sprintf("p%d", i%10)
			recs = append(recs, event(p, p, int64(i+1)))
			want[p] += int64(i + 1)
		}
		recs = append(recs[:15], append([]*kgo.Record{bigValue, bigKey}, recs[15:]...)...)
		cl := h.client(kgo.ProducerBatchMaxBytes(2<<20), kgo.RecordPartitioner(manualOrKeyPartitioner{}))
		for _, r := range recs {
			r.Topic = cfg.InputTopic
		}
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		in.waitTotals(want)

		got := h.readAll(cfg.DLQTopic, 2, 30*time.Second)
		if len(got) != 2 {
			t.Fatalf("dead-letter topic holds %d records, want 2", len(got))
		}
		for _, r := range got {
			hd := headers(r)
			size := len(r.Key) + len(r.Value)
			for k, v := range hd {
				size += len(k) + len(v)
			}
			t.Logf("dead letter %s: key %d bytes, value %d bytes, headers %v", hd["trace"], len(r.Key), len(r.Value), hd[sales.DLQTruncatedHeader])
			switch {
			case hd[sales.DLQReasonHeader] != sales.ReasonTooLarge:
				t.Errorf("dead letter %s has reason %q, want %s (a forged one replaced)", hd["trace"], hd[sales.DLQReasonHeader], sales.ReasonTooLarge)
			case hd[sales.DLQTruncatedHeader] != "true":
				t.Errorf("dead letter %s is not marked truncated: %v", hd["trace"], hd)
			case size > int(cfg.DLQMaxRecordBytes):
				t.Errorf("dead letter %s takes %d bytes, over dlq.max.record.bytes %d", hd["trace"], size, cfg.DLQMaxRecordBytes)
			case hd["trace"] == "value" && (hd[sales.DLQValueBytesHeader] != strconv.Itoa(len(bigValue.Value)) || !strings.HasPrefix(string(bigValue.Value), string(r.Value))):
				t.Errorf("value dead letter: original size %s, value not a prefix of the event's", hd[sales.DLQValueBytesHeader])
			case hd["trace"] == "key" && (hd[sales.DLQKeyBytesHeader] != "1000000" || !strings.HasPrefix(huge, string(r.Key)) || len(r.Key) == 0):
				t.Errorf("key dead letter: original size %s, key of %d bytes", hd[sales.DLQKeyBytesHeader], len(r.Key))
			}
		}
		if ready, reason := in.rt.Ready(); !ready {
			t.Fatalf("not ready after the megabyte records: %s", reason)
		}
		if code, reason := in.health(); code != http.StatusOK {
			t.Fatalf("/healthz %d: %s", code, reason)
		}
	})
}

func TestFailedProduceCommitsNothingPastIt(t *testing.T) {
	// Scenario, for both guarantees: the dead-letter topic takes records of 2 KiB at most (its
	// max.message.bytes), and a bad event's copy is bigger: the broker rejects it. The cycle
	// commits nothing past it (no committed input offset beyond the bad event), the task says why
	// in /v1/tasks and, past task.timeout.ms, in /healthz, and it retries with backoff. Once the
	// topic takes bigger records, the copy is dead-lettered, the totals are exact and the process
	// is healthy again.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		guarantee := h.cfg.ProcessingGuarantee
		cfg := h.cfg
		cfg.DLQTopic = "sales-dead-letters"
		cfg.TaskTimeout = time.Second
		adm := kadm.NewClient(h.client())
		small := "2048"
		if _, err := adm.CreateTopic(context.Background(), 3, 1, map[string]*string{"max.message.bytes": &small}, cfg.DLQTopic); err != nil {
			t.Fatal(err)
		}
		in := h.start(cfg)
		in.waitReady()

		product := productOn("fail-", 1, 3)
		want := map[string]int64{product: 0}
		var recs []*kgo.Record
		for i := range 10 {
			recs = append(recs, event(product, product, int64(i+1)))
			want[product] += int64(i + 1)
		}
		// Not JSON: a bad event whose copy (5,000 bytes) the topic refuses.
		bad := eventTo(1, product, product, 0)
		bad.Value = []byte(strings.Repeat("?", 5000))
		recs = append(recs, bad)
		for i := range 10 {
			recs = append(recs, event(product, product, int64(100+i)))
			want[product] += int64(100 + i)
		}
		h.produce(recs...)
		badOffset := bad.Offset

		th.WaitFor(t, 30*time.Second, "task 0_1 to show the failed produce", th.Holds(func() bool {
			ts, ok := in.taskStatus("0_1")
			return ok && ts.Failing != nil && strings.Contains(ts.Failing.Error, "MESSAGE_TOO_LARGE")
		}))
		th.WaitFor(t, 30*time.Second, "/healthz to report task 0_1", th.Holds(func() bool {
			code, reason := in.health()
			return code == http.StatusServiceUnavailable && strings.Contains(reason, "0_1")
		}))
		offs, err := adm.FetchOffsets(context.Background(), cfg.ApplicationID)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := offs.Lookup(cfg.InputTopic, 1); ok && o.At > badOffset {
			t.Fatalf("input offset %d committed past the bad event at %d whose dead letter failed", o.At, badOffset)
		}

		big := "1048588"
		if _, err := adm.AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "max.message.bytes", Value: &big}}, cfg.DLQTopic); err != nil {
			t.Fatal(err)
		}
		in.waitTotals(want)
		got := h.readAll(cfg.DLQTopic, 1, 30*time.Second)
		if len(got) < 1 || string(got[0].Value) != string(bad.Value) {
			t.Fatalf("dead-letter topic holds %d records, want the bad event", len(got))
		}
		if guarantee == config.ExactlyOnceV2 && len(got) != 1 {
			t.Fatalf("dead-letter topic holds %d copies under exactly-once, want 1", len(got))
		}
		th.WaitFor(t, 30*time.Second, "/healthz 200 again", th.Holds(func() bool {
			code, _ := in.health()
			return code == http.StatusOK
		}))
		cl, _, _ := h.changelog(cfg)
		equalTotals(t, "changelog", map[string]int64{product: cl[product]}, want)
	})
}

// failHeartbeats answers UNKNOWN_MEMBER_ID to every Heartbeat while on is
// set: the group coordinator no longer knows the member.
func failHeartbeats(h *harness, on *atomic.Bool) {
	h.cluster.ControlKey(int16(kmsg.Heartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		resp := kreq.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
}

func TestLostMemberWritesNothingAtLeastOnce(t *testing.T) {
	// Scenario (at-least-once): the group coordinator stops knowing A as a member while A holds
	// folded events: totals, an event to forward to another task, a bad event to dead-letter.
	// A learns it (its flush asks the coordinator first; franz-go's heartbeat may tell it
	// sooner) and writes nothing: not to the changelog, the repartition topic or the dead-letter
	// topic, which A writes only with a cycle, after that check. Once the coordinator answers
	// again, A rejoins, folds the events again, and everything is written exactly.
	h := newHarness(t)
	h.createInput(3)
	cfg := h.cfg
	cfg.ProcessingGuarantee = config.AtLeastOnce
	cfg.CommitInterval = 2 * time.Second
	cfg.CommitIdle = 0
	cfg.DLQTopic = "sales-dead-letters"
	in := h.start(cfg)
	in.waitReady()
	var lost atomic.Bool
	failHeartbeats(h, &lost)
	lost.Store(true)

	product := productOn("zombie-", 1, 3)
	forwarded := eventTo(0, product, product, 5) // read by task 0_0, owned by 0_1
	bad := eventTo(1, product, product, 0)
	bad.Value = []byte("not json")
	h.produce(event(product, product, 10), forwarded, bad)
	// Its flush's check or franz-go's own heartbeat learns it first.
	th.WaitFor(t, 30*time.Second, "A to drop its tasks", th.Holds(func() bool {
		return in.logs.FilterMessageSnippet("the group coordinator says this member is not in its generation").Len() > 0 ||
			in.logs.FilterMessageSnippet("Lost tasks").Len() > 0
	}))
	for _, topic := range []string{cfg.ChangelogTopic(), cfg.RepartitionTopic(), cfg.DLQTopic} {
		if got := h.readAll(topic, 1, 2*time.Second); len(got) != 0 {
			t.Fatalf("%s got %d records from a member the coordinator did not know", topic, len(got))
		}
	}
	lost.Store(false)
	in.waitReady()
	in.waitTotals(map[string]int64{product: 15})
	if got := h.readAll(cfg.DLQTopic, 1, 30*time.Second); len(got) != 1 {
		t.Fatalf("dead-letter topic holds %d records, want 1", len(got))
	}
}
