package stream

import (
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

func TestBalancerRoundTrip(t *testing.T) {
	// Scenario: the leader decodes two members' JoinGroup metadata (one holding all three tasks
	// from the last generation, one new), balances, and each member parses its SyncGroup
	// assignment: tasks come whole (input p with repartition p), the moving task is withheld
	// while its holder still has it, and every member learns each task's owner.
	const in, rep = "in", "in-rep"
	newBal := func(pid string) *taskBalancer {
		b := &taskBalancer{input: in, repartition: rep, log: zap.NewNop()}
		b.start(memberInfo{partitions: 3, processID: pid, appServer: map[string]string{"pa": "a:1", "pb": "b:2"}[pid]})
		return b
	}
	a, b := newBal("pa"), newBal("pb")
	topics := []string{in, rep}
	metaA := a.JoinGroupMetadata(topics, map[string][]int32{in: {0, 1, 2}, rep: {0, 1, 2}}, 4)
	metaB := b.JoinGroupMetadata(topics, nil, -1)
	idA, idB := "inst-a", "inst-b"
	members := []kmsg.JoinGroupResponseMember{
		{MemberID: "m-a", InstanceID: &idA, ProtocolMetadata: metaA},
		{MemberID: "m-b", InstanceID: &idB, ProtocolMetadata: metaB},
	}
	mb, wantTopics, err := a.MemberBalancer(members)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(wantTopics, map[string]struct{}{in: {}, rep: {}}) {
		t.Fatalf("topics = %v", wantTopics)
	}
	plan, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{in: 3, rep: 3})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string][]int32{}
	for _, sa := range plan.IntoSyncAssignment() {
		parser := a
		if sa.MemberID == "m-b" {
			parser = b
		}
		parts, err := parser.ParseSyncAssignment(sa.MemberAssignment)
		if err != nil {
			t.Fatal(err)
		}
		got[sa.MemberID] = parts
	}
	// A keeps 0 and 1; 2 moves to B in the next round, after A revoked it.
	if want := map[string][]int32{in: {0, 1}, rep: {0, 1}}; !reflect.DeepEqual(got["m-a"], want) {
		t.Fatalf("A's assignment = %v, want %v", got["m-a"], want)
	}
	if len(got["m-b"]) != 0 {
		t.Fatalf("B's assignment = %v, want nothing this round", got["m-b"])
	}
	// 2 is withheld: still run by A until it revokes it.
	if owners := b.assignment().owners; !reflect.DeepEqual(owners, map[int32]string{0: idA, 1: idA, 2: idA}) {
		t.Fatalf("owners B learned = %v", owners)
	}
	if servers := b.assignment().servers; !reflect.DeepEqual(servers, map[string]string{idA: "a:1", idB: "b:2"}) {
		t.Fatalf("servers B learned = %v", servers)
	}

	// The next round, after A revoked 2: 2 goes to B. A B whose sync of the first round was cut
	// by this one (a new balancer here: it never saw A hold 2) still learns where 2 came from.
	b2 := newBal("pb")
	metaA = a.JoinGroupMetadata(topics, map[string][]int32{in: {0, 1}, rep: {0, 1}}, 5)
	metaB = b2.JoinGroupMetadata(topics, nil, -1)
	members = []kmsg.JoinGroupResponseMember{
		{MemberID: "m-a", InstanceID: &idA, ProtocolMetadata: metaA},
		{MemberID: "m-b", InstanceID: &idB, ProtocolMetadata: metaB},
	}
	mb2, _, err := a.MemberBalancer(members)
	if err != nil {
		t.Fatal(err)
	}
	plan, err = mb2.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{in: 3, rep: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, sa := range plan.IntoSyncAssignment() {
		parser := a
		if sa.MemberID == "m-b" {
			parser = b2
		}
		parts, err := parser.ParseSyncAssignment(sa.MemberAssignment)
		if err != nil {
			t.Fatal(err)
		}
		got[sa.MemberID] = parts
	}
	if want := map[string][]int32{in: {2}, rep: {2}}; !reflect.DeepEqual(got["m-b"], want) {
		t.Fatalf("B's assignment in the second round = %v, want %v", got["m-b"], want)
	}
	if from := b2.cameFrom(2); from != idA {
		t.Fatalf("B says 0_2 came from %q, want %q", from, idA)
	}
	if from := b2.cameFrom(0); from != "" {
		t.Fatalf("B says 0_0 came from %q, want nobody (it never moved)", from)
	}

	// Mismatched partition counts fail the round.
	if _, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{in: 3, rep: 4}); err == nil {
		t.Fatal("balancing with 3 input and 4 repartition partitions did not fail")
	}
}

func TestBalancerWireFormats(t *testing.T) {
	// Scenario: member and assignment info round trip; truncated bytes are rejected; a newer
	// member's appended fields are ignored.
	m := memberInfo{version: 3, partitions: 12, processID: "0b8f-uuid", appServer: "salesagg-0.salesagg:8080",
		offsets: map[int32]int64{0: -2, 3: 1 << 40, 11: 0}, ends: map[int32]int64{3: 1<<40 + 7}}
	got, err := decodeMemberInfo(encodeMemberInfo(m))
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("member info = %+v, %v", got, err)
	}
	if _, err := decodeMemberInfo(encodeMemberInfo(m)[:len(encodeMemberInfo(m))-3]); err == nil {
		t.Fatal("member info with truncated ends decoded")
	}
	// A version 2 member: offsets, no ends.
	v2 := encodeMemberInfo(memberInfo{partitions: 12, processID: m.processID, appServer: m.appServer, offsets: m.offsets})
	v2[0] = 2
	v2 = v2[:len(v2)-2] // without the (empty) ends section
	if got, err := decodeMemberInfo(v2); err != nil || got.ends != nil || !reflect.DeepEqual(got.offsets, m.offsets) {
		t.Fatalf("version 2 member info = %+v, %v", got, err)
	}
	// A member of the version before store offsets: none (nil).
	v1 := []byte{1, 0, 0, 0, 12, 0, 3, 'p', 'i', 'd', 0, 3, 'a', ':', '1'}
	if got, err := decodeMemberInfo(v1); err != nil || got.appServer != "a:1" || got.offsets != nil {
		t.Fatalf("version 1 member info = %+v, %v", got, err)
	}
	if _, err := decodeMemberInfo(encodeMemberInfo(m)[:6]); err == nil {
		t.Fatal("truncated member info decoded")
	}
	// A member of the version before application.server: no server.
	old := []byte{1, 0, 0, 0, 12, 0, 3, 'p', 'i', 'd'}
	if got, err := decodeMemberInfo(old); err != nil || got.processID != "pid" || got.appServer != "" {
		t.Fatalf("older member info = %+v, %v", got, err)
	}
	newer := append(encodeMemberInfo(m), 9, 9, 9)
	newer[0] = 7
	if got, err := decodeMemberInfo(newer); err != nil || got.version != 7 || got.processID != m.processID {
		t.Fatalf("newer member info = %+v, %v", got, err)
	}
	ai := assignmentInfo{version: 3, partitions: 3, owners: map[int32]string{0: "a", 2: "b"}, servers: map[string]string{"a": "10-a:8080", "b": "b.svc:8080"},
		standbys: map[string]map[int32]copyKind{"a": {2: kindStandby}, "b": {0: kindIncoming, 1: kindWarmup}}, probe: true,
		from: map[int32]string{2: "a"}}
	gotA, err := decodeAssignmentInfo(encodeAssignmentInfo(ai))
	if err != nil || !reflect.DeepEqual(gotA, ai) {
		t.Fatalf("assignment info = %+v, %v", gotA, err)
	}
	enc := encodeAssignmentInfo(ai)
	if _, err := decodeAssignmentInfo(enc[:len(enc)-2]); err == nil {
		t.Fatal("assignment info with a truncated from decoded")
	}
	// A leader of the version before from: standbys and probe, no from.
	noFrom := ai
	noFrom.from = nil
	enc = encodeAssignmentInfo(noFrom)
	if got, err := decodeAssignmentInfo(enc[:len(enc)-2]); err != nil || !reflect.DeepEqual(got, noFrom) {
		t.Fatalf("assignment info without from = %+v, %v", got, err)
	}
	if _, err := decodeAssignmentInfo(enc[:len(enc)-6]); err == nil {
		t.Fatal("assignment info with truncated standbys decoded")
	}
	// A leader of the version before standbys: none, no probe.
	ai1 := assignmentInfo{version: 1, partitions: 3, owners: map[int32]string{0: "a"}, servers: map[string]string{"a": "a:1"}}
	b1 := encodeAssignmentInfo(ai1)
	b1 = b1[:len(b1)-3] // no standby count, no probe byte
	if got, err := decodeAssignmentInfo(b1); err != nil || len(got.standbys) != 0 || got.probe || got.servers["a"] != "a:1" {
		t.Fatalf("version 1 assignment info = %+v, %v", got, err)
	}
	if _, err := decodeAssignmentInfo(nil); err == nil {
		t.Fatal("empty assignment info decoded")
	}
}

func TestBalancerRejoinsWhenItsAddressIsStale(t *testing.T) {
	// Scenario: a static member restarted on another port gets its old assignment back without a
	// rebalance, advertising its old address: it asks to rejoin, and does not when the address
	// is its own.
	const in, rep = "in", "in-rep"
	rejoined := make(chan struct{}, 2)
	b := &taskBalancer{input: in, repartition: rep, log: zap.NewNop(), name: "inst-a", rejoin: func() { rejoined <- struct{}{} }}
	b.start(memberInfo{partitions: 3, processID: "pa", appServer: "127.0.0.1:2002"})
	assignment := func(server string) []byte {
		a := kmsg.ConsumerMemberAssignment{UserData: encodeAssignmentInfo(assignmentInfo{partitions: 3,
			owners: map[int32]string{0: "inst-a"}, servers: map[string]string{"inst-a": server}})}
		return a.AppendTo(nil)
	}
	if _, err := b.ParseSyncAssignment(assignment("127.0.0.1:2002")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rejoined:
		t.Fatal("rejoined although the group advertises this member's own address")
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := b.ParseSyncAssignment(assignment("127.0.0.1:1001")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rejoined:
	case <-time.After(5 * time.Second):
		t.Fatal("did not rejoin when the group advertises an old address")
	}
}

func TestBalancerDropsAddressesThatAreNotHostPort(t *testing.T) {
	// Scenario: an assignment names, for another member, an application.server carrying a path
	// and a fragment (as a hostile member could advertise): the member drops the address, marks
	// the owner unroutable, and a query for its task is told why instead of being forwarded;
	// a leader passes no such address on either.
	b := &taskBalancer{input: "in", repartition: "in-rep", log: zap.NewNop(), name: "inst-a"}
	b.start(memberInfo{partitions: 3, processID: "pa", appServer: "127.0.0.1:2002"})
	a := kmsg.ConsumerMemberAssignment{UserData: encodeAssignmentInfo(assignmentInfo{partitions: 3,
		owners:  map[int32]string{0: "inst-a", 1: "evil", 2: "good"},
		servers: map[string]string{"inst-a": "127.0.0.1:2002", "evil": "127.0.0.9:80/latest/meta-data#", "good": "salesagg-2.salesagg:8080"}})}
	if _, err := b.ParseSyncAssignment(a.AppendTo(nil)); err != nil {
		t.Fatal(err)
	}
	info := b.assignment()
	if _, ok := info.servers["evil"]; ok || info.badServers["evil"] == "" || info.servers["good"] != "salesagg-2.salesagg:8080" {
		t.Fatalf("servers %v, bad %v", info.servers, info.badServers)
	}

	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 2
	meta.Topics = []string{"in", "in-rep"}
	meta.UserData = encodeMemberInfo(memberInfo{partitions: 3, processID: "pe", appServer: "evil:80/path"})
	jm := kmsg.NewJoinGroupResponseMember()
	jm.MemberID = "m-evil"
	jm.ProtocolMetadata = meta.AppendTo(nil)
	mb, _, err := b.MemberBalancer([]kmsg.JoinGroupResponseMember{jm})
	if err != nil {
		t.Fatal(err)
	}
	if servers := mb.(*memberBalancer).servers; len(servers) != 0 {
		t.Fatalf("the leader passes on %v", servers)
	}
}
