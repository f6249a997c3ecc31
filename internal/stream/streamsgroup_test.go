package stream

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestStreamsMemberMoves: a streams-group member's state makes only the
// moves memberMoves lists.
func TestStreamsMemberMoves(t *testing.T) {
	all := []memberState{memberUnjoined, memberJoining, memberStable, memberFenced, memberLeaving, memberLeft}
	for _, from := range all {
		for _, to := range all {
			m := newStreamsMember("g", "id", "me")
			m.mu.state = from
			want := slices.Contains(memberMoves[from], to)
			if got := m.move(to); got != want || (got && m.mu.state != to) || (!got && m.mu.state != from) {
				t.Errorf("move %s → %s = %v (now %s), want %v", from, to, got, m.mu.state, want)
			}
		}
	}
	if len(memberMoves[memberLeft]) != 0 {
		t.Error("a member that left moves again")
	}
}

func heartbeatAnswer(epoch int32, active []int32, endpoints ...kmsg.StreamsGroupHeartbeatResponsePartitionsByUserEndpoint) *kmsg.StreamsGroupHeartbeatResponse {
	resp := kmsg.NewPtrStreamsGroupHeartbeatResponse()
	resp.MemberEpoch = epoch
	resp.HeartbeatIntervalMillis = 5000
	if active != nil {
		resp.ActiveTasks, resp.StandbyTasks, resp.WarmupTasks = taskIDs(active), []kmsg.TaskIDs{}, []kmsg.TaskIDs{}
	}
	if endpoints != nil {
		resp.EndpointInformationEpoch = epoch
		resp.PartitionsByUserEndpoint = endpoints
	}
	return resp
}

func endpointOf(host string, port uint16, input string, active ...int32) kmsg.StreamsGroupHeartbeatResponsePartitionsByUserEndpoint {
	ep := kmsg.StreamsGroupHeartbeatResponsePartitionsByUserEndpoint{UserEndpoint: kmsg.Endpoint{Host: host, Port: port}}
	ep.ActivePartitions = []kmsg.StreamsGroupHeartbeatResponsePartitionsByUserEndpointActivePartition{{Topic: input, Partitions: active}}
	return ep
}

// TestStreamsMemberLifecycle: a member joins with epoch 0 and its topology,
// reports what it runs at the epoch it was given, reads the owners of every
// task from the endpoints, drops its assignment when fenced and joins again
// with epoch 0 under the same member id, and leaves with epoch -1.
func TestStreamsMemberLifecycle(t *testing.T) {
	m := newStreamsMember("app", "process-1", "me")
	m.begin(streamsTopology("in", "app-EMPTY_KEY_BY_PRODUCT-repartition", "app-S-changelog", nil, 1), "process-1", "127.0.0.1:8080")

	req, ok := m.request(heartbeatReport{active: []int32{1}})
	if !ok || req.MemberEpoch != 0 || req.Topology == nil || req.MemberID != "process-1" || *req.ProcessID != "process-1" ||
		req.UserEndpoint == nil || req.UserEndpoint.Host != "127.0.0.1" || req.UserEndpoint.Port != 8080 || len(req.ActiveTasks) != 0 || req.InstanceID != nil {
		t.Fatalf("join = %+v, want epoch 0 with the topology, process, endpoint, no tasks and no instance id", req)
	}
	if st, _ := m.state(); st != memberJoining {
		t.Fatalf("after the join was sent: %s", st)
	}

	out := m.answer(heartbeatAnswer(3, []int32{0, 2}, endpointOf("127.0.0.1", 8080, "in", 0, 2), endpointOf("127.0.0.1", 8081, "in", 1)), 0, map[string]string{})
	if out.err != nil || out.fenced || !out.joined {
		t.Fatalf("answer to the join: %+v", out)
	}
	active, epoch, info := m.target()
	if !slices.Equal(active, []int32{0, 2}) || epoch != 3 {
		t.Fatalf("target = %v at epoch %d, want [0 2] at 3", active, epoch)
	}
	if info.owners[0] != "me" || info.owners[2] != "me" || info.owners[1] != "127.0.0.1:8081" || info.servers["127.0.0.1:8081"] != "127.0.0.1:8081" || info.servers["me"] != "127.0.0.1:8080" {
		t.Fatalf("owners %v, servers %v", info.owners, info.servers)
	}

	req, _ = m.request(heartbeatReport{active: []int32{0, 2}, offsets: map[int32]int64{0: -2, 1: 40}, ends: map[int32]int64{1: 50}})
	if req.MemberEpoch != 3 || req.Topology != nil || !slices.Equal(subtopologyTasks(req.ActiveTasks), []int32{0, 2}) || req.StandbyTasks == nil || req.WarmupTasks == nil ||
		len(req.TaskOffsets) != 2 || len(req.TaskEndOffsets) != 1 || req.EndpointInformationEpoch != 3 {
		t.Fatalf("heartbeat = %+v, want epoch 3, tasks [0 2], every task list set, the offsets", req)
	}

	// Task 2 moves to the other member: the answer gives only 0; the
	// owners follow once the endpoints say so, and 2 came from here.
	// The other member's name is known now (its client tag).
	m.answer(heartbeatAnswer(4, []int32{0}, endpointOf("127.0.0.1", 8080, "in", 0), endpointOf("127.0.0.1", 8081, "in", 1, 2)), 3, map[string]string{"127.0.0.1:8081": "other"})
	if active, _, info := m.target(); !slices.Equal(active, []int32{0}) || info.owners[2] != "other" || info.servers["other"] != "127.0.0.1:8081" || m.cameFrom(2) != "me" {
		t.Fatalf("after the move: target %v, owners %v, task 2 came from %q", active, info.owners, m.cameFrom(2))
	}
	// An answer without tasks or endpoints changes neither.
	m.answer(heartbeatAnswer(4, nil), 4, nil)
	if active, _, info := m.target(); !slices.Equal(active, []int32{0}) || info.owners[1] != "other" {
		t.Fatalf("an answer without tasks changed them: %v, %v", active, info.owners)
	}

	fenced := kmsg.NewPtrStreamsGroupHeartbeatResponse()
	fenced.ErrorCode = kerr.FencedMemberEpoch.Code
	out = m.answer(fenced, 4, nil)
	if !out.fenced || !errors.Is(out.err, kerr.FencedMemberEpoch) {
		t.Fatalf("answer FENCED_MEMBER_EPOCH: %+v", out)
	}
	if active, epoch, _ := m.target(); len(active) != 0 || epoch != 0 {
		t.Fatalf("after the fence: target %v at epoch %d, want nothing at 0", active, epoch)
	}
	req, _ = m.request(heartbeatReport{})
	if req.MemberEpoch != 0 || req.MemberID != "process-1" || req.Topology == nil {
		t.Fatalf("after the fence: %+v, want a join with epoch 0 under the same id", req)
	}
	m.answer(heartbeatAnswer(6, []int32{0}), 0, nil)

	invalid := kmsg.NewPtrStreamsGroupHeartbeatResponse()
	invalid.ErrorCode = kerr.StreamsInvalidTopology.Code
	m.answer(invalid, 6, nil)
	if problem, _ := m.readiness(); problem == "" {
		t.Fatal("STREAMS_INVALID_TOPOLOGY leaves no readiness problem")
	}
	m.answer(heartbeatAnswer(6, nil), 6, nil)
	if problem, _ := m.readiness(); problem != "" {
		t.Fatalf("an answered heartbeat leaves the problem %q", problem)
	}

	if !m.leave() {
		t.Fatal("a stable member has nothing to leave")
	}
	// The answer to a heartbeat sent before the leave was asked for is
	// not the leave's.
	m.answer(heartbeatAnswer(6, nil), 6, nil)
	if st, _ := m.state(); st != memberLeaving {
		t.Fatalf("an earlier heartbeat's answer ended the leave: %s", st)
	}
	req, _ = m.request(heartbeatReport{active: []int32{0}})
	if req.MemberEpoch != -1 {
		t.Fatalf("leave = epoch %d, want -1", req.MemberEpoch)
	}
	m.answer(heartbeatAnswer(-1, nil), -1, nil)
	if st, _ := m.state(); st != memberLeft {
		t.Fatalf("after the leave was answered: %s", st)
	}
	if _, ok := m.request(heartbeatReport{}); ok {
		t.Fatal("a member that left sends another heartbeat")
	}
}

// TestStreamsTopologyIsKafkaStreams: the topology is the one Kafka Streams
// sends for the reference application (bench/kstreams-reference with
// group.protocol=streams, replication.factor 1), as Apache Kafka 4.4 stored
// it in __consumer_offsets (StreamsGroupTopologyValue, read with
// kafka-dump-log --offsets-decoder): the coordinator refuses a member whose
// topology differs in any field, list order included (the golden is in
// kmsg's field order). Window changelogs
// follow the totals' in name order; replication.factor -1 is sent as 0.
func TestStreamsTopologyIsKafkaStreams(t *testing.T) {
	const captured = `{"Epoch":0,"Subtopologies":[{"SubtopologyID":"0","SourceTopics":["app-sales"],"SourceTopicRegex":[],` +
		`"StateChangelogTopics":[{"Topic":"app-PRODUCT_AGGREGATED_SALES-changelog","NumPartitions":0,"ReplicationFactor":1,` +
		`"Configs":[{"Key":"cleanup.policy","Value":"compact"},{"Key":"message.timestamp.type","Value":"CreateTime"}]}],` +
		`"RepartitionSinkTopics":["app-EMPTY_KEY_BY_PRODUCT-repartition"],` +
		`"RepartitionSourceTopics":[{"Topic":"app-EMPTY_KEY_BY_PRODUCT-repartition","NumPartitions":0,"ReplicationFactor":1,` +
		`"Configs":[{"Key":"cleanup.policy","Value":"delete"},{"Key":"message.timestamp.type","Value":"CreateTime"},` +
		`{"Key":"retention.ms","Value":"-1"},{"Key":"segment.bytes","Value":"52428800"}]}],"CopartitionGroups":[]}]}`
	encode := func(v any) string {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		// Tags are not part of the topology.
		return strings.ReplaceAll(strings.ReplaceAll(string(b), `,"UnknownTags":null`, ""), `,"UnknownTags":{}`, "")
	}
	if got := encode(streamsTopology("app-sales", "app-EMPTY_KEY_BY_PRODUCT-repartition", "app-PRODUCT_AGGREGATED_SALES-changelog", nil, 1)); got != captured {
		t.Fatalf("topology\n%s\nwant Kafka Streams'\n%s", got, captured)
	}

	top := streamsTopology("in", "app-EMPTY_KEY_BY_PRODUCT-repartition", "app-S-changelog", []string{"app-S-3600000-changelog", "app-S-60000-changelog"}, -1)
	st := top.Subtopologies[0]
	var names []string
	for _, c := range st.StateChangelogTopics {
		names = append(names, c.Topic)
		if c.ReplicationFactor != 0 || c.NumPartitions != 0 {
			t.Fatalf("changelog %s: %d partitions, replication %d; want 0 and 0 (the broker's default for -1)", c.Topic, c.NumPartitions, c.ReplicationFactor)
		}
	}
	if want := []string{"app-S-3600000-changelog", "app-S-60000-changelog", "app-S-changelog"}; !slices.Equal(names, want) {
		t.Fatalf("changelogs %v, want %v", names, want)
	}
}

// TestStreamsMemberTakesWarmups: a coordinator that places warm-ups (Apache
// Kafka 4.4's does not: docs/streams-protocol.md §8) gives them in the
// answer's WarmupTasks; the member keeps them as its warm-up copies, beside
// its standbys, in the assignment the session reconciles copies from, and
// reports them back with the next heartbeat until an answer takes them away.
func TestStreamsMemberTakesWarmups(t *testing.T) {
	m := newStreamsMember("app", "process-1", "me")
	m.begin(streamsTopology("in", "app-EMPTY_KEY_BY_PRODUCT-repartition", "app-S-changelog", nil, 1), "process-1", "127.0.0.1:8080")
	m.request(heartbeatReport{})
	resp := heartbeatAnswer(2, []int32{0})
	resp.StandbyTasks, resp.WarmupTasks = taskIDs([]int32{1}), taskIDs([]int32{2})
	if out := m.answer(resp, 0, map[string]string{}); out.err != nil || !out.joined {
		t.Fatalf("answer: %+v", out)
	}
	mine := m.assignment().standbys["me"]
	if len(mine) != 2 || mine[1] != kindStandby || mine[2] != kindWarmup {
		t.Fatalf("copies %v, want 1 standby and 2 warm-up", mine)
	}
	req, _ := m.request(heartbeatReport{active: []int32{0}, standby: []int32{1}, warmup: []int32{2}})
	if !slices.Equal(subtopologyTasks(req.WarmupTasks), []int32{2}) || !slices.Equal(subtopologyTasks(req.StandbyTasks), []int32{1}) {
		t.Fatalf("heartbeat reports standbys %v, warm-ups %v", req.StandbyTasks, req.WarmupTasks)
	}
	// The warm-up caught up: the next target makes it active.
	m.answer(heartbeatAnswer(3, []int32{0, 2}), 2, nil)
	if active, _, info := m.target(); !slices.Equal(active, []int32{0, 2}) || len(info.standbys["me"]) != 0 {
		t.Fatalf("after the warm-up moved: active %v, copies %v", active, info.standbys["me"])
	}
}
