package stream

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/assign"
	"github.com/salesagg/salesagg/internal/config"
)

// The streams rebalance protocol (KIP-1071, group.protocol=streams): this
// process is a member of a streams group. It describes its topology to the
// group coordinator and sends it, in each StreamsGroupHeartbeat, the tasks
// it runs and its stores' changelog offsets; the coordinator creates the
// internal topics, assigns the active, standby and warm-up tasks of every
// member, and answers with this member's, its epoch and the tasks of every
// member's application.server. Nothing is assigned by a client: no leader
// to lie, no balancer to get wrong.
//
// streamsMember is the member's state, what it sends and what it was
// told; streamsession.go is a session's heartbeat loop, which applies the
// assignment through the same task lifecycle as the classic protocol.

// memberState is where a streams-group member is in its lifecycle.
type memberState int

const (
	// memberUnjoined: no heartbeat sent yet in this session.
	memberUnjoined memberState = iota
	// memberJoining: a heartbeat with epoch 0 (a join) is to be answered.
	memberJoining
	// memberStable: the coordinator gave the member an epoch; it runs what
	// the latest assignment gives it.
	memberStable
	// memberFenced: the coordinator does not know the member at its epoch
	// (fenced, expired, unknown): its tasks are dropped, and it joins
	// again with epoch 0.
	memberFenced
	// memberLeaving: a heartbeat with epoch -1 (a leave) is to be sent.
	memberLeaving
	// memberLeft: the member left the group; nothing more is sent.
	memberLeft
)

func (st memberState) String() string {
	switch st {
	case memberJoining:
		return "joining"
	case memberStable:
		return "stable"
	case memberFenced:
		return "fenced"
	case memberLeaving:
		return "leaving"
	case memberLeft:
		return "left"
	}
	return "unjoined"
}

// memberMoves are the moves a member's state may make; move refuses any
// other.
var memberMoves = map[memberState][]memberState{
	memberUnjoined: {memberJoining, memberLeft},
	memberJoining:  {memberStable, memberFenced, memberLeaving, memberLeft},
	memberStable:   {memberStable, memberFenced, memberLeaving, memberLeft},
	memberFenced:   {memberJoining, memberLeaving, memberLeft},
	memberLeaving:  {memberLeft},
	memberLeft:     {},
}

// instanceTag is the client tag that carries a member's name (its
// group.instance.id, derived or set), so that every instance names every
// member alike: in X-Served-By, /v1/instances, the owners of tasks.
const instanceTag = "salesagg.instance"

// streamsSubtopology is the id of the one subtopology salesagg runs (as
// Kafka Streams numbers it): the input and the repartition topic in,
// PRODUCT_AGGREGATED_SALES and its window stores out.
const streamsSubtopology = "0"

// streamsMember is a process's member of the streams group
// application.id. It outlives sessions: the status and the queries read
// its latest assignment between them. Its fields outside mu are set by
// newStreamsMember; mu guards the rest, which the heartbeat loop of the
// session running writes.
type streamsMember struct {
	group string
	// memberID is the member id, the state dir's process id: it follows
	// the volume, so that a process restarted on it rejoins as the member
	// it was (epoch 0 with the same id: its tasks come back at once).
	memberID string
	// name is the member's name in the assignment's owners (the instance
	// id, as under the classic protocol).
	name string
	// rebalanceTimeout is how long the member may take to revoke.
	rebalanceTimeout time.Duration

	mu struct {
		sync.Mutex
		state memberState
		// epoch is the member epoch the coordinator gave, 0 before a join
		// is answered.
		epoch int32
		// topology is what the member sends with a join (epoch 0).
		topology *kmsg.StreamsGroupHeartbeatRequestTopology
		// self is what the member reports: its process id and endpoint.
		processID string
		endpoint  *kmsg.StreamsGroupHeartbeatRequestUserEndpoint
		// active, standby and warmup are the tasks of the latest
		// assignment (the coordinator sends them only when they change).
		active  []int32
		standby []int32
		warmup  []int32
		// endpointEpoch is the epoch of the endpoint information the
		// member has, sent back so that the coordinator sends it only
		// when it changes.
		endpointEpoch int32
		// info is what the latest assignment tells every member.
		info assignmentInfo
		// interval is the heartbeat interval the coordinator asks for;
		// offsetInterval how often the task offsets are to be sent.
		interval       time.Duration
		offsetInterval time.Duration
		// statuses are the topology's statuses of the latest answer
		// (missing topics, an assignment delayed), for the log and
		// readiness; problem is why the member cannot run, "" when it can.
		statuses []string
		problem  string
		// lastOwner and movedFrom: as the classic balancer's, for the
		// restore's "Took over from" line.
		lastOwner map[int32]string
		movedFrom map[int32]string
	}
}

func newStreamsMember(group, memberID, name string) *streamsMember {
	m := &streamsMember{group: group, memberID: memberID, name: name, rebalanceTimeout: rebalanceTimeout}
	m.mu.lastOwner, m.mu.movedFrom = map[int32]string{}, map[int32]string{}
	return m
}

var _ assignor = (*streamsMember)(nil)

// move changes the state, refusing a move memberMoves does not allow.
// Called with mu held.
func (m *streamsMember) move(to memberState) bool {
	if slices.Contains(memberMoves[m.mu.state], to) {
		m.mu.state = to
		return true
	}
	return false
}

// state returns the member's state and epoch.
func (m *streamsMember) state() (memberState, int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.state, m.mu.epoch
}

// begin starts a session's membership: the topology it describes, its
// process and endpoint.
func (m *streamsMember) begin(topology *kmsg.StreamsGroupHeartbeatRequestTopology, processID, appServer string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.topology, m.mu.processID = topology, processID
	m.mu.endpoint = userEndpoint(appServer)
	// Each session joins with epoch 0 under the same member id, describing
	// the topology again (the input's partitions may have changed): the
	// coordinator takes it for the member it knows.
	m.mu.state, m.mu.epoch = memberUnjoined, 0
	m.mu.active, m.mu.standby, m.mu.warmup = nil, nil, nil
	m.mu.info, m.mu.endpointEpoch = assignmentInfo{}, 0
}

// userEndpoint returns appServer as the protocol's endpoint, nil when it
// is not host:port.
func userEndpoint(appServer string) *kmsg.StreamsGroupHeartbeatRequestUserEndpoint {
	if config.CheckServer(appServer) != nil {
		return nil
	}
	host, port, err := net.SplitHostPort(appServer)
	if err != nil {
		return nil
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil
	}
	return &kmsg.StreamsGroupHeartbeatRequestUserEndpoint{Host: host, Port: uint16(n)}
}

// streamsTopology describes salesagg's one subtopology as Kafka Streams
// describes the reference application's (bench/kstreams-reference), field
// for field: the group coordinator refuses a member whose topology differs
// from the group's in anything (docs/streams-protocol.md §9), and this one
// lets salesagg and Kafka Streams instances run in one group. The input
// topic is the source; the repartition topic (config.RepartitionTopic under
// streams) is sunk into and read; the changelogs of the stores (the totals,
// and each window size, which Kafka Streams would name and configure
// otherwise) are listed by name. Partition counts are left to the
// coordinator (0: the input's), the replication factor is
// replication.factor (Kafka Streams': its replication.factor), and the
// topic configs are Kafka Streams' own, in its order; it lists no
// copartition group for one source topic and one repartition topic.
func streamsTopology(input, repartition string, totals string, windows []string, replication int16) *kmsg.StreamsGroupHeartbeatRequestTopology {
	st := kmsg.StreamsGroupHeartbeatRequestTopologySubtopology{
		SubtopologyID: streamsSubtopology,
		// External source topics only: a repartition topic listed here is
		// taken for a missing source topic (the coordinator's status 1,
		// "Source topics … are missing") and nothing is assigned.
		SourceTopics:            []string{input},
		SourceTopicRegex:        []string{},
		RepartitionSinkTopics:   []string{repartition},
		RepartitionSourceTopics: []kmsg.TopicInfo{internalTopic(repartition, replication, streamsRepartitionConfigs...)},
		StateChangelogTopics:    []kmsg.TopicInfo{internalTopic(totals, replication, "cleanup.policy", "compact", "message.timestamp.type", "CreateTime")},
		CopartitionGroups:       []kmsg.StreamsGroupHeartbeatRequestTopologySubtopologyCopartitionGroup{},
	}
	// A window changelog is compacted only, as salesagg creates it
	// (topics.go).
	for _, c := range windows {
		st.StateChangelogTopics = append(st.StateChangelogTopics, internalTopic(c, replication, "cleanup.policy", "compact", "message.timestamp.type", "CreateTime"))
	}
	// Kafka Streams lists the changelogs by name.
	slices.SortFunc(st.StateChangelogTopics, func(a, b kmsg.TopicInfo) int { return strings.Compare(a.Topic, b.Topic) })
	return &kmsg.StreamsGroupHeartbeatRequestTopology{Epoch: 0, Subtopologies: []kmsg.StreamsGroupHeartbeatRequestTopologySubtopology{st}}
}

// streamsRepartitionConfigs are Kafka Streams' configs of a repartition
// topic, as key, value pairs in the order its topology lists them.
var streamsRepartitionConfigs = []string{"cleanup.policy", "delete", "message.timestamp.type", "CreateTime",
	"retention.ms", "-1", "segment.bytes", "52428800"}

// internalTopic describes an internal topic of the topology: name, replication
// factor (0, the broker's default, for -1) and configs as key/value pairs,
// partitions left to the coordinator.
func internalTopic(name string, replication int16, configs ...string) kmsg.TopicInfo {
	ti := kmsg.NewTopicInfo()
	ti.Topic, ti.ReplicationFactor = name, max(replication, 0)
	for i := 0; i+1 < len(configs); i += 2 {
		c := kmsg.NewTopicInfoConfig()
		c.Key, c.Value = configs[i], configs[i+1]
		ti.Configs = append(ti.Configs, c)
	}
	return ti
}

// heartbeatReport is what the session tells the member to send: the
// tasks it runs and keeps copies of, and (when due) the stores' offsets.
type heartbeatReport struct {
	active, standby, warmup []int32
	// offsets are the changelog offsets of the stores here, per task
	// (assign.Running for an active task that runs); ends the changelog
	// ends; nil when not due.
	offsets, ends map[int32]int64
}

// request returns the next heartbeat: a join (epoch 0) with the topology,
// process and endpoint; afterwards the member's epoch and what it runs; a
// leave (epoch -1) while leaving. ok is false when nothing is to be sent
// (the member left).
func (m *streamsMember) request(r heartbeatReport) (req *kmsg.StreamsGroupHeartbeatRequest, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	req = kmsg.NewPtrStreamsGroupHeartbeatRequest()
	req.Group = m.group
	req.MemberID = m.memberID
	switch m.mu.state {
	case memberLeft:
		return nil, false
	case memberLeaving:
		req.MemberEpoch = -1
		return req, true
	case memberUnjoined, memberFenced:
		m.move(memberJoining)
		m.mu.epoch = 0
	}
	req.MemberEpoch = m.mu.epoch
	req.EndpointInformationEpoch = m.mu.endpointEpoch
	if m.mu.epoch == 0 {
		req.Topology = m.mu.topology
		req.RebalanceTimeoutMillis = int32(m.rebalanceTimeout.Milliseconds())
		req.ProcessID = &m.mu.processID
		req.UserEndpoint = m.mu.endpoint
		// The member's name rides along as a client tag, for the others to
		// name it as it names itself (StreamsGroupDescribe shows the tags).
		req.ClientTags = []kmsg.StreamsGroupHeartbeatRequestClientTag{{Key: instanceTag, Value: m.name}}
		req.ActiveTasks, req.StandbyTasks, req.WarmupTasks = []kmsg.TaskIDs{}, []kmsg.TaskIDs{}, []kmsg.TaskIDs{}
		return req, true
	}
	req.ActiveTasks, req.StandbyTasks, req.WarmupTasks = taskIDs(r.active), taskIDs(r.standby), taskIDs(r.warmup)
	if r.offsets != nil {
		req.TaskOffsets, req.TaskEndOffsets = taskOffsets(r.offsets), taskOffsets(r.ends)
	}
	return req, true
}

// taskIDs returns ps as the protocol's task ids (never nil: an empty list
// says none, nil would say unchanged).
func taskIDs(ps []int32) []kmsg.TaskIDs {
	if len(ps) == 0 {
		return []kmsg.TaskIDs{}
	}
	return []kmsg.TaskIDs{{SubtopologyID: streamsSubtopology, Partitions: slices.Sorted(slices.Values(ps))}}
}

// taskOffsets returns offsets as the protocol's task offsets, by partition.
func taskOffsets(offsets map[int32]int64) []kmsg.TaskOffset {
	out := []kmsg.TaskOffset{}
	for _, p := range slices.Sorted(maps.Keys(offsets)) {
		o := offsets[p]
		if o == assign.Running {
			o = -2 // Kafka Streams' LATEST_OFFSET: a running active task
		}
		out = append(out, kmsg.TaskOffset{SubtopologyID: streamsSubtopology, Partition: p, Offset: o})
	}
	return out
}

// heartbeatOutcome is what an answered heartbeat means for the session.
type heartbeatOutcome struct {
	// err is the coordinator's error (with its message), nil when none.
	err error
	// fenced: the member lost its tasks; the session drops them.
	fenced bool
	// joined: a join was answered (the member has an epoch now).
	joined bool
	// statusChanged: the topology's statuses differ from the last answer.
	statusChanged bool
}

// answer takes the coordinator's answer to a heartbeat sent with epoch
// sentEpoch. names are the members' names by endpoint ("host:port"), as
// their client tags say; another member is named by its endpoint when its
// name is not known.
func (m *streamsMember) answer(resp *kmsg.StreamsGroupHeartbeatResponse, sentEpoch int32, names map[string]string) heartbeatOutcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out heartbeatOutcome
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		msg := ""
		if resp.ErrorMessage != nil {
			msg = *resp.ErrorMessage
		}
		out.err = fmt.Errorf("%w: %s", err, msg)
		switch err {
		case kerr.FencedMemberEpoch, kerr.UnknownMemberID:
			if m.mu.state == memberLeaving {
				m.move(memberLeft)
				return out
			}
			out.fenced = true
			m.move(memberFenced)
			m.mu.epoch = 0
			m.mu.active, m.mu.standby, m.mu.warmup = nil, nil, nil
			// The endpoints are asked for again with the join.
			m.mu.info, m.mu.endpointEpoch = assignmentInfo{}, 0
		case kerr.StreamsInvalidTopology, kerr.StreamsInvalidTopologyEpoch, kerr.StreamsTopologyFenced, kerr.InvalidRequest, kerr.GroupIDNotFound,
			kerr.GroupAuthorizationFailed, kerr.TopicAuthorizationFailed, kerr.UnsupportedVersion:
			m.mu.problem = out.err.Error()
		}
		return out
	}
	m.mu.problem = ""
	if m.mu.state == memberLeaving {
		// Only the answer to the leave itself ends the membership: one to
		// a heartbeat sent before leave was asked for changes nothing.
		if sentEpoch == -1 {
			m.move(memberLeft)
		}
		return out
	}
	out.joined = m.mu.epoch == 0 && resp.MemberEpoch > 0
	m.mu.epoch = resp.MemberEpoch
	m.move(memberStable)
	if resp.HeartbeatIntervalMillis > 0 {
		m.mu.interval = time.Duration(resp.HeartbeatIntervalMillis) * time.Millisecond
	}
	if resp.TaskOffsetIntervalMillis > 0 {
		m.mu.offsetInterval = time.Duration(resp.TaskOffsetIntervalMillis) * time.Millisecond
	}
	var statuses []string
	for _, st := range resp.Status {
		statuses = append(statuses, fmt.Sprintf("%s (status %d)", st.StatusDetail, st.StatusCode))
	}
	if !slices.Equal(statuses, m.mu.statuses) {
		out.statusChanged = true
		m.mu.statuses = statuses
	}
	if resp.ActiveTasks != nil {
		m.mu.active = subtopologyTasks(resp.ActiveTasks)
	}
	if resp.StandbyTasks != nil {
		m.mu.standby = subtopologyTasks(resp.StandbyTasks)
	}
	if resp.WarmupTasks != nil {
		m.mu.warmup = subtopologyTasks(resp.WarmupTasks)
	}
	// The copies this member keeps are its own to know; the owners and
	// the other members' copies come with the endpoint information.
	info := m.mu.info
	info.standbys = maps.Clone(info.standbys)
	if info.standbys == nil {
		info.standbys = map[string]map[int32]copyKind{}
	}
	mine := map[int32]copyKind{}
	for _, p := range m.mu.standby {
		mine[p] = kindStandby
	}
	for _, p := range m.mu.warmup {
		mine[p] = kindWarmup
	}
	info.standbys[m.name] = mine
	if resp.PartitionsByUserEndpoint != nil {
		if names != nil {
			// Without the names (not read), the coordinator is asked for
			// the endpoints again with the next heartbeat.
			m.mu.endpointEpoch = resp.EndpointInformationEpoch
		}
		m.endpointsLocked(&info, resp.PartitionsByUserEndpoint, m.mu.endpoint, names)
	}
	m.mu.info = info
	return out
}

// endpointsLocked fills info's owners, servers and the other members'
// standby copies from the coordinator's tasks by endpoint. A member is
// named by names[endpoint], or its endpoint; this one by its name. Called
// with mu held.
func (m *streamsMember) endpointsLocked(info *assignmentInfo, eps []kmsg.StreamsGroupHeartbeatResponsePartitionsByUserEndpoint, self *kmsg.StreamsGroupHeartbeatRequestUserEndpoint, names map[string]string) {
	info.owners, info.servers = map[int32]string{}, map[string]string{}
	mine := info.standbys[m.name]
	info.standbys = map[string]map[int32]copyKind{m.name: mine}
	for _, ep := range eps {
		server := net.JoinHostPort(ep.UserEndpoint.Host, strconv.Itoa(int(ep.UserEndpoint.Port)))
		name := server
		if n := names[server]; n != "" {
			name = n
		}
		if self != nil && ep.UserEndpoint.Host == self.Host && ep.UserEndpoint.Port == self.Port {
			name = m.name
		}
		info.servers[name] = server
		for _, tp := range ep.ActivePartitions {
			for _, p := range tp.Partitions {
				info.owners[p] = name
			}
		}
		if name == m.name {
			continue
		}
		for _, tp := range ep.StandbyPartitions {
			for _, p := range tp.Partitions {
				if info.standbys[name] == nil {
					info.standbys[name] = map[int32]copyKind{}
				}
				info.standbys[name][p] = kindStandby
			}
		}
	}
	for p, o := range info.owners {
		if last := m.mu.lastOwner[p]; last != "" && last != o {
			m.mu.movedFrom[p] = last
		}
		m.mu.lastOwner[p] = o
	}
}

// subtopologyTasks returns the partitions of salesagg's subtopology among
// ts, sorted.
func subtopologyTasks(ts []kmsg.TaskIDs) []int32 {
	out := []int32{}
	for _, t := range ts {
		if t.SubtopologyID == streamsSubtopology {
			out = append(out, t.Partitions...)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return slices.Compact(out)
}

// target returns the tasks of the latest assignment, the member epoch it
// came with, and what it tells every member.
func (m *streamsMember) target() (active []int32, epoch int32, info assignmentInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.mu.active), m.mu.epoch, m.mu.info
}

// leave makes the next heartbeat a leave. It reports whether one is to be
// sent (the member has an epoch).
func (m *streamsMember) leave() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.state == memberStable {
		return m.move(memberLeaving)
	}
	m.move(memberLeft)
	return false
}

// assignment returns what the latest assignment tells every member.
func (m *streamsMember) assignment() assignmentInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.info
}

// cameFrom returns the member task p ran on before its current owner, ""
// when unknown.
func (m *streamsMember) cameFrom(p int32) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.movedFrom[p]
}

// heartbeatEvery returns the heartbeat interval and the task offsets'
// interval the coordinator asked for (defaults until it answered).
func (m *streamsMember) heartbeatEvery() (interval, offsets time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	interval, offsets = m.mu.interval, m.mu.offsetInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	if offsets <= 0 {
		offsets = time.Minute
	}
	return interval, offsets
}

// setProblem records why the member cannot run, until a heartbeat is
// answered.
func (m *streamsMember) setProblem(problem string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.problem = problem
}

// readiness returns why the member cannot run ("" when it can) and the
// statuses of the latest answer.
func (m *streamsMember) readiness() (problem string, statuses []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.problem, slices.Clone(m.mu.statuses)
}
