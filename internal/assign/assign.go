// Package assign is the decision of salesagg's consumer-group balancer: given
// the members the group leader sees and the task count, it says which member
// gets which task this round.
//
// A task p is input partition p together with repartition partition p and
// changelog partition p, so tasks, not partitions, are what is balanced: the
// three partitions of a task always move together. The balancer is
// cooperative: a task is never handed to a member while another member still
// reports holding it, because the holder may still be writing the task's
// changelog and local state. Such a task is withheld for one round; the
// holder, seeing it missing from its assignment, revokes it and rejoins, and
// the next round hands it out.
//
// Beyond balance, Plan places tasks caught-up first (the idea of Kafka
// Streams' KIP-441): members report the changelog checkpoint of each local
// store, and an active task goes only to a member whose store is within the
// acceptable lag of the changelog end when such a member exists. When the
// balanced place of a task is a cold member, the task stays on (or goes to)
// a caught-up member, and a warm-up copy is built on the cold one, which
// takes the task over at a later rebalance once caught up. Standby copies of
// each task (on members other than its active) follow.
//
// Tasks and Plan are pure functions so that the rules can be tested
// exhaustively without a broker; the franz-go GroupBalancer glue lives
// elsewhere.
package assign

import (
	"cmp"
	"fmt"
	"slices"
)

// Version is the metadata version this code writes; MinVersion the oldest it
// can read. A newer member only appends fields, so it is read as Version.
// Version 2 adds the members' store checkpoints (Member.Offsets), version
// 3 the changelog ends they measured them against (Member.Ends).
const (
	Version    = 3
	MinVersion = 1
)

// Running is the offset a member reports for an active task it runs: its
// store is the changelog's writer, nothing behind.
const Running int64 = -2

// Member is one group member as the group leader sees it in the JoinGroup
// metadata.
type Member struct {
	ID         string // group member id
	InstanceID string // static membership id, "" when dynamic
	// Version is the member's metadata version; 0 means its metadata could
	// not be decoded.
	Version int
	// Generation is the group generation in which the member was given
	// Owned (-1: none).
	Generation int32
	// Owned are the tasks the member reports holding now (any of the
	// task's partitions), sorted.
	Owned []int32
	// Partitions is the input partition count the member works with
	// (0: unknown).
	Partitions int32
	// Offsets are the member's local stores, per task: the next changelog
	// offset the store reflects, or Running for an active task it runs. A
	// task absent has no local state. Nil means the member reports none
	// (metadata version 1): its Owned tasks count as caught up, the rest
	// as cold.
	Offsets map[int32]int64
	// Ends are, per task, the changelog end offset the member measured its
	// offset against (a standby copy's last stable offset at the same
	// moment); a task absent (or a member of an older version) is measured
	// against the leader's EndOffsets. The member's own decision that a
	// warm-up caught up (CaughtUp) and the leader's are thus made on the
	// same offsets.
	Ends map[int32]int64
}

// CaughtUp is the one rule for a store being caught up: offset (the next
// changelog offset it reflects) within acceptable records of end.
func CaughtUp(offset, end, acceptable int64) bool {
	return offset >= 0 && end >= 0 && max(0, end-offset) <= acceptable
}

// Options are the caught-up-first and standby settings of Plan. The zero
// value is a pure sticky balance without standbys.
type Options struct {
	// EndOffsets are the changelog end offsets per task, read by the
	// leader for this round. Nil means unknown: every member then counts
	// as caught up on every task.
	EndOffsets map[int32]int64
	// AcceptableLag is how many changelog records a store may be behind
	// the end and still count as caught up (acceptable.recovery.lag).
	AcceptableLag int64
	// Standbys is the number of standby copies of each task
	// (num.standby.replicas); warm-ups count towards it.
	Standbys int
	// MaxWarmups bounds the warm-up copies of one round
	// (max.warmup.replicas).
	MaxWarmups int
}

// Excluded is a member that gets no task, and why (human readable, for the
// log).
type Excluded struct{ ID, Reason string }

// Result is one balance round.
type Result struct {
	// Assignment has an entry for every member passed in (possibly empty):
	// member ID -> tasks, sorted.
	Assignment map[string][]int32
	// Target is where each task ends up once this round's moves complete:
	// task -> member ID, withheld tasks included. Tasks no eligible member
	// can take (no member is eligible) are absent.
	Target map[int32]string
	// Withheld are tasks assigned to nobody this round because another
	// member still holds them and must release them first (cooperative
	// protocol). Once the holder has revoked them and rejoined, the next
	// round hands them out: to the same target when the membership is
	// unchanged and the target's own holdings were all handed over this
	// round. Sorted.
	Withheld []int32
	// Excluded lists members given nothing, in member order: metadata older
	// than MinVersion (0: undecodable) or a partition count that disagrees
	// with the leader's.
	Excluded []Excluded
	// Standbys has an entry for every member passed in (possibly empty):
	// member ID -> the tasks it keeps a standby copy of, warm-ups included,
	// sorted. A member never has a standby of a task it is assigned or
	// holds; it has one of each task withheld for it (until the hand-over)
	// and of no other task it is the target of.
	Standbys map[string][]int32
	// Warmups are the standbys that are warm-ups: copies on the member a
	// task should end on, built while a caught-up member runs it. Member
	// ID -> tasks, sorted; only members with warm-ups appear.
	Warmups map[string][]int32
	// Probe is set when some task runs off its balanced place because the
	// member it belongs to is not caught up: a later rebalance, once the
	// warm-ups caught up, moves it.
	Probe bool
}

// member is a Member during one round.
type member struct {
	Member
	owned    []int32 // Owned restricted to 0..partitions-1, sorted, no duplicates
	eligible bool
	claims   []int32 // valid claims: owned tasks this member wins (rule 3)
	quota    int
	target   []int32 // tasks this member ends up with
	standby  []int32 // standby copies, warm-ups included
}

// lag is how many changelog records m's store of task t is behind the end
// (0 when the end is unknown): a running active task is not behind; a store
// beyond the end (the changelog was truncated) or none at all is as far
// behind as the end itself.
func (o *Options) lag(m *member, t int32) int64 {
	end, ok := o.EndOffsets[t]
	if !ok || end <= 0 {
		return 0
	}
	if m.Offsets == nil {
		if slices.Contains(m.owned, t) {
			return 0
		}
		return end
	}
	off, ok := m.Offsets[t]
	if seen, measured := m.Ends[t]; ok && off >= 0 && measured && seen >= 0 {
		// The member's own measurement (see Member.Ends).
		return max(0, seen-off)
	}
	switch {
	case ok && off == Running:
		return 0
	case ok && off >= 0 && off <= end:
		return end - off
	}
	return end
}

// Lag is how many changelog records m's store of task t is behind the end,
// as Plan counts it (0 when the end is unknown).
func (o Options) Lag(m Member, t int32) int64 {
	return o.lag(&member{Member: m, owned: inRange(m.Owned, t+1)}, t)
}

func (o *Options) caughtUp(m *member, t int32) bool { return o.lag(m, t) <= o.AcceptableLag }

// Tasks balances partitions tasks (0..partitions-1) over members. It is a
// pure function: deterministic for the same input whatever the order of
// members, which it orders by InstanceID, then ID (static members thus keep
// their rank across restarts, whatever id the broker gives them).
//
// It fails when partitions < 1 or when two members share an ID (the
// assignment is keyed by ID, so such input cannot be answered).
func Tasks(members []Member, partitions int32) (Result, error) {
	return Plan(members, partitions, Options{})
}

// Plan is Tasks with caught-up-first placement, warm-ups and standbys (see
// Options). After the sticky balance, every task whose place is a member
// that is not caught up moves to a caught-up member (its current holder
// first, else the least loaded), or, when none is caught up, to the member
// with the most state if it has more than the balanced place; the balanced
// place then gets a warm-up copy, while the round's budget lasts. Standbys
// go to the members with the most state of the task first, then to the
// least loaded.
func Plan(members []Member, partitions int32, o Options) (Result, error) {
	if partitions < 1 {
		return Result{}, fmt.Errorf("assign: %d partitions, need at least 1", partitions)
	}
	res := Result{
		Assignment: make(map[string][]int32, len(members)),
		Target:     make(map[int32]string, partitions),
		Standbys:   make(map[string][]int32, len(members)),
		Warmups:    map[string][]int32{},
	}
	ms := make([]*member, len(members))
	for i, m := range members {
		if _, dup := res.Assignment[m.ID]; dup {
			return Result{}, fmt.Errorf("assign: member id %q appears twice", m.ID)
		}
		res.Assignment[m.ID] = []int32{}
		res.Standbys[m.ID] = []int32{}
		ms[i] = &member{Member: m, owned: inRange(m.Owned, partitions)}
	}
	slices.SortFunc(ms, func(a, b *member) int {
		return cmp.Or(cmp.Compare(a.InstanceID, b.InstanceID), cmp.Compare(a.ID, b.ID))
	})

	eligible := admit(ms, partitions, &res)

	// holders[t] are all members listing t, excluded ones included: any of
	// them may still be processing t, so rule 5 must wait for all of them.
	holders := make([][]*member, partitions)
	for _, m := range ms {
		for _, t := range m.owned {
			holders[t] = append(holders[t], m)
		}
	}

	if len(eligible) > 0 {
		claim(eligible, holders)
		place(eligible, holders, partitions, &o)
		warm := caughtUpFirst(eligible, partitions, &o)
		res.Probe = warm.moved
		for _, m := range eligible {
			for _, t := range m.target {
				res.Target[t] = m.ID
			}
		}
		for _, m := range eligible {
			if ts := warm.tasks[m]; len(ts) > 0 {
				slices.Sort(ts)
				res.Warmups[m.ID] = ts
			}
		}
		standbys(eligible, holders, partitions, &o, warm.tasks)
		for _, m := range eligible {
			res.Standbys[m.ID] = m.standby
		}
	}

	handOver(&res, holders, partitions)
	return res, nil
}

// admit returns the members that can take tasks, and lists the others in
// res.Excluded with the reason.
func admit(ms []*member, partitions int32, res *Result) []*member {
	var eligible []*member
	for _, m := range ms {
		switch {
		case m.Version < MinVersion:
			res.Excluded = append(res.Excluded, Excluded{m.ID, versionReason(m.Version)})
		case m.Partitions != 0 && m.Partitions != partitions:
			res.Excluded = append(res.Excluded, Excluded{m.ID, fmt.Sprintf(
				"member works with %d input partitions, the leader with %d", m.Partitions, partitions)})
		default:
			m.eligible = true
			eligible = append(eligible, m)
		}
	}
	return eligible
}

// handOver is the cooperative hand-over: a task is given to its target only
// when the target is the only member (if any) still holding it; otherwise it
// is withheld this round.
func handOver(res *Result, holders [][]*member, partitions int32) {
	for t := range partitions {
		id, ok := res.Target[t]
		if !ok {
			continue
		}
		free := true
		for _, h := range holders[t] {
			if h.ID != id {
				free = false
				break
			}
		}
		if free {
			res.Assignment[id] = append(res.Assignment[id], t)
		} else {
			res.Withheld = append(res.Withheld, t)
		}
	}
}

// versionReason says why a member's metadata version is unreadable.
func versionReason(v int) string {
	if v == 0 {
		return "metadata could not be decoded (version 0)"
	}
	return fmt.Sprintf("metadata version %d is older than the oldest readable, %d", v, MinVersion)
}

// inRange returns the tasks of owned that exist (0..partitions-1), sorted and
// without duplicates, in a new slice: claims of tasks that do not exist (the
// member saw more partitions) are ignored, and the caller's slice is not
// trusted to be sorted nor touched.
func inRange(owned []int32, partitions int32) []int32 {
	var out []int32
	for _, t := range owned {
		if t >= 0 && t < partitions {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// claim fills the valid claims of the eligible members (rule 3): a task
// claimed by several eligible members belongs to the one with the highest
// generation, the others hold a stale copy; a tie at the highest generation
// gives it to nobody, since no one can tell which copy is current. Claims of
// excluded members do not compete: they cannot keep anything.
func claim(eligible []*member, holders [][]*member) {
	for t, hs := range holders {
		var best *member
		tie := false
		for _, h := range hs {
			switch {
			case !h.eligible:
			case best == nil || h.Generation > best.Generation:
				best, tie = h, false
			case h.Generation == best.Generation:
				tie = true
			}
		}
		if best != nil && !tie {
			best.claims = append(best.claims, int32(t))
		}
	}
}

// place sets every eligible member's quota and target (rule 4): members get
// floor(n/m) or ceil(n/m) tasks, keep as many of their valid claims as their
// quota allows, and the rest fills the least-loaded members. The ceil slots
// go first to the members claiming more than floor(n/m), most claims first,
// because that is what keeps the most tasks in place.
//
// The free tasks nobody holds are placed before those still held (each
// group in ascending order): the former are handed over this round, the
// latter withheld, so the next round, where the former are claims and the
// latter free, places the latter exactly where this round targets them.
//
// Among the members with room for a free task, the caught-up ones come
// first, then the least loaded, then the one with the most state.
func place(eligible []*member, holders [][]*member, partitions int32, o *Options) {
	n, m := int(partitions), len(eligible)
	floor, extra := n/m, n%m
	// rank is the claim count of a member that would lose claims at
	// floor(n/m), 0 for the others, so that they stay in member order.
	rank := func(mb *member) int {
		if len(mb.claims) > floor {
			return len(mb.claims)
		}
		return 0
	}
	// Among equal ranks, the ceil slots go first to the members caught up
	// on more of the tasks nobody claims: those are where such tasks
	// should run.
	claimed := make([]bool, n)
	for _, mb := range eligible {
		for _, t := range mb.claims {
			claimed[t] = true
		}
	}
	warm := map[*member]int{}
	for _, mb := range eligible {
		for t := range n {
			if !claimed[t] && o.caughtUp(mb, int32(t)) {
				warm[mb]++
			}
		}
	}
	order := slices.Clone(eligible)
	slices.SortStableFunc(order, func(a, b *member) int {
		return cmp.Or(cmp.Compare(rank(b), rank(a)), cmp.Compare(warm[b], warm[a]))
	})
	for i, mb := range order {
		mb.quota = floor
		if i < extra {
			mb.quota++
		}
	}

	taken := make([]bool, n)
	for _, mb := range eligible {
		// Claims are sorted, so keeping a prefix keeps the lowest ids.
		mb.target = slices.Clone(mb.claims[:min(len(mb.claims), mb.quota)])
		for _, t := range mb.target {
			taken[t] = true
		}
	}
	for _, held := range []bool{false, true} {
		for t := range n {
			if taken[t] || (len(holders[t]) > 0) != held {
				continue
			}
			var to *member
			for _, mb := range eligible {
				if len(mb.target) < mb.quota && (to == nil || better(o, int32(t), mb, to)) {
					to = mb
				}
			}
			if to == nil {
				// Unreachable: the quotas sum to n and every member holds
				// at most its quota, so a free task always finds room.
				panic("assign: no room for a free task")
			}
			to.target = append(to.target, int32(t))
		}
	}
	for _, mb := range eligible {
		slices.Sort(mb.target)
	}
}

// better reports whether a is a better place than b for free task t:
// caught up first, then fewer tasks, then less lag (member order breaks
// ties, by the caller keeping the first).
func better(o *Options, t int32, a, b *member) bool {
	if ca, cb := o.caughtUp(a, t), o.caughtUp(b, t); ca != cb {
		return ca
	}
	if len(a.target) != len(b.target) {
		return len(a.target) < len(b.target)
	}
	return o.lag(a, t) < o.lag(b, t)
}

// warmups is what caughtUpFirst decided.
type warmups struct {
	tasks map[*member][]int32 // member -> tasks it builds a warm-up of
	moved bool                // some task runs off its balanced place
}

// caughtUpFirst moves every task whose balanced place is not caught up to
// a caught-up member (its valid claimant first: stickiness; else the least
// loaded), or, when no member is caught up, to the member with the least
// lag if it has less than the balanced place. The balanced place gets a
// warm-up copy while o.MaxWarmups lasts.
func caughtUpFirst(eligible []*member, partitions int32, o *Options) warmups {
	w := warmups{tasks: map[*member][]int32{}}
	if o.EndOffsets == nil {
		return w
	}
	owner := make([]*member, partitions)
	for _, m := range eligible {
		for _, t := range m.target {
			owner[t] = m
		}
	}
	budget := o.MaxWarmups
	for t := range partitions {
		dest := owner[t]
		if dest == nil || o.caughtUp(dest, t) {
			continue
		}
		var to *member
		for _, m := range eligible {
			if o.caughtUp(m, t) && slices.Contains(m.claims, t) {
				to = m
			}
		}
		if to == nil {
			for _, m := range eligible {
				if o.caughtUp(m, t) && (to == nil || len(m.target) < len(to.target)) {
					to = m
				}
			}
		}
		if to == nil {
			for _, m := range eligible {
				l := o.lag(m, t)
				if l < o.lag(dest, t) && (to == nil || l < o.lag(to, t) || (l == o.lag(to, t) && len(m.target) < len(to.target))) {
					to = m
				}
			}
		}
		if to == nil {
			continue // nobody has more of it than its balanced place
		}
		dest.target = slices.DeleteFunc(dest.target, func(x int32) bool { return x == t })
		to.target = append(to.target, t)
		slices.Sort(to.target)
		owner[t] = to
		w.moved = true
		if budget > 0 {
			budget--
			w.tasks[dest] = append(w.tasks[dest], t)
		}
	}
	return w
}

// standbys gives every task up to o.Standbys copies, counting its
// warm-ups, on members that neither run it, hold it nor are its target:
// caught-up members first (least loaded, then least lag), then the ones
// with the most state. Load is active plus standby tasks.
func standbys(eligible []*member, holders [][]*member, partitions int32, o *Options, warm map[*member][]int32) {
	load := map[*member]int{}
	for _, m := range eligible {
		m.standby = slices.Clone(warm[m])
		// The target of a task still held elsewhere (withheld this round)
		// keeps a copy of it until the hand-over: the copy it may have
		// tailed, so that it restores only the last records.
		for _, t := range m.target {
			for _, h := range holders[t] {
				if h != m {
					m.standby = append(m.standby, t)
					break
				}
			}
		}
		load[m] = len(m.target) + len(m.standby)
	}
	if o.Standbys < 1 {
		for _, m := range eligible {
			slices.Sort(m.standby)
		}
		return
	}
	for t := range partitions {
		copies := 0
		for _, m := range eligible {
			if slices.Contains(m.standby, t) {
				copies++
			}
		}
		for copies < o.Standbys {
			var to *member
			for _, m := range eligible {
				if slices.Contains(m.target, t) || slices.Contains(m.standby, t) || slices.Contains(holders[t], m) {
					continue
				}
				if to == nil || standbyBetter(o, t, m, to, load) {
					to = m
				}
			}
			if to == nil {
				break
			}
			to.standby = append(to.standby, t)
			load[to]++
			copies++
		}
	}
	for _, m := range eligible {
		slices.Sort(m.standby)
	}
}

// standbyBetter reports whether a is a better standby of t than b.
func standbyBetter(o *Options, t int32, a, b *member, load map[*member]int) bool {
	ca, cb := o.caughtUp(a, t), o.caughtUp(b, t)
	if ca != cb {
		return ca
	}
	if !ca {
		if la, lb := o.lag(a, t), o.lag(b, t); la != lb {
			return la < lb
		}
	}
	if load[a] != load[b] {
		return load[a] < load[b]
	}
	return o.lag(a, t) < o.lag(b, t)
}
