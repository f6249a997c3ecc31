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
// Tasks is a pure function so that the rules can be tested exhaustively
// without a broker; the franz-go GroupBalancer glue lives elsewhere.
package assign

import (
	"cmp"
	"fmt"
	"slices"
)

// Version is the metadata version this code writes; MinVersion the oldest it
// can read. A newer member only appends fields, so it is read as Version.
const (
	Version    = 1
	MinVersion = 1
)

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
}

// member is a Member during one round.
type member struct {
	Member
	owned    []int32 // Owned restricted to 0..partitions-1, sorted, no duplicates
	eligible bool
	claims   []int32 // valid claims: owned tasks this member wins (rule 3)
	quota    int
	target   []int32 // tasks this member ends up with
}

// Tasks balances partitions tasks (0..partitions-1) over members. It is a
// pure function: deterministic for the same input whatever the order of
// members, which it orders by InstanceID, then ID (static members thus keep
// their rank across restarts, whatever id the broker gives them).
//
// It fails when partitions < 1 or when two members share an ID (the
// assignment is keyed by ID, so such input cannot be answered).
func Tasks(members []Member, partitions int32) (Result, error) {
	if partitions < 1 {
		return Result{}, fmt.Errorf("assign: %d partitions, need at least 1", partitions)
	}
	res := Result{
		Assignment: make(map[string][]int32, len(members)),
		Target:     make(map[int32]string, partitions),
	}
	ms := make([]*member, len(members))
	for i, m := range members {
		if _, dup := res.Assignment[m.ID]; dup {
			return Result{}, fmt.Errorf("assign: member id %q appears twice", m.ID)
		}
		res.Assignment[m.ID] = []int32{}
		ms[i] = &member{Member: m, owned: inRange(m.Owned, partitions)}
	}
	slices.SortFunc(ms, func(a, b *member) int {
		return cmp.Or(cmp.Compare(a.InstanceID, b.InstanceID), cmp.Compare(a.ID, b.ID))
	})

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
		place(eligible, holders, partitions)
		for _, m := range eligible {
			for _, t := range m.target {
				res.Target[t] = m.ID
			}
		}
	}

	// Cooperative hand-over: give a task only when its target is the only
	// member (if any) still holding it.
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
	return res, nil
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
func place(eligible []*member, holders [][]*member, partitions int32) {
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
	order := slices.Clone(eligible)
	slices.SortStableFunc(order, func(a, b *member) int { return cmp.Compare(rank(b), rank(a)) })
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
				if len(mb.target) < mb.quota && (to == nil || len(mb.target) < len(to.target)) {
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
