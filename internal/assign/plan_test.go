package assign

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// ends gives every one of n tasks the changelog end offset end.
func ends(n int32, end int64) map[int32]int64 {
	out := map[int32]int64{}
	for t := range n {
		out[t] = end
	}
	return out
}

// offs is a member's store checkpoints: task, offset, task, offset...
func offs(kv ...int64) map[int32]int64 {
	out := map[int32]int64{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[int32(kv[i])] = kv[i+1]
	}
	return out
}

// at returns m reporting the store checkpoints o.
func at(m Member, o map[int32]int64) Member {
	m.Offsets = o
	return m
}

// planWant is the expected outcome of one Plan round; nil fields are not
// checked, except assignment.
type planWant struct {
	assignment map[string][]int32
	withheld   []int32
	standbys   map[string][]int32
	warmups    map[string][]int32
	probe      bool
}

func checkPlan(t *testing.T, round string, res Result, w planWant) {
	t.Helper()
	checkWant(t, round, res, want{assignment: w.assignment, withheld: w.withheld})
	norm := func(m map[string][]int32) map[string][]int32 {
		out := map[string][]int32{}
		for id, ts := range m {
			if len(ts) > 0 {
				out[id] = ts
			}
		}
		return out
	}
	if w.standbys != nil && !reflect.DeepEqual(norm(res.Standbys), norm(w.standbys)) {
		t.Errorf("%s: standbys %v, want %v", round, res.Standbys, w.standbys)
	}
	if w.warmups != nil && !reflect.DeepEqual(norm(res.Warmups), norm(w.warmups)) {
		t.Errorf("%s: warm-ups %v, want %v", round, res.Warmups, w.warmups)
	}
	if res.Probe != w.probe {
		t.Errorf("%s: probe %v, want %v", round, res.Probe, w.probe)
	}
}

func TestPlan(t *testing.T) {
	type A = map[string][]int32
	const R = Running
	o := func(end int64, standbys int) Options {
		return Options{EndOffsets: ends(3, end), AcceptableLag: 10_000, Standbys: standbys, MaxWarmups: 2}
	}
	cases := []struct {
		name    string
		members []Member
		opts    Options
		want    planWant
	}{{
		name: "a killed member's task goes to its caught-up standby, not to the first member with room",
		// a runs 0, b runs 1, c (gone) ran 2; b keeps a standby of 2 that is
		// 1,000 records behind.
		members: []Member{at(mem("a", 0), offs(0, R)), at(mem("b", 1), offs(1, R, 2, 99_000))},
		opts:    o(100_000, 0),
		want:    planWant{assignment: A{"a": {0}, "b": {1, 2}}, standbys: A{}, warmups: A{}},
	}, {
		name: "standbys go to other members, one copy per task, the warm one first",
		members: []Member{
			at(mem("a", 0), offs(0, R, 1, 99_000)),
			at(mem("b", 1), offs(1, R, 2, 99_500)),
			at(mem("c", 2), offs(2, R, 0, 98_000)),
		},
		opts: o(100_000, 1),
		want: planWant{assignment: A{"a": {0}, "b": {1}, "c": {2}}, standbys: A{"a": {1}, "b": {2}, "c": {0}}, warmups: A{}},
	}, {
		name: "two standbys of three tasks on three members: every other member",
		members: []Member{
			at(mem("a", 0), offs(0, R)), at(mem("b", 1), offs(1, R)), at(mem("c", 2), offs(2, R)),
		},
		opts: o(100_000, 2),
		want: planWant{assignment: A{"a": {0}, "b": {1}, "c": {2}}, standbys: A{"a": {1, 2}, "b": {0, 2}, "c": {0, 1}}, warmups: A{}},
	}, {
		name:    "more standbys asked than members: as many as there are other members",
		members: []Member{at(mem("a", 0, 1), offs(0, R, 1, R)), at(mem("b", 2), offs(2, R))},
		opts:    o(100_000, 3),
		want:    planWant{assignment: A{"a": {0, 1}, "b": {2}}, standbys: A{"a": {2}, "b": {0, 1}}, warmups: A{}},
	}, {
		name: "a new cold member: the task stays on its caught-up holder and a warm-up is built where it belongs",
		members: []Member{
			at(mem("a", 0, 1), offs(0, R, 1, R)), at(mem("b", 2), offs(2, R)), at(mem("c"), offs()),
		},
		opts: o(100_000, 0),
		want: planWant{assignment: A{"a": {0, 1}, "b": {2}, "c": {}}, standbys: A{"c": {1}}, warmups: A{"c": {1}}, probe: true},
	}, {
		name: "the warm-up caught up: the task is withheld from its holder for the hand-over",
		members: []Member{
			at(mem("a", 0, 1), offs(0, R, 1, R)), at(mem("b", 2), offs(2, R)), at(mem("c"), offs(1, 95_000)),
		},
		opts: o(100_000, 0),
		want: planWant{assignment: A{"a": {0}, "b": {2}, "c": {}}, withheld: []int32{1}, standbys: A{"c": {1}}, warmups: A{}},
	}, {
		name: "the holder revoked it: the caught-up warm-up member gets it",
		members: []Member{
			at(mem("a", 0), offs(0, R, 1, 100_000)), at(mem("b", 2), offs(2, R)), at(mem("c"), offs(1, 96_000)),
		},
		opts: o(100_000, 0),
		want: planWant{assignment: A{"a": {0}, "b": {2}, "c": {1}}, standbys: A{}, warmups: A{}},
	}, {
		name: "no member caught up: the one with the most state runs it, a warm-up on its balanced place",
		// 0_1's runner is gone; b has half of it but runs 2; c is new.
		members: []Member{
			at(mem("a", 0), offs(0, R)), at(mem("b", 2), offs(2, R, 1, 50_000)), at(mem("c"), offs()),
		},
		opts: o(100_000, 0),
		want: planWant{assignment: A{"a": {0}, "b": {1, 2}, "c": {}}, standbys: A{"c": {1}}, warmups: A{"c": {1}}, probe: true},
	}, {
		name: "no member caught up and the balanced place has the most state: it stays there",
		members: []Member{
			at(mem("b", 2), offs(2, R)), at(mem("c"), offs(0, 50_000)),
		},
		opts: Options{EndOffsets: map[int32]int64{0: 100_000, 1: 0, 2: 100_000}, AcceptableLag: 10_000, MaxWarmups: 2},
		want: planWant{assignment: A{"b": {1, 2}, "c": {0}}, standbys: A{}, warmups: A{}},
	}, {
		name: "an empty changelog makes every member caught up: plain balance",
		members: []Member{
			at(mem("a", 0, 1, 2), offs(0, R, 1, R, 2, R)), at(mem("b"), offs()),
		},
		opts: Options{EndOffsets: ends(3, 0), AcceptableLag: 10_000, MaxWarmups: 2},
		want: planWant{assignment: A{"a": {0, 1}, "b": {}}, withheld: []int32{2}, standbys: A{"b": {2}}, warmups: A{}},
	}, {
		name: "end offsets unknown: plain sticky balance, no warm-ups",
		members: []Member{
			at(mem("a", 0, 1, 2), offs(0, R, 1, R, 2, R)), at(mem("b"), offs()),
		},
		opts: Options{AcceptableLag: 10_000, MaxWarmups: 2, Standbys: 1},
		want: planWant{assignment: A{"a": {0, 1}, "b": {}}, withheld: []int32{2}, standbys: A{"b": {0, 1, 2}}, warmups: A{}},
	}, {
		name: "the warm-up budget bounds the copies built at once; the rest stays put",
		members: []Member{
			at(mem("a", 0, 1, 2, 3), offs(0, R, 1, R, 2, R, 3, R)), at(mem("b"), offs()), at(mem("c"), offs()),
		},
		opts: Options{EndOffsets: ends(4, 100_000), AcceptableLag: 10_000, MaxWarmups: 1},
		want: planWant{assignment: A{"a": {0, 1, 2, 3}, "b": {}, "c": {}}, standbys: A{"b": {2}}, warmups: A{"b": {2}}, probe: true},
	}, {
		name: "a member with version 1 metadata: its owned tasks count as caught up",
		members: []Member{
			mem("a", 0, 1, 2), at(mem("b"), offs()),
		},
		opts: o(100_000, 0),
		want: planWant{assignment: A{"a": {0, 1, 2}, "b": {}}, standbys: A{"b": {2}}, warmups: A{"b": {2}}, probe: true},
	}, {
		name: "a store beyond the changelog end is void: it counts as cold",
		members: []Member{
			at(mem("a", 0), offs(0, R, 2, 150_000)), at(mem("b", 1), offs(1, R, 2, 95_000)),
		},
		opts: o(100_000, 0),
		want: planWant{assignment: A{"a": {0}, "b": {1, 2}}, standbys: A{}, warmups: A{}},
	}, {
		name: "a standby is never given to the member still holding a withheld task; its target keeps one",
		members: []Member{
			at(mem("a", 0, 1), offs(0, R, 1, R)), at(mem("b"), offs(1, 99_000)),
		},
		opts: Options{EndOffsets: ends(2, 100_000), AcceptableLag: 10_000, MaxWarmups: 2, Standbys: 1},
		want: planWant{assignment: A{"a": {0}, "b": {}}, withheld: []int32{1}, standbys: A{"b": {0, 1}}, warmups: A{}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Plan(c.members, partitionsOf(c.opts), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, "round 1", res, c.want)
			checkPlanInvariants(t, c.members, partitionsOf(c.opts), c.opts, res)
		})
	}
}

// partitionsOf is the task count of a table case: the end offsets', or 3.
func partitionsOf(o Options) int32 {
	if len(o.EndOffsets) > 0 {
		return int32(len(o.EndOffsets))
	}
	return 3
}

// checkPlanInvariants checks what Plan adds to Tasks' invariants.
func checkPlanInvariants(t *testing.T, members []Member, partitions int32, o Options, res Result) {
	t.Helper()
	checkInvariantsOf(t, members, partitions, res, o.EndOffsets == nil)
	byID := map[string]*member{}
	var eligible []*member
	excluded := map[string]bool{}
	for _, e := range res.Excluded {
		excluded[e.ID] = true
	}
	for _, m := range members {
		mb := &member{Member: m, owned: inRange(m.Owned, partitions)}
		byID[m.ID] = mb
		if !excluded[m.ID] {
			eligible = append(eligible, mb)
		}
	}
	warm := 0
	warmed := map[int32]bool{}
	for id, ts := range res.Warmups {
		warm += len(ts)
		for _, tk := range ts {
			warmed[tk] = true
		}
		for _, tk := range ts {
			if !slices.Contains(res.Standbys[id], tk) {
				t.Fatalf("warm-up %d of %s is not among its standbys %v", tk, id, res.Standbys[id])
			}
		}
	}
	if o.MaxWarmups >= 0 && warm > o.MaxWarmups {
		t.Fatalf("%d warm-ups, budget %d", warm, o.MaxWarmups)
	}
	if warm > 0 && !res.Probe {
		t.Fatalf("warm-ups %v without a probe", res.Warmups)
	}
	copies := map[int32]int{}
	for id, ts := range res.Standbys {
		if !slices.IsSorted(ts) || len(slices.Compact(slices.Clone(ts))) != len(ts) {
			t.Fatalf("standbys of %s not sorted and unique: %v", id, ts)
		}
		if excluded[id] && len(ts) > 0 {
			t.Fatalf("excluded member %s has standbys %v", id, ts)
		}
		for _, tk := range ts {
			copies[tk]++
			if slices.Contains(res.Assignment[id], tk) || (res.Target[tk] == id && !slices.Contains(res.Withheld, tk)) {
				t.Fatalf("member %s has both task %d and its standby", id, tk)
			}
			if slices.Contains(byID[id].owned, tk) {
				t.Fatalf("member %s holds task %d and got its standby", id, tk)
			}
		}
	}
	for tk := range partitions {
		// Warm-ups and the copy on a withheld task's target count towards
		// the standbys: more copies than asked only when those are more.
		base := 0
		if warmed[tk] {
			base++
		}
		if slices.Contains(res.Withheld, tk) {
			base++
		}
		if copies[tk] > max(o.Standbys, base) {
			t.Fatalf("task %d has %d standby copies, %d asked", tk, copies[tk], o.Standbys)
		}
		// Enough copies when enough members are free to take them.
		free := 0
		for _, m := range eligible {
			if res.Target[tk] != m.ID && !slices.Contains(m.owned, tk) {
				free++
			}
		}
		if _, ok := res.Target[tk]; ok && copies[tk] < min(o.Standbys, free) {
			t.Fatalf("task %d has %d standby copies, %d asked, %d members free", tk, copies[tk], o.Standbys, free)
		}
		// The target of a withheld task keeps a copy until the hand-over.
		if slices.Contains(res.Withheld, tk) && !slices.Contains(res.Standbys[res.Target[tk]], tk) {
			t.Fatalf("withheld task %d has no copy on its target %s: %v", tk, res.Target[tk], res.Standbys)
		}
		// Never an active task on a cold member when a warm one exists.
		id, ok := res.Target[tk]
		if !ok || o.caughtUp(byID[id], tk) {
			continue
		}
		for _, m := range eligible {
			if o.caughtUp(m, tk) {
				t.Fatalf("task %d targets %s (lag %d) while %s is caught up (lag %d)", tk, id, o.lag(byID[id], tk), m.ID, o.lag(m, tk))
			}
		}
	}
}

func TestPlanProperties(t *testing.T) {
	// Scenario: random groups as in TestTasksProperties, each member with
	// random store checkpoints, random end offsets and settings; Plan's
	// invariants hold, the order of members does not matter, and a group
	// whose warm-ups all catch up settles: the warm-ups' tasks reach them
	// within a few rounds and nothing is withheld or warmed up after that.
	r := rand.New(rand.NewPCG(2026, 12))
	for i := range 1500 {
		partitions := 1 + r.Int32N(10)
		members := make([]Member, r.IntN(6))
		for j := range members {
			m := Member{ID: fmt.Sprintf("m%d", r.IntN(1000)*10+j), Version: Version, Generation: r.Int32N(3)}
			if r.IntN(4) == 0 {
				m.Version = 0
			}
			if r.IntN(5) > 0 {
				m.Offsets = map[int32]int64{}
			}
			members[j] = m
		}
		for tk := range partitions {
			if j := r.IntN(len(members) + 1); j < len(members) {
				members[j].Owned = append(members[j].Owned, tk)
				if members[j].Offsets != nil {
					members[j].Offsets[tk] = Running
				}
			}
			for j := range members {
				if members[j].Offsets != nil && r.IntN(3) == 0 && !slices.Contains(members[j].Owned, tk) {
					members[j].Offsets[tk] = r.Int64N(120_000)
				}
			}
		}
		o := Options{AcceptableLag: r.Int64N(3) * 10_000, Standbys: r.IntN(3), MaxWarmups: 1 + r.IntN(3)}
		if r.IntN(6) > 0 {
			o.EndOffsets = ends(partitions, r.Int64N(110_000))
		}
		name := fmt.Sprintf("case %d: %d tasks, %+v, %+v", i, partitions, members, o)
		ok := t.Run(fmt.Sprint(i), func(t *testing.T) {
			res, err := Plan(members, partitions, o)
			if err != nil {
				t.Fatal(err)
			}
			checkPlanInvariants(t, members, partitions, o, res)
			for range 3 {
				shuffled := slices.Clone(members)
				r.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
				got, err := Plan(shuffled, partitions, o)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, res) {
					t.Fatalf("order dependent: %+v gave %+v, want %+v", shuffled, got, res)
				}
			}
			// Settle: every member holds what it was given, runs it, and
			// its standbys catch up fully; within a few rounds nothing
			// moves any more.
			ms := members
			for round := 0; round < 6; round++ {
				ms = settle(ms, res, o)
				if res, err = Plan(ms, partitions, o); err != nil {
					t.Fatal(err)
				}
				checkPlanInvariants(t, ms, partitions, o, res)
			}
			reporting := true
			for _, m := range ms {
				reporting = reporting && m.Offsets != nil
			}
			if reporting && (len(res.Withheld) > 0 || res.Probe) {
				t.Fatalf("not settled after 6 rounds: withheld %v, warm-ups %v, probe %v", res.Withheld, res.Warmups, res.Probe)
			}
		})
		if !ok {
			t.Fatalf("failed on %s", name)
		}
	}
}

// settle is the next round after every member ran its assignment and its
// standbys caught up to the end.
func settle(members []Member, res Result, o Options) []Member {
	out := make([]Member, len(members))
	for i, m := range members {
		m.Owned = slices.Clone(res.Assignment[m.ID])
		m.Generation++
		if m.Offsets != nil {
			next := map[int32]int64{}
			for tk, off := range m.Offsets {
				if off != Running {
					next[tk] = off
				}
			}
			for _, tk := range res.Standbys[m.ID] {
				next[tk] = o.EndOffsets[tk]
			}
			for _, tk := range m.Owned {
				next[tk] = Running
			}
			m.Offsets = next
		}
		out[i] = m
	}
	return out
}
