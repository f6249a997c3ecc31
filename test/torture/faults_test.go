//go:build torture

package torture

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/test/harness"
)

const (
	syscallStop = syscall.SIGSTOP
	syscallCont = syscall.SIGCONT
)

// A fault's lanes: broker faults run one at a time, instance faults one at
// a time, the two side by side; a fault that touches both takes both.
type lane int

const (
	brokerLane lane = 1 << iota
	instanceLane
)

// fault is one kind of fault: apply injects it, holds it and heals it, and
// says what it did and when the cluster was whole again.
type fault struct {
	kind   string
	lanes  lane
	weight int
	// eosOnly faults make sense only with transactions.
	eosOnly bool
	apply   func(r *run, rng *rand.Rand) (detail string, healed time.Time, err error)
}

var faults = []fault{
	{kind: "changelog-leader-kill", lanes: brokerLane, weight: 3, apply: (*run).changelogLeaderKill},
	{kind: "txn-coordinator-kill", lanes: brokerLane, weight: 3, eosOnly: true, apply: (*run).txnCoordinatorKill},
	{kind: "group-coordinator-kill-in-rebalance", lanes: brokerLane | instanceLane, weight: 2, apply: (*run).groupCoordinatorKillInRebalance},
	{kind: "broker-pause", lanes: brokerLane, weight: 2, apply: (*run).brokerPause},
	{kind: "rolling-restart", lanes: brokerLane, weight: 1, apply: (*run).rollingRestart},
	{kind: "partition-one-broker", lanes: instanceLane, weight: 3, apply: (*run).partitionOne},
	{kind: "partition-all-brokers", lanes: instanceLane, weight: 2, apply: (*run).partitionAll},
	{kind: "instance-pause-zombie", lanes: instanceLane, weight: 2, apply: (*run).instancePause},
	{kind: "instance-kill", lanes: instanceLane, weight: 2, apply: (*run).instanceKill},
	{kind: "slow-network", lanes: instanceLane, weight: 1, apply: (*run).slowNetwork},
}

// lanes runs the broker lane and the instance lane until end.
type lanes struct {
	r   *run
	end time.Time
	// brokerMu and instanceMu are held by the fault running in that lane
	// (both, in that order, by a fault of both).
	brokerMu, instanceMu sync.Mutex
}

func newLanes(r *run, end time.Time) *lanes { return &lanes{r: r, end: end} }

func (l *lanes) run() {
	var wg sync.WaitGroup
	for i, ln := range []lane{brokerLane, instanceLane} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.loop(ln, laneRand(l.r.seed, i))
		}()
	}
	wg.Wait()
}

// loop draws the lane's faults from rng until end: each fault, then the
// wait for the group to recover, then a pause of 0.5 to 2 s.
func (l *lanes) loop(ln lane, rng *rand.Rand) {
	var pool []fault
	total := 0
	for _, f := range faults {
		if f.lanes&ln == 0 || (f.eosOnly && l.r.guarantee != "exactly_once_v2") {
			continue
		}
		// A fault of both lanes is drawn by the broker lane only.
		if f.lanes != ln && ln != brokerLane {
			continue
		}
		pool = append(pool, f)
		total += f.weight
	}
	for time.Now().Before(l.end) {
		n := rng.IntN(total)
		var f fault
		for _, c := range pool {
			if n < c.weight {
				f = c
				break
			}
			n -= c.weight
		}
		l.one(f, rng)
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
	}
}

// one runs fault f with its lanes' locks held, and records it.
func (l *lanes) one(f fault, rng *rand.Rand) {
	if f.lanes&brokerLane != 0 {
		l.brokerMu.Lock()
		defer l.brokerMu.Unlock()
	}
	if f.lanes&instanceLane != 0 {
		l.instanceMu.Lock()
		defer l.instanceMu.Unlock()
	}
	r := l.r
	start := time.Now()
	detail, healed, err := f.apply(r, rng)
	rec := faultRecord{Kind: f.kind, Detail: detail, Start: start, HeldMs: healed.Sub(start).Milliseconds()}
	if err != nil {
		// The fault could not be injected as drawn (what it aims at was
		// not found in time): not an anomaly of the service.
		rec.Detail = fmt.Sprintf("%s (not injected: %v)", detail, err)
		rec.NotInjected = true
		if healed.IsZero() {
			rec.HeldMs = 0
			healed = time.Now()
		}
	}
	rec.RecoveryMs = -1
	took, rerr := r.recovery(healed)
	rec.RecoveryMs = took.Milliseconds()
	if rerr != nil {
		rec.Anomaly = rerr.Error()
	}
	if gone := r.newExits(); len(gone) > 0 {
		rec.Anomaly = joinNonEmpty(rec.Anomaly, fmt.Sprintf("instances exited on their own: %v", gone))
	}
	r.t.Logf("fault %-36s held %6d ms, recovered in %6d ms: %s%s", f.kind, rec.HeldMs, rec.RecoveryMs, rec.Detail, prefixed(" ANOMALY: ", rec.Anomaly))
	r.record(rec)
}

func joinNonEmpty(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// ctx returns a context for one lookup.
func lookup() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 15*time.Second)
}

// hold sleeps for a duration drawn in [lo, hi).
func hold(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	d := lo + time.Duration(rng.Int64N(int64(hi-lo)))
	time.Sleep(d)
	return d
}

// restartNode starts node n again and waits until the cluster is whole.
func (r *run) restartNode(n int32) (time.Time, error) {
	if err := r.cluster.Start(n); err != nil {
		r.t.Fatalf("starting node %d again: %v", n, err)
	}
	healed := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := r.cluster.WaitHealthy(ctx); err != nil {
		return healed, fmt.Errorf("the cluster did not heal after node %d started: %w", n, err)
	}
	return healed, nil
}

// killAndRestart kills -9 node n, keeps it down for 1 s to up, starts it
// again and waits until the cluster is whole. A kill that fails returns
// detail without a heal time: the fault did not happen.
func (r *run) killAndRestart(rng *rand.Rand, n int32, up time.Duration, detail string) (string, time.Time, error) {
	if err := r.cluster.Kill(n); err != nil {
		return detail, time.Time{}, err
	}
	hold(rng, time.Second, up)
	healed, err := r.restartNode(n)
	return detail, healed, softErr(err, &detail)
}

// ownerOf returns the instance running task, -1 when none does.
func (r *run) ownerOf(task string) int {
	for i := range instances {
		if m := r.member(i); m.Alive() && m.Running()[task] {
			return i
		}
	}
	return -1
}

// withTasks returns the instances running at least one task, in order.
func (r *run) withTasks() []int {
	var out []int
	for i := range instances {
		if m := r.member(i); m.Alive() && len(m.Running()) > 0 {
			out = append(out, i)
		}
	}
	return out
}

// txnID returns the transactional id instance i logged.
func (r *run) txnID(i int) (string, error) {
	for _, e := range r.member(i).LogsWith("Exactly-once processing") {
		if id, ok := e["transactional_id"].(string); ok {
			return id, nil
		}
	}
	return "", fmt.Errorf("%s logged no transactional id", r.member(i).Name)
}

// waitOngoing polls txnID's state until a transaction is open (its
// records produced, EndTxn not yet sent), for up to 5 s.
func (r *run) waitOngoing(txnID string) (harness.TxnDescription, error) {
	deadline := time.Now().Add(5 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := lookup()
		d, err := r.cluster.DescribeTransaction(ctx, txnID)
		cancel()
		if err == nil && d.State == "Ongoing" {
			return d, nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("state %s", d.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return harness.TxnDescription{}, fmt.Errorf("no open transaction of %s within 5 s: %v", txnID, last)
}

// changelogLeaderKill kills -9 the leader of a changelog partition while
// its task's transaction is open (exactly-once), waits, starts it again.
func (r *run) changelogLeaderKill(rng *rand.Rand) (string, time.Time, error) {
	p := int32(rng.IntN(partitions))
	detail := fmt.Sprintf("changelog partition %d", p)
	if r.guarantee == "exactly_once_v2" {
		if i := r.ownerOf(fmt.Sprintf("0_%d", p)); i >= 0 {
			if id, err := r.txnID(i); err == nil {
				if _, err := r.waitOngoing(id); err == nil {
					detail += fmt.Sprintf(", %s's transaction open", r.member(i).Name)
				}
			}
		}
	}
	ctx, cancel := lookup()
	leader, err := r.cluster.LeaderOf(ctx, r.changelog, p)
	cancel()
	if err != nil {
		return detail, time.Time{}, err
	}
	detail += fmt.Sprintf(", leader node %d killed", leader)
	return r.killAndRestart(rng, leader, 4*time.Second, detail)
}

// txnCoordinatorKill kills -9 the transaction coordinator of an instance's
// transactional id between its produce and its EndTxn.
func (r *run) txnCoordinatorKill(rng *rand.Rand) (string, time.Time, error) {
	busy := r.withTasks()
	if len(busy) == 0 {
		return "no instance runs a task", time.Time{}, errors.New("nothing to aim at")
	}
	i := busy[rng.IntN(len(busy))]
	id, err := r.txnID(i)
	if err != nil {
		return "", time.Time{}, err
	}
	d, err := r.waitOngoing(id)
	if err != nil {
		return id, time.Time{}, err
	}
	detail := fmt.Sprintf("%s's transaction (%s, %d partitions) open on coordinator node %d, killed", r.member(i).Name, id, countParts(d.Partitions), d.Coordinator)
	return r.killAndRestart(rng, d.Coordinator, 3*time.Second, detail)
}

func countParts(m map[string][]int32) int {
	n := 0
	for _, ps := range m {
		n += len(ps)
	}
	return n
}

// groupCoordinatorKillInRebalance restarts an instance (a rebalance) and
// kills -9 the group coordinator while the group rebalances.
func (r *run) groupCoordinatorKillInRebalance(rng *rand.Rand) (string, time.Time, error) {
	i := rng.IntN(instances)
	m := r.member(i)
	r.ourExit(m)
	m.Stop(harness.StopGrace)
	r.restart(i)
	deadline := time.Now().Add(10 * time.Second)
	state := ""
	for time.Now().Before(deadline) {
		var moving bool
		state, moving = r.groupState()
		if moving {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := lookup()
	coord, err := r.cluster.GroupCoordinator(ctx, r.app)
	cancel()
	if err != nil {
		return fmt.Sprintf("%s restarted", m.Name), time.Time{}, err
	}
	detail := fmt.Sprintf("%s restarted, group %s, coordinator node %d killed", m.Name, state, coord)
	return r.killAndRestart(rng, coord, 3*time.Second, detail)
}

// brokerPause pauses a broker (the group coordinator half the time), most
// often past its broker session (9 s) so that the controller fences it.
func (r *run) brokerPause(rng *rand.Rand) (string, time.Time, error) {
	nodes := r.cluster.Nodes()
	n := nodes[rng.IntN(len(nodes))]
	what := "node"
	if rng.IntN(2) == 0 {
		ctx, cancel := lookup()
		if c, err := r.cluster.GroupCoordinator(ctx, r.app); err == nil {
			n, what = c, "group coordinator node"
		}
		cancel()
	}
	long := rng.IntN(10) < 7
	lo, hi := 2*time.Second, 5*time.Second
	if long {
		lo, hi = 10*time.Second, 13*time.Second
	}
	if err := r.cluster.Pause(n); err != nil {
		return "", time.Time{}, err
	}
	d := lo + time.Duration(rng.Int64N(int64(hi-lo)))
	time.Sleep(d)
	fenced := ""
	if long {
		ctx, cancel := lookup()
		if f, err := r.cluster.Fenced(ctx); err == nil && slices.Contains(f, n) {
			fenced = ", fenced by the controller"
		}
		cancel()
	}
	if err := r.cluster.Resume(n); err != nil {
		r.t.Fatalf("resuming node %d: %v", n, err)
	}
	healed := time.Now()
	detail := fmt.Sprintf("%s %d paused %s%s", what, n, d.Round(time.Millisecond), fenced)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := r.cluster.WaitHealthy(ctx); err != nil {
		detail += fmt.Sprintf(" (the cluster did not heal: %v)", err)
	}
	return detail, healed, nil
}

// rollingRestart restarts the brokers one by one as an upgrade does:
// SIGTERM, wait, start, the cluster whole again before the next.
func (r *run) rollingRestart(*rand.Rand) (string, time.Time, error) {
	var healed time.Time
	detail := "nodes"
	for _, n := range r.cluster.Nodes() {
		if err := r.cluster.Stop(n); err != nil {
			r.t.Fatalf("stopping node %d: %v", n, err)
		}
		h, err := r.restartNode(n)
		healed = h
		detail += fmt.Sprintf(" %d", n)
		if err != nil {
			detail += fmt.Sprintf(" (%v)", err)
		}
	}
	return detail + " restarted in turn", healed, nil
}

// partitionTarget picks an instance running tasks (any when none does).
func (r *run) partitionTarget(rng *rand.Rand) int {
	if busy := r.withTasks(); len(busy) > 0 {
		return busy[rng.IntN(len(busy))]
	}
	return rng.IntN(instances)
}

// cutFor draws how long a partition lasts: shorter than the session
// timeout, or longer.
func cutFor(rng *rand.Rand) (time.Duration, string) {
	if rng.IntN(2) == 0 {
		return 2*time.Second + time.Duration(rng.Int64N(int64(2*time.Second))), "shorter than the session"
	}
	return sessionTimeout + 2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second))), "longer than the session"
}

// partitionOne cuts one instance off from one broker (the group
// coordinator half the time).
func (r *run) partitionOne(rng *rand.Rand) (string, time.Time, error) {
	i := r.partitionTarget(rng)
	nodes := r.cluster.Nodes()
	n := nodes[rng.IntN(len(nodes))]
	what := "node"
	if rng.IntN(2) == 0 {
		ctx, cancel := lookup()
		if c, err := r.cluster.GroupCoordinator(ctx, r.app); err == nil {
			n, what = c, "group coordinator node"
		}
		cancel()
	}
	d, how := cutFor(rng)
	r.proxies[i].Blackhole(n)
	time.Sleep(d)
	r.proxies[i].Pass(n)
	return fmt.Sprintf("%s cut off from %s %d for %s (%s)", r.member(i).Name, what, n, d.Round(time.Millisecond), how), time.Now(), nil
}

// partitionAll cuts one instance off from every broker.
func (r *run) partitionAll(rng *rand.Rand) (string, time.Time, error) {
	i := r.partitionTarget(rng)
	d, how := cutFor(rng)
	r.proxies[i].BlackholeAll()
	time.Sleep(d)
	r.proxies[i].PassAll()
	return fmt.Sprintf("%s cut off from every broker for %s (%s)", r.member(i).Name, d.Round(time.Millisecond), how), time.Now(), nil
}

// instancePause pauses an instance running tasks past its session and
// transaction timeouts, until the others run its tasks, then resumes it: a
// zombie, whose writes must never become visible.
func (r *run) instancePause(rng *rand.Rand) (string, time.Time, error) {
	busy := r.withTasks()
	if len(busy) == 0 {
		return "no instance runs a task", time.Time{}, errors.New("nothing to aim at")
	}
	i := busy[rng.IntN(len(busy))]
	m := r.member(i)
	had := m.Running()
	if err := m.Signal(syscallStop); err != nil {
		return "", time.Time{}, err
	}
	paused := time.Now()
	moved := time.Duration(-1)
	for time.Since(paused) < 60*time.Second {
		taken := 0
		for task := range had {
			for j := range instances {
				if j != i && r.member(j).Alive() && r.member(j).Running()[task] {
					taken++
					break
				}
			}
		}
		if taken == len(had) {
			moved = time.Since(paused)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if rest := txnTimeout + 2*time.Second - time.Since(paused); rest > 0 {
		time.Sleep(rest)
	}
	if err := m.Signal(syscallCont); err != nil {
		return "", time.Time{}, err
	}
	detail := fmt.Sprintf("%s paused %s with %d tasks", m.Name, time.Since(paused).Round(time.Millisecond), len(had))
	if moved >= 0 {
		detail += fmt.Sprintf(", taken over after %s", moved.Round(time.Millisecond))
	} else {
		detail += ", not taken over within 60 s"
	}
	return detail, time.Now(), nil
}

// instanceKill kills -9 an instance and starts it again on its state dir.
func (r *run) instanceKill(rng *rand.Rand) (string, time.Time, error) {
	i := rng.IntN(instances)
	m := r.member(i)
	r.ourExit(m)
	if _, err := m.Kill(); err != nil {
		return "", time.Time{}, err
	}
	r.restart(i)
	return fmt.Sprintf("%s killed and started again", m.Name), time.Now(), nil
}

// slowNetwork delays everything between an instance and the brokers.
func (r *run) slowNetwork(rng *rand.Rand) (string, time.Time, error) {
	i := r.partitionTarget(rng)
	delay := time.Duration(100+rng.IntN(300)) * time.Millisecond
	for _, n := range r.cluster.Nodes() {
		r.proxies[i].Delay(n, delay)
	}
	d := hold(rng, 3*time.Second, 6*time.Second)
	r.proxies[i].PassAll()
	return fmt.Sprintf("%s's traffic delayed %s for %s", r.member(i).Name, delay, d.Round(time.Millisecond)), time.Now(), nil
}

// softErr folds a healing problem into the detail: the recovery wait that
// follows decides whether it is an anomaly.
func softErr(err error, detail *string) error {
	if err != nil {
		*detail += fmt.Sprintf(" (%v)", err)
	}
	return nil
}

// groupState returns the group's state as its coordinator describes it, and
// whether the group is rebalancing: a classic group preparing or completing
// a rebalance, a streams group assigning or reconciling its tasks.
func (r *run) groupState() (string, bool) {
	ctx, cancel := lookup()
	defer cancel()
	if r.protocol == "streams" {
		req := kmsg.NewPtrStreamsGroupDescribeRequest()
		req.Groups = []string{r.app}
		resp, err := req.RequestWith(ctx, r.kc)
		if err != nil || len(resp.Groups) == 0 {
			return "", false
		}
		st := resp.Groups[0].State
		return st, st == "Assigning" || st == "Reconciling"
	}
	gs, err := r.admin.DescribeGroups(ctx, r.app)
	if err != nil {
		return "", false
	}
	g, ok := gs[r.app]
	if !ok {
		return "", false
	}
	return g.State, g.State == "PreparingRebalance" || g.State == "CompletingRebalance"
}
