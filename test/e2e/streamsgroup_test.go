//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// streamsMember is the least of a streams-group member (KIP-1071) that the broker takes: it
// finds the group's coordinator and sends StreamsGroupHeartbeat to it directly (kgo sends no
// streams-group request itself; docs/streams-protocol.md). A step toward group.protocol=streams,
// not the member the service will run.
type streamsMember struct {
	cl       *kgo.Client
	group    string
	memberID string
	epoch    int32
	coord    int32
	topology *kmsg.StreamsGroupHeartbeatRequestTopology
	active   []kmsg.TaskIDs // the tasks last assigned, reported back as owned
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// findCoordinator asks for the group's coordinator.
func (m *streamsMember) findCoordinator(ctx context.Context) error {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = m.group
	req.CoordinatorKeys = []string{m.group}
	resp, err := req.RequestWith(ctx, m.cl)
	if err != nil {
		return err
	}
	for _, c := range resp.Coordinators {
		if err := kerr.ErrorForCode(c.ErrorCode); err != nil {
			return err
		}
		m.coord = c.NodeID
		return nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return err
	}
	m.coord = resp.NodeID
	return nil
}

// heartbeat sends one heartbeat: the topology and process on the first (epoch 0), the tasks
// owned on each.
func (m *streamsMember) heartbeat(ctx context.Context, processID string, leave bool) (*kmsg.StreamsGroupHeartbeatResponse, error) {
	req := kmsg.NewPtrStreamsGroupHeartbeatRequest()
	req.Group = m.group
	req.MemberID = m.memberID
	req.MemberEpoch = m.epoch
	if leave {
		req.MemberEpoch = -1
	}
	if m.epoch == 0 {
		req.Topology = m.topology
		req.RebalanceTimeoutMillis = 30_000
		req.ProcessID = &processID
		req.ClientTags = []kmsg.StreamsGroupHeartbeatRequestClientTag{}
		req.ActiveTasks, req.StandbyTasks, req.WarmupTasks = []kmsg.TaskIDs{}, []kmsg.TaskIDs{}, []kmsg.TaskIDs{}
	} else {
		req.ActiveTasks = append([]kmsg.TaskIDs{}, m.active...)
		req.StandbyTasks, req.WarmupTasks = []kmsg.TaskIDs{}, []kmsg.TaskIDs{}
	}
	kresp, err := m.cl.Broker(int(m.coord)).Request(ctx, req)
	if err != nil {
		return nil, err
	}
	resp := kresp.(*kmsg.StreamsGroupHeartbeatResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		msg := ""
		if resp.ErrorMessage != nil {
			msg = *resp.ErrorMessage
		}
		return resp, fmt.Errorf("%w: %s", err, msg)
	}
	m.epoch = resp.MemberEpoch
	if resp.ActiveTasks != nil {
		m.active = resp.ActiveTasks
	}
	return resp, nil
}

// TestStreamsGroupTakesSalesaggTopology: Apache Kafka's group coordinator takes a member of a
// streams group (KIP-1071) that describes salesagg's topology as Kafka Streams names it (one
// subtopology: the input and the repartition topic in, PRODUCT_AGGREGATED_SALES's changelog):
// it creates the changelog and repartition topics, assigns the member the three tasks of
// subtopology 0 within a few heartbeats, StreamsGroupDescribe shows the member with them, and the
// member leaves. What the service's streams member (issue 33) builds on.
func TestStreamsGroupTakesSalesaggTopology(t *testing.T) {
	appID, input, _ := testNames("ksg")
	createTopic(t, input, 3, nil)
	changelogTopic := sales.ChangelogTopic(appID, sales.StoreName)
	repartition := appID + "-" + sales.StoreName + "-repartition"
	cl := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := &streamsMember{cl: cl, group: appID, memberID: newUUID(), topology: &kmsg.StreamsGroupHeartbeatRequestTopology{
		Epoch: 0,
		Subtopologies: []kmsg.StreamsGroupHeartbeatRequestTopologySubtopology{{
			SubtopologyID: "0",
			// External source topics only: a repartition topic listed here is
			// taken for a missing source topic (status 1, "Source topics … are
			// missing") and nothing is assigned.
			SourceTopics:            []string{input},
			SourceTopicRegex:        []string{},
			StateChangelogTopics:    []kmsg.TopicInfo{{Topic: changelogTopic}},
			RepartitionSinkTopics:   []string{repartition},
			RepartitionSourceTopics: []kmsg.TopicInfo{{Topic: repartition}},
			CopartitionGroups: []kmsg.StreamsGroupHeartbeatRequestTopologySubtopologyCopartitionGroup{{
				SourceTopics: []int16{0}, SourceTopicRegex: []int16{}, RepartitionSourceTopics: []int16{0},
			}},
		}},
	}}
	harness.WaitFor(t, 30*time.Second, "the coordinator of "+appID, func() error { return m.findCoordinator(ctx) })
	processID := newUUID()
	want := []int32{0, 1, 2}
	var statuses []string
	harness.WaitFor(t, 90*time.Second, "the coordinator to assign the member tasks 0_0, 0_1 and 0_2", func() error {
		resp, err := m.heartbeat(ctx, processID, false)
		if errors.Is(err, kerr.NotCoordinator) || errors.Is(err, kerr.CoordinatorNotAvailable) || errors.Is(err, kerr.CoordinatorLoadInProgress) {
			if ferr := m.findCoordinator(ctx); ferr != nil {
				return errors.Join(err, ferr)
			}
		}
		if err != nil {
			return err
		}
		for _, s := range resp.Status {
			if st := fmt.Sprintf("%d %s", s.StatusCode, s.StatusDetail); !slices.Contains(statuses, st) {
				statuses = append(statuses, st)
				t.Logf("heartbeat status: %s", st)
			}
		}
		var got []int32
		for _, ts := range m.active {
			if ts.SubtopologyID == "0" {
				got = append(got, ts.Partitions...)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("member epoch %d, active tasks %v", m.epoch, m.active)
		}
		return nil
	})
	t.Logf("member %s at epoch %d owns %v", m.memberID, m.epoch, m.active)

	topics, err := kadm.NewClient(cl).ListTopics(ctx, changelogTopic, repartition)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{changelogTopic, repartition} {
		if d, ok := topics[name]; !ok || d.Err != nil || len(d.Partitions) != 3 {
			t.Fatalf("topic %s after the join: %+v (listed %v), want 3 partitions created by the coordinator", name, d, ok)
		}
	}

	dreq := kmsg.NewPtrStreamsGroupDescribeRequest()
	dreq.Groups = []string{appID}
	kresp, err := cl.Broker(int(m.coord)).Request(ctx, dreq)
	if err != nil {
		t.Fatal(err)
	}
	dresp := kresp.(*kmsg.StreamsGroupDescribeResponse)
	if len(dresp.Groups) != 1 || kerr.ErrorForCode(dresp.Groups[0].ErrorCode) != nil || len(dresp.Groups[0].Members) != 1 {
		t.Fatalf("StreamsGroupDescribe of %s: %+v", appID, dresp.Groups)
	}
	g := dresp.Groups[0]
	member := g.Members[0]
	var described []int32
	for _, ts := range member.Assignment.ActiveTasks {
		described = append(described, ts.Partitions...)
	}
	slices.Sort(described)
	if member.MemberID != m.memberID || !slices.Equal(described, want) || member.ProcessID != processID {
		t.Fatalf("described member %s (process %s) with active tasks %v; want %s, %s, %v", member.MemberID, member.ProcessID, described, m.memberID, processID, want)
	}
	t.Logf("described: group %s state %s epoch %d, topology epoch %d with %d subtopologies", g.Group, g.State, g.Epoch, g.Topology.Epoch, len(g.Topology.Subtopologies))

	if _, err := m.heartbeat(ctx, processID, true); err != nil {
		t.Fatalf("leaving the group: %v", err)
	}
}
