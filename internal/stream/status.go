package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
)

// Errors of queries.
var (
	// ErrNotReady: the task owning the product is not running yet
	// (restoring), or no partitions are assigned yet.
	ErrNotReady = errors.New("stream: task not ready")
	// ErrNotHosted: the partition owning the product is assigned to no task
	// of this process.
	ErrNotHosted = errors.New("stream: partition not hosted by this instance")
)

// Total returns the committed total of product from the store of the task
// that owns it. Totals reflect the last commit cycle (commit.interval.ms).
func (rt *Runtime) Total(product string) (int64, bool, error) {
	s, err := rt.productStore(product)
	if err != nil {
		return 0, false, err
	}
	e, ok, err := s.Get(product)
	return e.Total, ok, err
}

// productStore returns the store of the task running product here: a
// NotHostedError when another member runs it, ErrNotReady while it is not
// running (or no partitions are assigned yet).
func (rt *Runtime) productStore(product string) (*state.Store, error) {
	n := rt.reg.topology().partitions
	if n == 0 {
		return nil, ErrNotReady
	}
	p := sales.Partition([]byte(product), n)
	t := rt.reg.task(p)
	if t == nil {
		return nil, rt.notHosted(p)
	}
	if t.State() != taskRunning {
		return nil, fmt.Errorf("%w: task %s is %s", ErrNotReady, t.name, t.State())
	}
	s := t.totals.store.Load()
	if s == nil {
		return nil, ErrNotReady
	}
	return s, nil
}

// eachRunningStore calls fn with the store of each task running here.
// unavailable names, sorted, the tasks assigned here but not running and
// those whose store closed under fn (state.ErrClosed); another error of fn
// ends the walk.
func (rt *Runtime) eachRunningStore(fn func(*state.Store) error) (unavailable []string, err error) {
	for _, t := range rt.reg.tasks() {
		s := t.totals.store.Load()
		if t.State() != taskRunning || s == nil {
			unavailable = append(unavailable, t.name)
			continue
		}
		if err := fn(s); errors.Is(err, state.ErrClosed) {
			unavailable = append(unavailable, t.name)
		} else if err != nil {
			return nil, err
		}
	}
	sort.Strings(unavailable)
	return unavailable, nil
}

// Products lists up to limit totals sorted by product, after the product
// after, from every running task. unavailable names the tasks that are
// assigned but not running, whose products are missing from the page.
func (rt *Runtime) Products(after string, limit int) (page []state.Total, unavailable []string, err error) {
	unavailable, err = rt.eachRunningStore(func(s *state.Store) error {
		got, err := s.Scan(after, limit)
		page = append(page, got...)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(page, func(i, j int) bool { return page[i].Product < page[j].Product })
	if len(page) > limit {
		page = page[:limit]
	}
	return page, unavailable, nil
}

// topChunk is how many products TopProducts reads from a store under one
// hold of its read lock: a commit cycle's store write waits at most that
// long behind a top query.
const topChunk = 4096

// TopProducts returns the limit largest totals (equal totals by product)
// of every running task, read by a full pass over each task's store in
// chunks of topChunk products (each chunk a consistent read; the pass as a
// whole is not a snapshot: a total committed meanwhile may show with its
// new or its old value). unavailable names the tasks assigned but not
// running, and those stopped during the pass, whose products are missing.
// It returns ctx's error when ctx ends first.
func (rt *Runtime) TopProducts(ctx context.Context, limit int) (top []state.Total, unavailable []string, err error) {
	var h state.TopTotals
	unavailable, err = rt.eachRunningStore(func(s *state.Store) error { return scanTop(ctx, s, limit, &h) })
	if err != nil {
		return nil, nil, err
	}
	return h.Sorted(), unavailable, nil
}

// scanTop offers every total of store s to h, bound limit, reading it in
// chunks of topChunk products; it stops at ctx's end with its error.
func scanTop(ctx context.Context, s *state.Store, limit int, h *state.TopTotals) error {
	n := 0
	return s.Each(topChunk, func(e state.Total) error {
		h.Offer(e, limit)
		if n++; n%topChunk == 0 {
			return ctx.Err()
		}
		return nil
	})
}

// StandbyPage lists the products of task's standby copy here, when it
// runs within acceptable.recovery.lag: up to limit after the product after
// (by product), or with byTotal the limit largest totals (read whole, as
// TopProducts). lag is how many changelog records the copy may be behind.
func (rt *Runtime) StandbyPage(ctx context.Context, task, after string, limit int, byTotal bool) (page []state.Total, lag int64, err error) {
	p, ok := state.ParseTaskName(task)
	if !ok {
		return nil, 0, fmt.Errorf("%w: %q is not a task name", ErrNotHosted, task)
	}
	st, lag, err := usableStandby(rt.reg.standby(p), rt.env.cfg.AcceptableRecoveryLag)
	if err != nil {
		return nil, lag, err
	}
	if !byTotal {
		page, err = st.Scan(after, limit)
		return page, lag, err
	}
	var h state.TopTotals
	if err := scanTop(ctx, st, limit, &h); err != nil {
		return nil, lag, err
	}
	return h.Sorted(), lag, nil
}

// NotHostedError is the error of a query for a product whose task runs on
// another member (or on none yet). It wraps ErrNotHosted.
type NotHostedError struct {
	Task      string // "0_<partition>"
	Partition int32
	// Owner is the group.instance.id (or member id) of the member running
	// the task in the latest assignment, "" when unknown (a rebalance is
	// in progress).
	Owner string
	// Server is the owner's application.server, "" when unknown.
	Server string
	// Unroutable, when set, says why the owner cannot be asked: it
	// advertises an address that is not host:port. Its tasks are answered
	// 503 here.
	Unroutable string
}

// StandbyTotal returns product's total from this instance's standby copy
// of its task, when one runs here within acceptable.recovery.lag; lag is how
// many changelog records the copy may be behind. It fails (ErrNotHosted,
// ErrNotReady) otherwise.
func (rt *Runtime) StandbyTotal(product string) (total int64, ok bool, lag int64, err error) {
	n := rt.reg.topology().partitions
	if n == 0 {
		return 0, false, 0, ErrNotReady
	}
	return standbyTotal(rt.reg.standby(sales.Partition([]byte(product), n)), rt.env.cfg.AcceptableRecoveryLag, product)
}

// StandbyServers returns the other members keeping a standby copy of
// product's task (with a usable application.server), by name.
func (rt *Runtime) StandbyServers(product string) []status.Peer {
	n := rt.reg.topology().partitions
	if n == 0 {
		return nil
	}
	p := sales.Partition([]byte(product), n)
	info := rt.asg.assignment()
	var out []status.Peer
	for name, tasks := range info.standbys {
		if _, ok := tasks[p]; ok && name != rt.env.instanceID && info.servers[name] != "" {
			out = append(out, status.Peer{Name: name, Server: info.servers[name]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (e *NotHostedError) Error() string {
	if e.Owner == "" {
		return fmt.Sprintf("%v: task %s (partition %d) has no known owner yet (a rebalance is in progress)", ErrNotHosted, e.Task, e.Partition)
	}
	if e.Unroutable != "" {
		return fmt.Sprintf("%v: task %s (partition %d) runs on member %s, which %s", ErrNotHosted, e.Task, e.Partition, e.Owner, e.Unroutable)
	}
	return fmt.Sprintf("%v: task %s (partition %d) runs on member %s", ErrNotHosted, e.Task, e.Partition, e.Owner)
}

func (e *NotHostedError) Unwrap() error { return ErrNotHosted }

func (rt *Runtime) notHosted(p int32) error {
	e := &NotHostedError{Task: state.TaskName(p), Partition: p}
	info := rt.asg.assignment()
	if owner := info.owners[p]; owner != rt.env.instanceID {
		e.Owner = owner
		e.Server = info.servers[owner]
		e.Unroutable = info.badServers[owner]
	}
	return e
}

// TaskOf returns the name of the task owning product ("" before the topics
// are known).
func (rt *Runtime) TaskOf(product string) string {
	n := rt.reg.topology().partitions
	if n == 0 {
		return ""
	}
	return state.TaskName(sales.Partition([]byte(product), n))
}

// Instances returns the group's members and their tasks from the latest
// assignment, sorted by name; this instance is always listed.
func (rt *Runtime) Instances() []status.Instance {
	info := rt.asg.assignment()
	byName := map[string]*status.Instance{}
	get := func(name string) *status.Instance {
		if is, ok := byName[name]; ok {
			return is
		}
		is := &status.Instance{Name: name, Server: info.servers[name], Tasks: []string{}, Standbys: []string{}, Self: name == rt.env.instanceID}
		byName[name] = is
		return is
	}
	me := get(rt.env.instanceID)
	me.Server = rt.appServer
	for name := range info.servers {
		get(name)
	}
	tasks := make([]int32, 0, len(info.owners))
	for t := range info.owners {
		tasks = append(tasks, t)
	}
	sort.Slice(tasks, func(i, j int) bool { return tasks[i] < tasks[j] })
	for _, t := range tasks {
		is := get(info.owners[t])
		is.Tasks = append(is.Tasks, state.TaskName(t))
	}
	for name, sb := range info.standbys {
		is := get(name)
		for t := range sb {
			is.Standbys = append(is.Standbys, state.TaskName(t))
		}
		sort.Slice(is.Standbys, func(i, j int) bool { return taskLess(is.Standbys[i], is.Standbys[j]) })
	}
	rt.describeMembers(byName)
	out := make([]status.Instance, 0, len(byName))
	for _, is := range byName {
		out = append(out, *is)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// describeMembers adds what a streams group's coordinator describes of
// each member (StreamsGroupDescribe): its member id and epoch, and the
// tasks it means for the member that the member is not given yet. A
// member is matched by its name, or else by its application.server.
func (rt *Runtime) describeMembers(byName map[string]*status.Instance) {
	// A session exists only once Run made the client (read through it).
	s := rt.current.Load()
	if rt.member == nil || s == nil {
		return
	}
	for _, d := range rt.described.read(s.env.client, rt.env.cfg.ApplicationID) {
		is := byName[d.name]
		if is == nil {
			for _, candidate := range byName {
				if d.endpoint != "" && candidate.Server == d.endpoint {
					is = candidate
				}
			}
		}
		if is == nil {
			continue
		}
		is.Member, is.MemberEpoch = d.id, d.epoch
		for _, p := range d.target {
			if !slices.Contains(d.active, p) {
				is.Pending = append(is.Pending, state.TaskName(p))
			}
		}
	}
}

// taskLess orders task names by partition ("0_2" before "0_10").
func taskLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// Tasks returns the status of every assigned task, by partition.
func (rt *Runtime) Tasks() []status.Task {
	var out []status.Task
	// Past the lease's deadline the tasks are being dropped (lease.go):
	// they are not reported running, whatever their goroutines say.
	overdue := false
	if s := rt.current.Load(); s != nil {
		overdue = s.lease.overdue(time.Now())
	}
	for _, t := range rt.reg.tasks() {
		st := t.State()
		state := st.String()
		if overdue && st == taskRunning {
			state = "lost"
		}
		pos, hwm := t.stats.inputPos.Load(), t.stats.inputHWM.Load()
		lag := int64(0)
		if pos >= 0 && hwm > pos {
			lag = hwm - pos
		}
		out = append(out, status.Task{
			Task:       t.name,
			Partition:  t.partition,
			Role:       "active",
			State:      state,
			Checkpoint: t.stats.checkpoint.Load(),
			Restore: status.Restore{
				From:       t.stats.restoreFrom.Load(),
				To:         t.stats.restoreTo.Load(),
				Restored:   t.stats.restored.Load(),
				Done:       st >= taskRunning && st != taskFailed,
				DurationMs: t.stats.restoreMillis.Load(),
			},
			Counters: status.Counters{
				Position:   pos,
				Lag:        lag,
				Processed:  t.stats.processed.Load(),
				Duplicates: t.stats.duplicates.Load(),
				BadEvents:  t.stats.bad.Load(),
				Forwarded:  t.stats.forwarded.Load(),
				Cache: &status.Cache{Hits: t.totals.cache.stats.hits.Load(), Misses: t.totals.cache.stats.misses.Load(),
					Evictions: t.totals.cache.stats.evictions.Load(), Bytes: t.totals.cache.stats.bytes.Load()},
			},
		})
		ts := &out[len(out)-1]
		for _, w := range t.windows {
			ts.Windows = append(ts.Windows, w.status())
		}
		waiting, ferr, attempts, since, overdue := t.trouble.snapshot(rt.env.cfg.TaskTimeout)
		ts.Waiting, ts.Unhealthy = waiting, overdue
		if kw := rt.env.waits.forPartition(t.partition); kw != "" {
			if ts.Waiting != "" {
				ts.Waiting += "; "
			}
			ts.Waiting += "Kafka: " + kw
		}
		if ferr != "" {
			ts.Failing = &status.Failing{Error: ferr, Attempts: attempts, Since: since.UTC().Format(time.RFC3339)}
		}
	}
	for _, sb := range rt.reg.standbys() {
		ts := status.Task{
			Task:       sb.name,
			Partition:  sb.partition,
			Role:       sb.role(),
			State:      sb.State().String(),
			Checkpoint: sb.pos.position.Load(),
			Restore:    status.Restore{Restored: sb.pos.applied.Load()},
			Counters:   status.Counters{Position: -1},
		}
		if lag := sb.lag(); lag >= 0 {
			ts.ChangelogLag = &lag
		}
		for _, f := range sb.windows {
			ts.Windows = append(ts.Windows, f.status())
		}
		out = append(out, ts)
	}
	return out
}

// Ready reports whether the process serves: it has an assignment and every
// assigned task is running. The reason says what is missing.
func (rt *Runtime) Ready() (bool, string) {
	assigned, stopping, refused := rt.reg.readiness()
	switch {
	case stopping:
		return false, "shutting down"
	case refused != "":
		return false, "assignment refused: " + refused
	}
	if rt.member != nil {
		if problem, _ := rt.member.readiness(); problem != "" {
			return false, "this streams group member cannot run: " + problem
		}
	}
	if s := rt.current.Load(); s != nil {
		if reason := s.lease.lapseReason(); reason != "" {
			return false, reason
		}
	}
	if since, err, down := rt.env.reach.unreachable(); down && (!assigned || rt.env.kafkaDown.Load()) {
		return false, fmt.Sprintf("Kafka unreachable since %s: %s", since.UTC().Format("2006-01-02 15:04:05Z"), describeDial(err))
	}
	switch {
	case !assigned:
		return false, "no partitions assigned yet"
	case rt.env.kafkaDown.Load():
		return false, "Kafka unreachable: the open transaction is being aborted"
	}
	for _, t := range rt.reg.tasks() {
		if st := t.State(); st != taskRunning {
			reason := fmt.Sprintf("task %s is %s", t.name, st)
			waiting, ferr, attempts, _, _ := t.trouble.snapshot(rt.env.cfg.TaskTimeout)
			switch {
			case ferr != "":
				reason += fmt.Sprintf(" (failed %d times, retrying: %s)", attempts, ferr)
			case waiting != "":
				reason += " (waiting for " + waiting + ")"
			}
			return false, reason
		}
	}
	// A task withheld for this member is about to run here: not ready
	// until it does, so that a rolling restart waiting for readiness does
	// not stop the next instance before this one has its tasks back.
	var incoming []string
	for _, sb := range rt.reg.standbys() {
		if copyKind(sb.kind.Load()) == kindIncoming {
			incoming = append(incoming, sb.name)
		}
	}
	if len(incoming) > 0 {
		sort.Slice(incoming, func(i, j int) bool { return taskLess(incoming[i], incoming[j]) })
		return false, fmt.Sprintf("tasks %s are being handed over to this instance", strings.Join(incoming, ", "))
	}
	if kw := rt.env.waits.summary(); kw != "" {
		// Still serving: the stores answer, and the client retries.
		return true, "all tasks running; waiting for Kafka: " + kw
	}
	return true, "all tasks running"
}

// Healthy reports whether the process works: false once a task kept
// failing (or waiting on what should not take that long) for longer than
// task.timeout.ms, while it retries. The reason says which and why.
func (rt *Runtime) Healthy() (bool, string) {
	for _, t := range rt.reg.tasks() {
		waiting, ferr, attempts, since, overdue := t.trouble.snapshot(rt.env.cfg.TaskTimeout)
		if !overdue {
			continue
		}
		if ferr != "" {
			return false, fmt.Sprintf("task %s has failed %d times since %s (task.timeout.ms %d): %s", t.name, attempts,
				since.UTC().Format(time.RFC3339), rt.env.cfg.TaskTimeout.Milliseconds(), ferr)
		}
		return false, fmt.Sprintf("task %s has waited since %s for %s", t.name, since.UTC().Format(time.RFC3339), waiting)
	}
	return true, "ok"
}

// BadEvents returns the number of bad events skipped since start.
func (rt *Runtime) BadEvents() int64 { return rt.env.badEvents.Load() }

// ScanStore returns up to limit totals of the store of task (an active task
// running on this instance), sorted by product, after the product after (""
// starts at the first). The status page reads the stores with it in bounded
// chunks to find the top products (see httpapi's topProducts); it reads the
// committed totals, as Products does, and never blocks the task for longer
// than one chunk's iteration.
//
// It fails with ErrNotHosted when the task does not run here and with
// ErrNotReady while it is not running (restoring, stalled, stopping).
func (rt *Runtime) ScanStore(task, after string, limit int) ([]state.Total, error) {
	for _, t := range rt.reg.tasks() {
		if t.name != task {
			continue
		}
		s := t.totals.store.Load()
		if st := t.State(); st != taskRunning || s == nil {
			return nil, fmt.Errorf("%w: task %s is %s", ErrNotReady, task, st)
		}
		return s.Scan(after, limit)
	}
	return nil, fmt.Errorf("%w: task %s", ErrNotHosted, task)
}
