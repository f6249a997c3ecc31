package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/assign"
	"github.com/salesagg/salesagg/internal/config"
)

// The group balancer.
//
// Tasks, not topic-partitions, are the unit of assignment: task p is input
// partition p and repartition partition p, always given to one member
// together (its changelog partition p follows, since only the task writes
// it). The decision is internal/assign's pure function; this file is its
// adapter to franz-go's GroupBalancer and the wire formats it needs.
//
// Member metadata (JoinGroup) is the standard consumer protocol's
// ConsumerMemberMetadata v2 (topics, owned partitions, generation), so that
// Kafka's tools can read it, with salesagg's UserData:
//
//	version     uint8   assign.Version
//	partitions  int32   the input partition count the member works with
//	processID   uint16 length + bytes: the state dir's process id
//	appServer   uint16 length + bytes: application.server, host:port of its
//	            HTTP server (absent from older members)
//	offsets     uint16 count, then per task: int32 task, int64 the next
//	            changelog offset its local store reflects, or -2 for an
//	            active task it runs (version 2; absent from older members)
//	ends        uint16 count, then per task: int32 task, int64 the changelog
//	            end offset that offset was measured against (version 3:
//	            the tasks of its standby copies; see assign.Member.Ends)
//
// Newer versions append fields; a reader takes the prefix it knows.
//
// Assignment (SyncGroup) is a ConsumerMemberAssignment with both topics'
// partitions of the member's tasks, and UserData:
//
//	version     uint8
//	partitions  int32   the leader's input partition count
//	owners      uint16 count, then per task: int32 task, uint16 length + bytes
//	            (the owner's group.instance.id, or member id when dynamic)
//	servers     uint16 count, then per member: its name as in owners and its
//	            application.server (absent from older leaders)
//	standbys    uint16 count, then per member: its name, uint16 count, then
//	            per task: int32 task, uint8 kind (0 standby, 1 warm-up,
//	            2 incoming: the task is withheld for this member until its
//	            holder let go) (version 2)
//	probe       uint8: 1 when tasks wait for warm-ups to catch up, so the
//	            members building them rejoin when they have (version 2)
//
// so that every member knows which member owns each task (queries to a
// non-owner name the owner).

// protocolName is the group protocol salesagg members speak.
const protocolName = "salesagg-tasks"

// memberInfo is what a member reports in its JoinGroup metadata.
type memberInfo struct {
	version    int
	partitions int32
	processID  string
	appServer  string
	// offsets are the member's local stores (see assign.Member.Offsets);
	// nil when an older member reported none. ends are the changelog ends
	// some were measured against (assign.Member.Ends).
	offsets map[int32]int64
	ends    map[int32]int64
}

func encodeMemberInfo(m memberInfo) []byte {
	b := []byte{byte(assign.Version)}
	b = binary.BigEndian.AppendUint32(b, uint32(m.partitions))
	b = appendString(b, m.processID)
	b = appendString(b, m.appServer)
	b = appendOffsets(b, m.offsets)
	return appendOffsets(b, m.ends)
}

// appendOffsets appends a count and int32 task, int64 offset pairs.
func appendOffsets(b []byte, offs map[int32]int64) []byte {
	tasks := slices.Sorted(maps.Keys(offs))
	if len(tasks) > 0xffff {
		tasks = tasks[:0xffff]
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(tasks)))
	for _, t := range tasks {
		b = binary.BigEndian.AppendUint32(b, uint32(t))
		b = binary.BigEndian.AppendUint64(b, uint64(offs[t]))
	}
	return b
}

// readOffsets reads what appendOffsets wrote.
func readOffsets(b []byte) (map[int32]int64, []byte, bool) {
	if len(b) < 2 {
		return nil, b, false
	}
	n := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if len(b) < n*12 {
		return nil, b, false
	}
	out := make(map[int32]int64, n)
	for range n {
		out[int32(binary.BigEndian.Uint32(b))] = int64(binary.BigEndian.Uint64(b[4:]))
		b = b[12:]
	}
	return out, b, true
}

func decodeMemberInfo(b []byte) (memberInfo, error) {
	if len(b) < 5 || b[0] == 0 {
		return memberInfo{}, fmt.Errorf("unreadable member metadata (%d bytes)", len(b))
	}
	m := memberInfo{version: int(b[0]), partitions: int32(binary.BigEndian.Uint32(b[1:]))}
	var ok bool
	var rest []byte
	if m.processID, rest, ok = readString(b[5:]); !ok {
		return memberInfo{}, errors.New("unreadable member metadata: process id")
	}
	if len(rest) > 0 {
		if m.appServer, rest, ok = readString(rest); !ok {
			return memberInfo{}, errors.New("unreadable member metadata: application server")
		}
	}
	if len(rest) >= 2 {
		if m.offsets, rest, ok = readOffsets(rest); !ok {
			return memberInfo{}, errors.New("unreadable member metadata: store offsets")
		}
	}
	if m.version >= 3 && len(rest) >= 2 {
		if m.ends, rest, ok = readOffsets(rest); !ok {
			return memberInfo{}, errors.New("unreadable member metadata: changelog ends")
		}
	}
	return m, nil
}

// assignmentInfo is what the leader tells every member besides its tasks.
type assignmentInfo struct {
	version    int
	partitions int32
	owners     map[int32]string
	// servers maps each member (by its name in owners) to its
	// application.server.
	servers map[string]string
	// standbys maps each member (by name) to its standby tasks and their
	// kind.
	standbys map[string]map[int32]copyKind
	// probe: some tasks wait for warm-ups to catch up.
	probe bool
	// badServers are the members (by name) whose advertised
	// application.server is not host:port, with why; they are left out of
	// servers (not kept on the wire: every member checks for itself).
	badServers map[string]string
	// from names, per task, the member it ran on before its owner in
	// owners, when the leader knows: a member that joins in the round a
	// task reaches it never saw the task's last owner itself.
	from map[int32]string
}

// copyKind is what a standby copy is for (its byte on the wire).
type copyKind byte

const (
	// kindStandby: a standby replica (num.standby.replicas).
	kindStandby copyKind = iota
	// kindWarmup: a warm-up on the member a task should move to once it
	// caught up.
	kindWarmup
	// kindIncoming: the copy kept on the member a withheld task goes to,
	// until its holder let go of it.
	kindIncoming
)

func (k copyKind) String() string {
	switch k {
	case kindWarmup:
		return "warmup"
	case kindIncoming:
		return "incoming"
	}
	return "standby"
}

func encodeAssignmentInfo(a assignmentInfo) []byte {
	b := []byte{byte(assign.Version)}
	b = binary.BigEndian.AppendUint32(b, uint32(a.partitions))
	tasks := slices.Sorted(maps.Keys(a.owners))
	b = binary.BigEndian.AppendUint16(b, uint16(len(tasks)))
	for _, t := range tasks {
		b = binary.BigEndian.AppendUint32(b, uint32(t))
		b = appendString(b, a.owners[t])
	}
	names := slices.Sorted(maps.Keys(a.servers))
	b = binary.BigEndian.AppendUint16(b, uint16(len(names)))
	for _, n := range names {
		b = appendString(b, n)
		b = appendString(b, a.servers[n])
	}
	names = slices.Sorted(maps.Keys(a.standbys))
	b = binary.BigEndian.AppendUint16(b, uint16(len(names)))
	for _, n := range names {
		b = appendString(b, n)
		tasks := slices.Sorted(maps.Keys(a.standbys[n]))
		b = binary.BigEndian.AppendUint16(b, uint16(len(tasks)))
		for _, t := range tasks {
			b = binary.BigEndian.AppendUint32(b, uint32(t))
			b = append(b, byte(a.standbys[n][t]))
		}
	}
	if a.probe {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	tasks = slices.Sorted(maps.Keys(a.from))
	b = binary.BigEndian.AppendUint16(b, uint16(len(tasks)))
	for _, t := range tasks {
		b = binary.BigEndian.AppendUint32(b, uint32(t))
		b = appendString(b, a.from[t])
	}
	return b
}

func decodeAssignmentInfo(b []byte) (assignmentInfo, error) {
	if len(b) < 7 || b[0] == 0 {
		return assignmentInfo{}, fmt.Errorf("unreadable assignment info (%d bytes)", len(b))
	}
	a := assignmentInfo{version: int(b[0]), partitions: int32(binary.BigEndian.Uint32(b[1:])), owners: map[int32]string{}}
	n := int(binary.BigEndian.Uint16(b[5:]))
	b = b[7:]
	for i := 0; i < n; i++ {
		if len(b) < 4 {
			return assignmentInfo{}, errors.New("unreadable assignment info: owners")
		}
		t := int32(binary.BigEndian.Uint32(b))
		owner, rest, ok := readString(b[4:])
		if !ok {
			return assignmentInfo{}, errors.New("unreadable assignment info: owner")
		}
		a.owners[t] = owner
		b = rest
	}
	a.servers = map[string]string{}
	if len(b) >= 2 {
		n := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		for i := 0; i < n; i++ {
			name, rest, ok := readString(b)
			if !ok {
				return assignmentInfo{}, errors.New("unreadable assignment info: servers")
			}
			addr, rest, ok := readString(rest)
			if !ok {
				return assignmentInfo{}, errors.New("unreadable assignment info: server")
			}
			a.servers[name] = addr
			b = rest
		}
	}
	a.standbys = map[string]map[int32]copyKind{}
	if len(b) >= 2 {
		n := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		for range n {
			name, rest, ok := readString(b)
			if !ok || len(rest) < 2 {
				return assignmentInfo{}, errors.New("unreadable assignment info: standbys")
			}
			k := int(binary.BigEndian.Uint16(rest))
			rest = rest[2:]
			if len(rest) < k*5 {
				return assignmentInfo{}, errors.New("unreadable assignment info: standby tasks")
			}
			tasks := make(map[int32]copyKind, k)
			for range k {
				kind := copyKind(rest[4])
				if kind > kindIncoming {
					kind = kindStandby // a newer kind: still a copy
				}
				tasks[int32(binary.BigEndian.Uint32(rest))] = kind
				rest = rest[5:]
			}
			a.standbys[name] = tasks
			b = rest
		}
		a.probe = len(b) >= 1 && b[0] == 1
		if len(b) >= 1 {
			b = b[1:]
		}
	}
	// A leader of the version before from sends none.
	if len(b) >= 2 {
		n := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		for range n {
			if len(b) < 4 {
				return assignmentInfo{}, errors.New("unreadable assignment info: from")
			}
			t := int32(binary.BigEndian.Uint32(b))
			from, rest, ok := readString(b[4:])
			if !ok {
				return assignmentInfo{}, errors.New("unreadable assignment info: from")
			}
			if a.from == nil {
				a.from = map[int32]string{}
			}
			a.from[t] = from
			b = rest
		}
	}
	return a, nil
}

func appendString(b []byte, s string) []byte {
	if len(s) > 0xffff {
		s = s[:0xffff]
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func readString(b []byte) (string, []byte, bool) {
	if len(b) < 2 {
		return "", nil, false
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return "", nil, false
	}
	return string(b[2 : 2+n]), b[2+n:], true
}

// taskBalancer is salesagg's kgo.GroupBalancer. The leader decodes every
// member's metadata into assign.Member and balances with assign.Tasks; every
// member parses its assignment and keeps the owners map it carries.
type taskBalancer struct {
	input, repartition, changelog string
	log                           *zap.Logger
	// name is this member's name in the assignment's owners and servers
	// (its group.instance.id).
	name string
	// rejoin, if set, is called (it must not block) when an assignment
	// advertises an address for this member other than its own: a static
	// member that restarted on another port got its old assignment back
	// without a rebalance, so the leader never saw its new metadata.
	rejoin func()
	// opts are the caught-up-first settings; the leader fills in the end
	// offsets each round.
	opts assign.Options
	// offsets, if set, returns this member's local store checkpoints for
	// its JoinGroup metadata, and the changelog ends some were measured
	// against (see assign.Member.Offsets and Ends).
	offsets func() (offsets, ends map[int32]int64)
	// endOffsets, if set, returns the changelog end offsets per task, for
	// the leader's caught-up-first placement.
	endOffsets func(context.Context) (map[int32]int64, error)

	// mu guards every field inside it.
	mu struct {
		sync.Mutex
		// self is what this member reports: its partition count and
		// process id.
		self memberInfo
		info assignmentInfo // from the latest SyncGroup
		// synced are the partitions of the latest SyncGroup, per topic:
		// what the group gives this member now.
		synced map[string][]int32
		// lastOwner is the last owner each task was seen with, and
		// movedFrom the one before it when the task changed hands.
		lastOwner map[int32]string
		movedFrom map[int32]string
	}
}

// cameFrom returns the member task p was last seen on before it moved to
// its current owner, "" when unknown.
func (b *taskBalancer) cameFrom(p int32) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.movedFrom[p]
}

// start begins a group session: self is what the member reports; the owners
// of the previous session are forgotten.
func (b *taskBalancer) start(self memberInfo) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.self = self
	b.mu.info = assignmentInfo{}
	b.mu.synced = nil
}

// synced returns the partitions the latest SyncGroup gave this member.
func (b *taskBalancer) synced() map[string][]int32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string][]int32, len(b.mu.synced))
	for t, ps := range b.mu.synced {
		out[t] = slices.Clone(ps)
	}
	return out
}

var _ kgo.GroupBalancer = (*taskBalancer)(nil)

func (b *taskBalancer) ProtocolName() string { return protocolName }
func (b *taskBalancer) IsCooperative() bool  { return true }

// JoinGroupMetadata reports the topics, the partitions this member holds
// (franz-go's current assignment) with their generation, and UserData.
func (b *taskBalancer) JoinGroupMetadata(topics []string, current map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 2
	meta.Topics = topics
	meta.Generation = generation
	for _, t := range slices.Sorted(maps.Keys(current)) {
		owned := kmsg.ConsumerMemberMetadataOwnedPartition{Topic: t, Partitions: slices.Sorted(slices.Values(current[t]))}
		meta.OwnedPartitions = append(meta.OwnedPartitions, owned)
	}
	b.mu.Lock()
	self := b.mu.self
	b.mu.Unlock()
	if b.offsets != nil {
		self.offsets, self.ends = b.offsets()
	}
	meta.UserData = encodeMemberInfo(self)
	return meta.AppendTo(nil)
}

// ParseSyncAssignment returns the member's partitions and keeps the
// assignment info (partition count, task owners).
func (b *taskBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	var a kmsg.ConsumerMemberAssignment
	if err := a.ReadFrom(assignment); err != nil {
		return nil, fmt.Errorf("reading assignment: %w", err)
	}
	out := make(map[string][]int32, len(a.Topics))
	for _, t := range a.Topics {
		out[t.Topic] = append(out[t.Topic], t.Partitions...)
	}
	info, err := decodeAssignmentInfo(a.UserData)
	if err != nil {
		// An assignment from a leader that is not ours: keep the
		// partitions (the runtime refuses partial tasks) but know no owners.
		b.log.Warn("Assignment carries no task owners", zap.Error(err))
		info = assignmentInfo{}
	}
	// An address from another member is used only if it is host:port: no
	// path, query or credentials ride along into a forwarded URL.
	for name, server := range info.servers {
		if err := config.CheckServer(server); err != nil {
			if info.badServers == nil {
				info.badServers = map[string]string{}
			}
			info.badServers[name] = "advertises an application.server that is not host:port"
			delete(info.servers, name)
			b.log.Warn("A group member advertises an application.server that is not host:port; its tasks are answered 503, not forwarded to",
				zap.String("member", name), zap.String("application.server", server), zap.Error(err))
		}
	}
	b.mu.Lock()
	b.mu.info = info
	b.mu.synced = maps.Clone(out)
	if b.mu.lastOwner == nil {
		b.mu.lastOwner, b.mu.movedFrom = map[int32]string{}, map[int32]string{}
	}
	for t, o := range info.owners {
		last := b.mu.lastOwner[t]
		if last == "" {
			// Not seen here yet: the leader says where it ran.
			last = info.from[t]
		}
		if last != "" && last != o {
			b.mu.movedFrom[t] = last
		}
		b.mu.lastOwner[t] = o
	}
	self := b.mu.self.appServer
	b.mu.Unlock()
	if adv, ok := info.servers[b.name]; ok && adv != self && b.rejoin != nil {
		b.log.Info("The group advertises an old address for this member; rejoining so that the leader learns the new one",
			zap.String("advertised", adv), zap.String("application.server", self))
		b.rejoin()
	}
	return out, nil
}

// assignmentInfo returns the info of the latest assignment.
func (b *taskBalancer) assignment() assignmentInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.info
}

// MemberBalancer decodes the members' metadata for the leader.
func (b *taskBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	mb := &memberBalancer{b: b}
	for _, m := range members {
		am := assign.Member{ID: m.MemberID, Generation: -1}
		if m.InstanceID != nil {
			am.InstanceID = *m.InstanceID
		}
		var meta kmsg.ConsumerMemberMetadata
		if err := meta.ReadFrom(m.ProtocolMetadata); err != nil {
			b.log.Warn("Group member metadata unreadable; the member gets no task", zap.String("member", m.MemberID), zap.Error(err))
			mb.members = append(mb.members, am)
			continue
		}
		am.Generation = meta.Generation
		owned := map[int32]bool{}
		for _, op := range meta.OwnedPartitions {
			if op.Topic != b.input && op.Topic != b.repartition {
				continue
			}
			for _, p := range op.Partitions {
				owned[p] = true
			}
		}
		for p := range owned {
			am.Owned = append(am.Owned, p)
		}
		slices.Sort(am.Owned)
		if info, err := decodeMemberInfo(meta.UserData); err == nil {
			am.Version = info.version
			am.Partitions = info.partitions
			am.Offsets = info.offsets
			am.Ends = info.ends
			if err := config.CheckServer(info.appServer); info.appServer != "" && err != nil {
				b.log.Warn("Group member advertises an application.server that is not host:port; not passing it on", zap.String("member", m.MemberID),
					zap.String("application.server", info.appServer), zap.Error(err))
			} else if info.appServer != "" {
				mb.servers = append(mb.servers, [2]string{m.MemberID, info.appServer})
			}
		} else {
			b.log.Warn("Group member metadata has no salesagg data; the member gets no task", zap.String("member", m.MemberID), zap.Error(err))
		}
		mb.members = append(mb.members, am)
	}
	return mb, map[string]struct{}{b.input: {}, b.repartition: {}}, nil
}

// memberBalancer is one balance round on the leader.
type memberBalancer struct {
	b       *taskBalancer
	members []assign.Member
	servers [][2]string // member id, application.server
}

func (*memberBalancer) Balance(map[string]int32) kgo.IntoSyncAssignment { panic("unreachable") }

// BalanceOrError assigns tasks. Mismatched partition counts of the input and
// repartition topics fail the round: no task could be co-partitioned.
func (mb *memberBalancer) BalanceOrError(topics map[string]int32) (kgo.IntoSyncAssignment, error) {
	b := mb.b
	n, ok := topics[b.input]
	if !ok || n < 1 {
		return nil, fmt.Errorf("balancing tasks: no partition count for input topic %s", b.input)
	}
	if r := topics[b.repartition]; r != 0 && r != n {
		return nil, fmt.Errorf("balancing tasks: repartition topic %s has %d partitions but input topic %s has %d; they must match", b.repartition, r, b.input, n)
	}
	// A repartition topic unknown to the leader's metadata yet was just
	// created by another member, with the input's partition count (every
	// member checks it at start): balance on the input's.
	opts := b.opts
	if b.endOffsets != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ends, err := b.endOffsets(ctx)
		cancel()
		switch {
		case errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.LeaderNotAvailable):
			// A changelog created moments ago (the first start): no
			// member holds any of it, so no placement is lost. Expected,
			// not an error: the broker's answer is for debugging only.
			b.log.Info(fmt.Sprintf("Changelog %s is new (its end offsets are not listed yet): no member holds any of it; assigning without caught-up-first placement this round", b.changelog),
				zap.String("changelog", b.changelog))
			b.log.Debug("Listing the new changelog's end offsets", zap.String("changelog", b.changelog), zap.Error(err))
		case err != nil:
			// Without the ends nobody can be told caught up: a plain
			// sticky balance this round.
			b.log.Warn("Reading the changelog end offsets failed; assigning without caught-up-first placement this round", zap.Error(err))
		}
		opts.EndOffsets = ends
	}
	res, err := assign.Plan(mb.members, n, opts)
	if err != nil {
		return nil, fmt.Errorf("balancing tasks: %w", err)
	}
	for _, ex := range res.Excluded {
		b.log.Error("Group member gets no task", zap.String("member", ex.ID), zap.String("reason", ex.Reason))
	}
	name := mb.names()
	owners, summary := mb.owners(res, name)
	standbys, standbySummary := mb.copies(res, name)
	b.log.Info("Assigned tasks", zap.Strings("members", summary), zap.Strings("withheld", taskNames(res.Withheld)),
		zap.Strings("standbys", standbySummary), zap.Strings("warmups", mb.warmups(res, name, opts)), zap.Int32("partitions", n))
	servers := map[string]string{}
	for _, ms := range mb.servers {
		servers[name[ms[0]]] = ms[1]
	}
	info := encodeAssignmentInfo(assignmentInfo{partitions: n, owners: owners, servers: servers, standbys: standbys, probe: res.Probe, from: mb.from(owners, name)})
	return &syncPlan{members: mb.members, res: res, input: b.input, repartition: b.repartition, info: info}, nil
}

// names maps each member id to the name other members know it by: its
// group.instance.id when it has one.
func (mb *memberBalancer) names() map[string]string {
	name := map[string]string{}
	for _, m := range mb.members {
		name[m.ID] = m.ID
		if m.InstanceID != "" {
			name[m.ID] = m.InstanceID
		}
	}
	return name
}

// holder returns the member that reports holding task t, of the latest
// generation when several do (nil: none).
func (mb *memberBalancer) holder(t int32) *assign.Member {
	var holder *assign.Member
	for i := range mb.members {
		m := &mb.members[i]
		if slices.Contains(m.Owned, t) && (holder == nil || m.Generation > holder.Generation) {
			holder = m
		}
	}
	return holder
}

// owners names the owner of every task, and summarizes the plan per member
// for the log. A withheld task is still run by its holder until it revokes
// it: the holder is named, so queries reach it and the next owner knows
// where the task came from.
func (mb *memberBalancer) owners(res assign.Result, name map[string]string) (map[int32]string, []string) {
	owners := map[int32]string{}
	var summary []string
	for _, m := range mb.members {
		tasks := res.Assignment[m.ID]
		for _, t := range tasks {
			owners[t] = name[m.ID]
		}
		summary = append(summary, fmt.Sprintf("%s=%v", name[m.ID], taskNames(tasks)))
	}
	for _, t := range res.Withheld {
		if holder := mb.holder(t); holder != nil {
			owners[t] = name[holder.ID]
		}
	}
	return owners, summary
}

// from names, per task, the member it ran on before its owner in owners:
// the member that reports holding it, else the owner the leader saw last;
// a task that stays where the leader saw it keeps the member it came from
// there. A member whose first SyncGroup is the round after the one that
// moved a task to it (its sync of that round was cut by the next
// rebalance) learns it from here.
func (mb *memberBalancer) from(owners map[int32]string, name map[string]string) map[int32]string {
	b := mb.b
	b.mu.Lock()
	defer b.mu.Unlock()
	from := map[int32]string{}
	for t, o := range owners {
		prev := ""
		if holder := mb.holder(t); holder != nil {
			prev = name[holder.ID]
		}
		if prev == "" || prev == o {
			prev = b.mu.lastOwner[t]
		}
		switch {
		case prev != "" && prev != o:
			from[t] = prev
		case b.mu.lastOwner[t] == o && b.mu.movedFrom[t] != "":
			from[t] = b.mu.movedFrom[t]
		}
	}
	return from
}

// copies gives each member the kind of every copy it keeps (standby,
// warm-up, or incoming: the target of a withheld task), and summarizes them
// for the log.
func (mb *memberBalancer) copies(res assign.Result, name map[string]string) (map[string]map[int32]copyKind, []string) {
	standbys := map[string]map[int32]copyKind{}
	var summary []string
	for _, m := range mb.members {
		sb := res.Standbys[m.ID]
		if len(sb) == 0 {
			continue
		}
		kinds := map[int32]copyKind{}
		for _, t := range sb {
			kinds[t] = kindStandby
			if res.Target[t] == m.ID && slices.Contains(res.Withheld, t) {
				kinds[t] = kindIncoming
			}
		}
		for _, t := range res.Warmups[m.ID] {
			kinds[t] = kindWarmup
		}
		standbys[name[m.ID]] = kinds
		summary = append(summary, fmt.Sprintf("%s=%v", name[m.ID], taskNames(sb)))
	}
	return standbys, summary
}

// warmups summarizes the warm-ups of the plan for the log, with how far
// behind each is.
func (mb *memberBalancer) warmups(res assign.Result, name map[string]string, opts assign.Options) []string {
	var summary []string
	for _, m := range mb.members {
		if w := res.Warmups[m.ID]; len(w) > 0 {
			var parts []string
			for _, t := range w {
				parts = append(parts, fmt.Sprintf("0_%d (%d behind)", t, opts.Lag(m, t)))
			}
			summary = append(summary, fmt.Sprintf("%s=[%s]", name[m.ID], strings.Join(parts, " ")))
		}
	}
	return summary
}

func taskNames(tasks []int32) []string {
	out := make([]string, len(tasks))
	for i, t := range tasks {
		out[i] = fmt.Sprintf("0_%d", t)
	}
	return out
}

// syncPlan is a balance round's SyncGroup assignments.
type syncPlan struct {
	members            []assign.Member
	res                assign.Result
	input, repartition string
	info               []byte
}

func (p *syncPlan) IntoSyncAssignment() []kmsg.SyncGroupRequestGroupAssignment {
	out := make([]kmsg.SyncGroupRequestGroupAssignment, 0, len(p.members))
	for _, m := range p.members {
		tasks := p.res.Assignment[m.ID]
		a := kmsg.ConsumerMemberAssignment{Version: 0, UserData: p.info}
		if len(tasks) > 0 {
			for _, topic := range []string{p.input, p.repartition} {
				if p.input == p.repartition && topic != p.input {
					continue
				}
				t := kmsg.NewConsumerMemberAssignmentTopic()
				t.Topic = topic
				t.Partitions = slices.Clone(tasks)
				a.Topics = append(a.Topics, t)
			}
		}
		sort.Slice(a.Topics, func(i, j int) bool { return strings.Compare(a.Topics[i].Topic, a.Topics[j].Topic) < 0 })
		sa := kmsg.NewSyncGroupRequestGroupAssignment()
		sa.MemberID = m.ID
		sa.MemberAssignment = a.AppendTo(nil)
		out = append(out, sa)
	}
	return out
}
