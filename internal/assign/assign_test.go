package assign

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// mem is an eligible dynamic member at generation 1 holding owned.
func mem(id string, owned ...int32) Member {
	return Member{ID: id, Version: Version, Generation: 1, Owned: owned}
}

// with returns m changed by f, to keep the table readable.
func with(m Member, f func(*Member)) Member {
	f(&m)
	return m
}

// next is the group's next round as the members would join it: every member
// holds what it was assigned (it revoked the rest), one generation later.
func next(members []Member, res Result) []Member {
	out := make([]Member, len(members))
	for i, m := range members {
		m.Owned = slices.Clone(res.Assignment[m.ID])
		m.Generation++
		out[i] = m
	}
	return out
}

// want is the expected outcome of one round; a nil target is not checked.
type want struct {
	assignment map[string][]int32
	withheld   []int32
	target     map[int32]string
	excluded   []string
}

func checkWant(t *testing.T, round string, res Result, w want) {
	t.Helper()
	got := map[string][]int32{}
	for id, ts := range res.Assignment {
		got[id] = ts
		if ts == nil {
			got[id] = []int32{}
		}
	}
	wa := map[string][]int32{}
	for id, ts := range w.assignment {
		wa[id] = ts
		if ts == nil {
			wa[id] = []int32{}
		}
	}
	if !reflect.DeepEqual(got, wa) {
		t.Errorf("%s: assignment %v, want %v", round, got, wa)
	}
	if !slices.Equal(res.Withheld, w.withheld) {
		t.Errorf("%s: withheld %v, want %v", round, res.Withheld, w.withheld)
	}
	if w.target != nil && !reflect.DeepEqual(res.Target, w.target) {
		t.Errorf("%s: target %v, want %v", round, res.Target, w.target)
	}
	var ex []string
	for _, e := range res.Excluded {
		ex = append(ex, e.ID)
	}
	if !slices.Equal(ex, w.excluded) {
		t.Errorf("%s: excluded %v, want %v", round, res.Excluded, w.excluded)
	}
}

func TestTasks(t *testing.T) {
	type A = map[string][]int32
	type T = map[int32]string
	cases := []struct {
		name       string
		partitions int32
		members    []Member
		round1     want
		round2     *want // the next round (see next), when the scenario has one
	}{
		{
			name:       "first join of 1 member over 3 tasks takes all",
			partitions: 3,
			members:    []Member{mem("a")},
			round1:     want{assignment: A{"a": {0, 1, 2}}, target: T{0: "a", 1: "a", 2: "a"}},
		},
		{
			name:       "first join of 3 members over 3 tasks: one each in member order",
			partitions: 3,
			members:    []Member{mem("c"), mem("a"), mem("b")},
			round1:     want{assignment: A{"a": {0}, "b": {1}, "c": {2}}, target: T{0: "a", 1: "b", 2: "c"}},
		},
		{
			name:       "sticky: nothing forces a move, each keeps what it holds even off the canonical layout",
			partitions: 3,
			members:    []Member{mem("a", 2), mem("b", 0), mem("c", 1)},
			round1:     want{assignment: A{"a": {2}, "b": {0}, "c": {1}}},
		},
		{
			name:       "sticky: a joining member takes the minimum, withheld in round 1, handed over in round 2",
			partitions: 6,
			members:    []Member{mem("a", 0, 1, 2), mem("b", 3, 4, 5), mem("c")},
			round1: want{
				assignment: A{"a": {0, 1}, "b": {3, 4}, "c": {}},
				withheld:   []int32{2, 5},
				target:     T{0: "a", 1: "a", 2: "c", 3: "b", 4: "b", 5: "c"},
			},
			round2: &want{
				assignment: A{"a": {0, 1}, "b": {3, 4}, "c": {2, 5}},
				target:     T{0: "a", 1: "a", 2: "c", 3: "b", 4: "b", 5: "c"},
			},
		},
		{
			name:       "sticky: 8 tasks from 2 to 3 members moves only 2, the holders keep the ceil slots",
			partitions: 8,
			members:    []Member{mem("a", 0, 1, 2, 3), mem("b", 4, 5, 6, 7), mem("c")},
			round1: want{
				assignment: A{"a": {0, 1, 2}, "b": {4, 5, 6}, "c": {}},
				withheld:   []int32{3, 7},
			},
			round2: &want{assignment: A{"a": {0, 1, 2}, "b": {4, 5, 6}, "c": {3, 7}}},
		},
		{
			name:       "sticky: the ceil slot goes to the member with most claims (b: 4 over a: 3)",
			partitions: 7,
			members:    []Member{mem("a", 0, 1, 2), mem("b", 3, 4, 5, 6), mem("c")},
			round1: want{
				assignment: A{"a": {0, 1}, "b": {3, 4, 5}, "c": {}},
				withheld:   []int32{2, 6},
				target:     T{0: "a", 1: "a", 2: "c", 3: "b", 4: "b", 5: "b", 6: "c"},
			},
			round2: &want{assignment: A{"a": {0, 1}, "b": {3, 4, 5}, "c": {2, 6}}},
		},
		{
			name:       "balance: 8 tasks over 3 new members is 3/3/2",
			partitions: 8,
			members:    []Member{mem("a"), mem("b"), mem("c")},
			round1:     want{assignment: A{"a": {0, 3, 6}, "b": {1, 4, 7}, "c": {2, 5}}},
		},
		{
			name:       "balance: 3 tasks over 2 new members is 2/1",
			partitions: 3,
			members:    []Member{mem("a"), mem("b")},
			round1:     want{assignment: A{"a": {0, 2}, "b": {1}}},
		},
		{
			name:       "balance: 1 task over 3 new members, the others idle",
			partitions: 1,
			members:    []Member{mem("a"), mem("b"), mem("c")},
			round1:     want{assignment: A{"a": {0}, "b": {}, "c": {}}, target: T{0: "a"}},
		},
		{
			name:       "balance: 1 task over 3 members stays with its holder",
			partitions: 1,
			members:    []Member{mem("a"), mem("b"), mem("c", 0)},
			round1:     want{assignment: A{"a": {}, "b": {}, "c": {0}}},
		},
		{
			name:       "a member leaving (c held 4,5): its tasks are handed out at once, nobody else holds them",
			partitions: 6,
			members:    []Member{mem("a", 0, 1), mem("b", 2, 3)},
			round1:     want{assignment: A{"a": {0, 1, 4}, "b": {2, 3, 5}}},
		},
		{
			name:       "old metadata (version 0) excluded; its held task is withheld until it releases it",
			partitions: 2,
			members:    []Member{with(mem("a", 0), func(m *Member) { m.Version = 0 }), mem("b")},
			round1: want{
				assignment: A{"a": {}, "b": {1}},
				withheld:   []int32{0},
				target:     T{0: "b", 1: "b"},
				excluded:   []string{"a"},
			},
			round2: &want{assignment: A{"a": {}, "b": {0, 1}}, excluded: []string{"a"}},
		},
		{
			name:       "newer metadata version accepted and read as this version",
			partitions: 2,
			members:    []Member{with(mem("a", 0), func(m *Member) { m.Version = Version + 1 }), mem("b", 1)},
			round1:     want{assignment: A{"a": {0}, "b": {1}}},
		},
		{
			name:       "wrong partition count (4, leader 3) excluded; its held tasks withheld until released; 0 (unknown) accepted",
			partitions: 3,
			members: []Member{
				with(mem("a", 0, 1), func(m *Member) { m.Partitions = 4 }),
				with(mem("b"), func(m *Member) { m.Partitions = 3 }),
				mem("c"),
			},
			round1: want{
				assignment: A{"a": {}, "b": {2}, "c": {}},
				withheld:   []int32{0, 1},
				target:     T{0: "c", 1: "b", 2: "b"},
				excluded:   []string{"a"},
			},
			round2: &want{
				assignment: A{"a": {}, "b": {1, 2}, "c": {0}},
				target:     T{0: "c", 1: "b", 2: "b"},
				excluded:   []string{"a"},
			},
		},
		{
			name:       "contested: a and b claim task 1 at the same generation, withheld from both",
			partitions: 3,
			members: []Member{
				with(mem("a", 0, 1), func(m *Member) { m.Generation = 3 }),
				with(mem("b", 1, 2), func(m *Member) { m.Generation = 3 }),
			},
			round1: want{
				assignment: A{"a": {0}, "b": {2}},
				withheld:   []int32{1},
				target:     T{0: "a", 1: "a", 2: "b"},
			},
			round2: &want{assignment: A{"a": {0, 1}, "b": {2}}},
		},
		{
			// b's claim is valid, so task 1 stays b's target; a still
			// lists it, so it is withheld until a (the stale holder)
			// released it.
			name:       "different generations: the higher (b, gen 3) keeps its claim of task 1 over a (gen 2)",
			partitions: 4,
			members: []Member{
				with(mem("a", 0, 1), func(m *Member) { m.Generation = 2 }),
				with(mem("b", 1, 2), func(m *Member) { m.Generation = 3 }),
			},
			round1: want{
				assignment: A{"a": {0, 3}, "b": {2}},
				withheld:   []int32{1},
				target:     T{0: "a", 1: "b", 2: "b", 3: "a"},
			},
			round2: &want{
				assignment: A{"a": {0, 3}, "b": {1, 2}},
				target:     T{0: "a", 1: "b", 2: "b", 3: "a"},
			},
		},
		{
			name:       "claims of out-of-range tasks (5, 7, -1) ignored; duplicates and disorder tolerated",
			partitions: 2,
			members:    []Member{mem("a", 5, 0, -1, 0), mem("b", 7)},
			round1:     want{assignment: A{"a": {0}, "b": {1}}, target: T{0: "a", 1: "b"}},
		},
		{
			name:       "static members ordered by InstanceID (x before y), not by member ID",
			partitions: 3,
			members: []Member{
				with(mem("aaa"), func(m *Member) { m.InstanceID = "y" }),
				with(mem("zzz"), func(m *Member) { m.InstanceID = "x" }),
			},
			round1: want{assignment: A{"zzz": {0, 2}, "aaa": {1}}},
		},
		{
			name:       "every member excluded: nothing assigned, no target, nothing withheld",
			partitions: 2,
			members:    []Member{with(mem("a", 0), func(m *Member) { m.Version = 0 })},
			round1:     want{assignment: A{"a": {}}, target: T{}, excluded: []string{"a"}},
		},
		{
			name:       "no members: empty result",
			partitions: 4,
			round1:     want{assignment: A{}, target: T{}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Tasks(c.members, c.partitions)
			if err != nil {
				t.Fatal(err)
			}
			checkWant(t, "round 1", res, c.round1)
			checkInvariants(t, c.members, c.partitions, res)
			checkOrderIndependent(t, rand.New(rand.NewPCG(1, 1)), c.members, c.partitions, res)
			if c.round2 != nil {
				m2 := next(c.members, res)
				res2, err := Tasks(m2, c.partitions)
				if err != nil {
					t.Fatal(err)
				}
				checkWant(t, "round 2", res2, *c.round2)
				checkInvariants(t, m2, c.partitions, res2)
			}
		})
	}
}

func TestTasksErrors(t *testing.T) {
	for _, c := range []struct {
		name       string
		partitions int32
		members    []Member
	}{
		{"no task (0 partitions)", 0, []Member{mem("a")}},
		{"negative partitions", -1, nil},
		{"two members share an ID", 2, []Member{mem("a"), with(mem("a"), func(m *Member) { m.InstanceID = "i" })}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Tasks(c.members, c.partitions); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

func TestExcludedReasons(t *testing.T) {
	// Scenario: the log must say what was wrong, so the reason names the
	// version, or both partition counts.
	res, err := Tasks([]Member{
		with(mem("a"), func(m *Member) { m.Version = 0 }),
		with(mem("b"), func(m *Member) { m.Version = -2 }),
		with(mem("c"), func(m *Member) { m.Partitions = 12 }),
	}, 8)
	if err != nil {
		t.Fatal(err)
	}
	wants := [][]string{{"version 0"}, {"-2"}, {"12", "8"}}
	if len(res.Excluded) != len(wants) {
		t.Fatalf("excluded %v", res.Excluded)
	}
	for i, w := range wants {
		for _, s := range w {
			if !strings.Contains(res.Excluded[i].Reason, s) {
				t.Errorf("reason for %s %q does not name %q", res.Excluded[i].ID, res.Excluded[i].Reason, s)
			}
		}
	}
}

// checkOrderIndependent fails unless Tasks gives want for shuffles of members.
func checkOrderIndependent(t *testing.T, r *rand.Rand, members []Member, partitions int32, want Result) {
	t.Helper()
	for range 4 {
		shuffled := slices.Clone(members)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got, err := Tasks(shuffled, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("order dependent: %+v gave %+v, want %+v", shuffled, got, want)
		}
	}
}

// checkInvariants checks what must hold for any input.
func checkInvariants(t *testing.T, members []Member, partitions int32, res Result) {
	t.Helper()
	checkInvariantsOf(t, members, partitions, res, true)
}

// checkInvariantsOf is checkInvariants; balanced says whether target loads
// must differ by at most one (caught-up-first placement may unbalance them).
func checkInvariantsOf(t *testing.T, members []Member, partitions int32, res Result, balanced bool) {
	t.Helper()
	excluded := map[string]bool{}
	for _, e := range res.Excluded {
		excluded[e.ID] = true
	}
	holders := map[int32][]string{}
	for _, m := range members {
		for _, tk := range m.Owned {
			holders[tk] = append(holders[tk], m.ID)
		}
	}
	owner := map[int32]string{}
	var eligible []string
	for _, m := range members {
		ts, ok := res.Assignment[m.ID]
		if !ok {
			t.Fatalf("member %s has no assignment entry", m.ID)
		}
		if !slices.IsSorted(ts) {
			t.Fatalf("assignment of %s not sorted: %v", m.ID, ts)
		}
		if excluded[m.ID] {
			if len(ts) > 0 {
				t.Fatalf("excluded member %s assigned %v", m.ID, ts)
			}
			continue
		}
		eligible = append(eligible, m.ID)
		for _, tk := range ts {
			if tk < 0 || tk >= partitions {
				t.Fatalf("member %s assigned nonexistent task %d", m.ID, tk)
			}
			if o, dup := owner[tk]; dup {
				t.Fatalf("task %d assigned to %s and %s", tk, o, m.ID)
			}
			owner[tk] = m.ID
			for _, h := range holders[tk] {
				if h != m.ID {
					t.Fatalf("task %d assigned to %s while %s holds it", tk, m.ID, h)
				}
			}
			if res.Target[tk] != m.ID {
				t.Fatalf("task %d assigned to %s, target %s", tk, m.ID, res.Target[tk])
			}
		}
	}
	if len(res.Assignment) != len(members) {
		t.Fatalf("%d assignment entries for %d members", len(res.Assignment), len(members))
	}
	if !slices.IsSorted(res.Withheld) {
		t.Fatalf("withheld not sorted: %v", res.Withheld)
	}
	for _, tk := range res.Withheld {
		if _, ok := owner[tk]; ok {
			t.Fatalf("task %d both withheld and assigned", tk)
		}
		if _, ok := res.Target[tk]; !ok {
			t.Fatalf("withheld task %d has no target", tk)
		}
	}
	if len(eligible) == 0 {
		if len(res.Target) != 0 || len(res.Withheld) != 0 {
			t.Fatalf("no eligible member, yet target %v, withheld %v", res.Target, res.Withheld)
		}
		return
	}
	// Every task is either given or withheld, and targets balance.
	if len(owner)+len(res.Withheld) != int(partitions) || len(res.Target) != int(partitions) {
		t.Fatalf("%d assigned + %d withheld, %d targets, for %d tasks", len(owner), len(res.Withheld), len(res.Target), partitions)
	}
	load := map[string]int{}
	for tk, id := range res.Target {
		if excluded[id] || !slices.Contains(eligible, id) {
			t.Fatalf("task %d targets %s, not an eligible member", tk, id)
		}
		load[id]++
	}
	lo, hi := int(partitions), 0
	for _, id := range eligible {
		lo, hi = min(lo, load[id]), max(hi, load[id])
		if len(res.Withheld) == 0 && len(res.Assignment[id]) != load[id] {
			t.Fatalf("nothing withheld, yet %s assigned %v for %d targets", id, res.Assignment[id], load[id])
		}
	}
	if balanced && hi-lo > 1 {
		t.Fatalf("target loads %v differ by more than one", load)
	}
}

func TestTasksProperties(t *testing.T) {
	// Scenario: random groups (old, new and disagreeing members, random and
	// overlapping claims, out-of-range claims, static and dynamic ids); the
	// invariants hold, the input order does not matter, and the next round
	// hands out everything withheld and keeps everything given.
	r := rand.New(rand.NewPCG(2026, 7))
	for i := range 2000 {
		partitions := 1 + r.Int32N(12)
		members := make([]Member, r.IntN(7))
		for j := range members {
			m := Member{
				ID:         fmt.Sprintf("m%d", r.IntN(1000)*10+j), // unique, random order
				Version:    Version,
				Generation: r.Int32N(4) - 1,
			}
			if r.IntN(3) == 0 {
				m.InstanceID = fmt.Sprintf("i%d", r.IntN(100)*10+j)
			}
			switch r.IntN(8) {
			case 0:
				m.Version = 0
			case 1:
				m.Version = Version + 1
			case 2:
				m.Partitions = partitions + 1 + r.Int32N(3)
			case 3, 4:
				m.Partitions = partitions
			}
			members[j] = m
		}
		// Claims overlap freely in half the cases; in the other half
		// each task has at most one holder, as after a clean round.
		overlap := r.IntN(2) == 0
		for tk := range partitions + 2 {
			for j := range members {
				if overlap && r.IntN(3) == 0 {
					members[j].Owned = append(members[j].Owned, tk)
				}
			}
			if j := r.IntN(len(members) + 1); !overlap && j < len(members) {
				members[j].Owned = append(members[j].Owned, tk)
			}
		}
		name := fmt.Sprintf("case %d: %d tasks, %+v", i, partitions, members)
		res, err := Tasks(members, partitions)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ok := t.Run(fmt.Sprint(i), func(t *testing.T) {
			checkInvariants(t, members, partitions, res)
			checkOrderIndependent(t, r, members, partitions, res)

			m2 := next(members, res)
			res2, err := Tasks(m2, partitions)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, m2, partitions, res2)
			if len(res2.Withheld) != 0 {
				t.Fatalf("round 2 withheld %v", res2.Withheld)
			}
			given := 0
			for _, m := range members {
				given += len(res2.Assignment[m.ID])
				// What a member was given it keeps.
				for _, tk := range res.Assignment[m.ID] {
					if !slices.Contains(res2.Assignment[m.ID], tk) {
						t.Fatalf("round 2 took task %d from %s", tk, m.ID)
					}
				}
			}
			if len(res2.Excluded) < len(members) && given != int(partitions) {
				t.Fatalf("round 2 gave %d of %d tasks", given, partitions)
			}
			// The withheld tasks reach the target announced in round 1,
			// unless a target listed its own withheld task: then it had
			// to revoke it, and round 2 starts from less.
			stable := true
			for _, tk := range res.Withheld {
				for _, m := range members {
					if m.ID == res.Target[tk] && slices.Contains(m.Owned, tk) {
						stable = false
					}
				}
			}
			if stable && !reflect.DeepEqual(res2.Target, res.Target) {
				t.Fatalf("round 2 target %v, round 1 target %v", res2.Target, res.Target)
			}
			// Round 3 changes nothing: the layout is a fixed point.
			res3, err := Tasks(next(m2, res2), partitions)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(res3.Assignment, res2.Assignment) {
				t.Fatalf("round 3 %v, round 2 %v", res3.Assignment, res2.Assignment)
			}
		})
		if !ok {
			t.Fatalf("failed on %s", name)
		}
	}
}
