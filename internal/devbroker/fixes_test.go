package devbroker

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func startBroker(t *testing.T) *Broker {
	t.Helper()
	b, err := Start(Options{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// request issues req to the broker at exactly its version.
func request[R kmsg.Response](t *testing.T, cl *kgo.Client, req kmsg.Request) R {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Request(ctx, req)
	if err != nil {
		t.Fatalf("%s: %v", kmsg.NameForKey(req.Key()), err)
	}
	return resp.(R)
}

// withGroup starts a consumer of topic in group and waits until the group is
// stable.
func withGroup(t *testing.T, b *Broker, group, topic string) {
	t.Helper()
	adm, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 3, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cons.Close)
	go func() {
		for ctx := context.Background(); ; {
			if fs := cons.PollFetches(ctx); fs.IsClientClosed() {
				return
			}
		}
	}()
	for {
		groups, err := kadm.NewClient(adm).DescribeGroups(ctx, group)
		if err == nil && groups[group].State == "Stable" {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("group %s not stable: %v %+v", group, err, groups)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDescribeTopicPartitionsListsEligibleLeaderReplicas(t *testing.T) {
	// Scenario: the answer Kafka's admin client turns into a TopicDescription has empty, not null,
	// lists of eligible leader replicas (a null one is the NullPointerException of kafka-topics
	// --describe), for a named topic and for all topics, and across pages.
	b := startBroker(t)
	cl := clientOf(t, b)
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 2, 1, nil, "b"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		topics []string
		limit  int32
		want   int
	}{
		{"one topic", []string{"a"}, 2000, 3},
		{"all topics", nil, 2000, 5},
		{"first page", nil, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := kmsg.NewPtrDescribeTopicPartitionsRequest()
			for _, name := range tc.topics {
				rt := kmsg.NewDescribeTopicPartitionsRequestTopic()
				rt.Topic = name
				req.Topics = append(req.Topics, rt)
			}
			req.ResponsePartitionLimit = tc.limit
			resp := request[*kmsg.DescribeTopicPartitionsResponse](t, cl, req)
			n := 0
			for _, topic := range resp.Topics {
				for _, p := range topic.Partitions {
					n++
					if p.EligibleLeaderReplicas == nil || p.LastKnownELR == nil {
						t.Errorf("%s-%d: eligible leader replicas %v, last known %v: want empty lists, not null", *topic.Topic, p.Partition, p.EligibleLeaderReplicas, p.LastKnownELR)
					}
					if len(p.Replicas) != 1 || len(p.ISR) != 1 {
						t.Errorf("%s-%d: replicas %v isr %v", *topic.Topic, p.Partition, p.Replicas, p.ISR)
					}
				}
			}
			if n != tc.want {
				t.Fatalf("%d partitions, want %d", n, tc.want)
			}
			if tc.limit == 4 && (resp.NextCursor == nil || resp.NextCursor.Topic != "b" || resp.NextCursor.Partition != 1) {
				t.Fatalf("next cursor %+v, want b-1", resp.NextCursor)
			}
		})
	}
}

func TestListGroupsFiltersIgnoreCase(t *testing.T) {
	// Scenario: kafka-consumer-groups --list asks for the types "Consumer" and "Classic" (as Java's
	// GroupType prints them); the group is listed whatever the case of the type and state filters,
	// and a filter it does not match leaves it out.
	b := startBroker(t)
	withGroup(t, b, "g1", "t1")
	cl := clientOf(t, b)
	for _, tc := range []struct {
		name          string
		states, types []string
		listed        bool
	}{
		{"no filter", nil, nil, true},
		{"types as Java sends them", nil, []string{"Consumer", "Classic"}, true},
		{"types in lower case", nil, []string{"classic"}, true},
		{"state", []string{"STABLE"}, []string{"Classic"}, true},
		{"other state", []string{"Empty"}, nil, false},
		{"other type", nil, []string{"Share"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := kmsg.NewPtrListGroupsRequest()
			req.StatesFilter, req.TypesFilter = tc.states, tc.types
			resp := request[*kmsg.ListGroupsResponse](t, cl, req)
			listed := false
			for _, g := range resp.Groups {
				if g.Group == "g1" {
					listed = true
					if g.GroupState != "Stable" || g.ProtocolType != "consumer" {
						t.Errorf("group %+v", g)
					}
				}
			}
			if listed != tc.listed {
				t.Fatalf("listed %v, want %v: %+v", listed, tc.listed, resp.Groups)
			}
		})
	}
}

func TestDescribeGroupsAnswersAsKafka(t *testing.T) {
	// Scenario: a member's host is "/ip" as Kafka gives it, the member's assignment is there, and an
	// unknown group is GROUP_ID_NOT_FOUND with a message naming it.
	b := startBroker(t)
	withGroup(t, b, "g1", "t1")
	cl := clientOf(t, b)
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{"g1", "nope"}
	resp := request[*kmsg.DescribeGroupsResponse](t, cl, req)
	if len(resp.Groups) != 2 {
		t.Fatalf("groups %+v", resp.Groups)
	}
	g := resp.Groups[0]
	if g.State != "Stable" || len(g.Members) != 1 || g.Members[0].ClientHost != "/127.0.0.1" || len(g.Members[0].MemberAssignment) == 0 {
		t.Fatalf("group %+v", g)
	}
	if n := resp.Groups[1]; n.ErrorCode == 0 || n.ErrorMessage == nil || !strings.Contains(*n.ErrorMessage, "nope") {
		t.Fatalf("unknown group %+v", n)
	}
}

func TestCompletedAnswersUnderConcurrency(t *testing.T) {
	// Scenario: many clients ask the completed questions at once while a group consumes: every
	// answer comes (the hooks never block kfake's request loop) and is complete.
	b := startBroker(t)
	withGroup(t, b, "g1", "t1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	report := func(p string) {
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, p)
	}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
			if err != nil {
				report(err.Error())
				return
			}
			defer cl.Close()
			for j := 0; j < 20; j++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				dtp := kmsg.NewPtrDescribeTopicPartitionsRequest()
				dtp.ResponsePartitionLimit = 2000
				r1, err1 := cl.Request(ctx, dtp)
				lg := kmsg.NewPtrListGroupsRequest()
				lg.TypesFilter = []string{"Classic"}
				r2, err2 := cl.Request(ctx, lg)
				cancel()
				if err1 != nil || err2 != nil {
					report("request failed: " + errString(err1) + " " + errString(err2))
					return
				}
				if p := r1.(*kmsg.DescribeTopicPartitionsResponse).Topics[0].Partitions[0]; p.EligibleLeaderReplicas == nil {
					report("null eligible leader replicas")
				}
				if len(r2.(*kmsg.ListGroupsResponse).Groups) != 1 {
					report("group not listed")
				}
			}
		}()
	}
	wg.Wait()
	if len(problems) > 0 {
		t.Fatalf("%d problems, e.g. %v", len(problems), problems[:min(5, len(problems))])
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// clientOf is a client of b, closed at the end of the test.
func clientOf(t *testing.T, b *Broker) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
