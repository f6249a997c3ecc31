//go:build torture

package torture

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// The shape of a run.
const (
	brokers    = 3
	instances  = 4
	partitions = 6
	products   = 300
	// eventsPerSecond is the steady input rate, in batches of batchSize.
	eventsPerSecond = 100
	batchSize       = 10
	// threshold is notification.threshold: every product crosses it
	// within the first minutes.
	threshold = 2000
	// sessionTimeout is session.timeout.ms (the broker's minimum), and
	// txnTimeout transaction.timeout.ms: the zombie fault pauses an
	// instance past both.
	sessionTimeout = 6 * time.Second
	txnTimeout     = 10 * time.Second
	commitInterval = 500 * time.Millisecond
	// recoveryLimit bounds the wait for the group to recover after a
	// fault: past it, the fault counts an anomaly.
	recoveryLimit = 120 * time.Second
)

// settings are the run's settings, from the environment.
type settings struct {
	seed       uint64
	duration   time.Duration
	guarantees []string
}

func loadSettings(t *testing.T) settings {
	s := settings{seed: uint64(time.Now().UnixNano() % 1_000_000), duration: 30 * time.Minute}
	if v := os.Getenv("SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SEED=%q: want a non-negative integer", v)
		}
		s.seed = n
	}
	if v := os.Getenv("TORTURE_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("TORTURE_DURATION=%q: want a positive Go duration such as 30m", v)
		}
		s.duration = d
	}
	switch v := os.Getenv("TORTURE_GUARANTEES"); v {
	case "":
		// One guarantee per run, alternating with the seed.
		s.guarantees = []string{[]string{"exactly_once_v2", "at_least_once"}[s.seed%2]}
	default:
		for _, leg := range strings.Split(v, ",") {
			g, proto, _ := strings.Cut(leg, "/")
			if (g != "exactly_once_v2" && g != "at_least_once") || (proto != "" && proto != "classic" && proto != "streams") {
				t.Fatalf("TORTURE_GUARANTEES=%q: each must be exactly_once_v2 or at_least_once, optionally followed by /classic or /streams (the group protocol)", v)
			}
			s.guarantees = append(s.guarantees, leg)
		}
	}
	return s
}

// leg splits a TORTURE_GUARANTEES entry into the guarantee and the group
// protocol (classic unless "/streams" follows).
func leg(entry string) (guarantee, protocol string) {
	g, proto, _ := strings.Cut(entry, "/")
	if proto == "" {
		proto = "classic"
	}
	return g, proto
}

func TestTorture(t *testing.T) {
	s := loadSettings(t)
	banner := fmt.Sprintf("torture: seed %d (SEED=%d replays this schedule), %s of faults per guarantee, guarantees %v",
		s.seed, s.seed, s.duration, s.guarantees)
	fmt.Println(banner)
	t.Log(banner)

	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "salesagg")
	t0 := time.Now()
	if out, err := harness.Build(root, bin); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("built %s in %s", bin, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	cluster := harness.StartKafkaCluster(t, root, dir, brokers, instances)
	t.Logf("Kafka cluster of %d nodes up in %s at %s", brokers, time.Since(t0).Round(time.Millisecond), cluster.Bootstrap())

	var reports []*report
	for i, g := range s.guarantees {
		guarantee, protocol := leg(g)
		name := guarantee
		if protocol != "classic" {
			name += "-" + protocol
		}
		ok := t.Run(name, func(t *testing.T) {
			r := newRun(t, cluster, bin, root, guarantee, protocol, s.seed+uint64(i), s.duration)
			reports = append(reports, r.torture())
		})
		if !ok {
			break
		}
	}
	for _, rep := range reports {
		fmt.Print(rep.table())
	}
}

// run is one torture run: one guarantee, one group protocol, one group,
// one schedule. Its fields are set by newRun, but for those mu guards.
type run struct {
	t         *testing.T
	cluster   *harness.KafkaCluster
	bin, root string
	guarantee string
	protocol  string // group.protocol: classic or streams
	seed      uint64
	duration  time.Duration
	app       string
	input     string
	notif     string
	changelog string
	dir       string
	proxies   []*harness.ProxySet // by instance index
	fleet     *harness.Fleet
	admin     *kadm.Client
	kc        *kgo.Client // admin's client, for requests kadm does not make
	producer  *producer

	mu      sync.Mutex
	members []*harness.Member // guarded by mu; by instance index
	// ours are the process ids this run stopped or killed on purpose;
	// any other exit is an anomaly.
	ours map[int]bool // guarded by mu
	// exits are the unexpected exits found so far, and reported their pids.
	exits    []string     // guarded by mu
	reported map[int]bool // guarded by mu
	rep      *report      // guarded by mu
}

func newRun(t *testing.T, cluster *harness.KafkaCluster, bin, root, guarantee, protocol string, seed uint64, d time.Duration) *run {
	short := map[string]string{"exactly_once_v2": "eos", "at_least_once": "alos"}[guarantee]
	if protocol != "classic" {
		short += "-" + protocol
	}
	app := fmt.Sprintf("torture-%s-%d", short, seed)
	r := &run{t: t, cluster: cluster, bin: bin, root: root, guarantee: guarantee, protocol: protocol, seed: seed, duration: d,
		app: app, input: app + "-in", notif: app + "-notifications", changelog: app + "-PRODUCT_AGGREGATED_SALES-changelog",
		dir: t.TempDir(), ours: map[int]bool{}, reported: map[int]bool{}, rep: newReport(guarantee, protocol, seed)}
	cl := harness.NewClient(t, cluster.Bootstrap(), kgo.RequestTimeoutOverhead(5*time.Second), kgo.RetryTimeout(10*time.Second))
	r.kc, r.admin = cl, kadm.NewClient(cl)
	return r
}

// torture runs the whole thing and returns its report.
func (r *run) torture() *report {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := r.admin.CreateTopic(ctx, partitions, brokers, nil, r.input)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating %s: %v", r.input, err)
	}
	for k := 1; k <= instances; k++ {
		r.proxies = append(r.proxies, harness.StartProxySet(t, r.cluster, k))
	}
	byDir := map[string]int{}
	r.fleet = harness.NewFleet(func(stateDir string) *harness.Service { return r.startService(byDir[stateDir]) })
	r.members = make([]*harness.Member, instances)
	for i := range instances {
		d := filepath.Join(r.dir, fmt.Sprintf("inst-%d", i+1))
		byDir[d] = i
		r.members[i] = r.fleet.Start(fmt.Sprintf("inst-%d", i+1), d)
	}
	harness.WaitFor(t, 3*time.Minute, "every instance ready and the tasks spread", func() error {
		if gone := r.allExits(); len(gone) > 0 {
			return fmt.Errorf("%w: instances exited: %v", harness.ErrGiveUp, gone)
		}
		for _, m := range r.alive() {
			if err := m.Ready(); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
		}
		return harness.RunEach(r.alive(), false, partitions)
	})
	sampler := r.fleet.Sample(t)
	r.producer = startProducer(t, r.cluster.Bootstrap(), r.input, r.seed)
	t.Logf("faults for %s from seed %d", r.duration, r.seed)

	end := time.Now().Add(r.duration)
	lanes := newLanes(r, end)
	lanes.run()
	r.healAll()

	r.producer.stop()
	t.Logf("input: %s", r.producer.summary())
	r.settle()
	owners := sampler.Report()
	r.check(owners.Violations)
	rep := r.report()
	rep.Events = r.producer.acked()
	path := filepath.Join(harness.LogDir(t), fmt.Sprintf("torture-%s-%s-%d.json", r.guarantee, r.protocol, r.seed))
	if b, err := json.MarshalIndent(rep, "", "  "); err == nil {
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Errorf("writing %s: %v", path, err)
		}
	}
	t.Logf("report: %s\n%s", path, rep.table())
	if n := rep.anomalies(); n > 0 {
		t.Errorf("%d anomalies (the table and %s list them)", n, path)
	}
	return rep
}

// startService starts instance i (0-based) on its state dir, reaching the
// brokers through its own proxies.
func (r *run) startService(i int) *harness.Service {
	return harness.StartService(r.t, harness.ServiceConfig{
		Bin: r.bin, Broker: r.proxies[i].Bootstrap(), Dir: r.root,
		AppID: r.app, StateDir: filepath.Join(r.dir, fmt.Sprintf("inst-%d", i+1)), Input: r.input, Notif: r.notif,
		CommitMs: int(commitInterval.Milliseconds()),
		Flags: []string{
			"--processing.guarantee", r.guarantee,
			"--group.protocol", r.protocol,
			"--replication.factor", strconv.Itoa(brokers),
			"--num.standby.replicas", "1",
			"--session.timeout.ms", strconv.Itoa(int(sessionTimeout.Milliseconds())),
			"--transaction.timeout.ms", strconv.Itoa(int(txnTimeout.Milliseconds())),
			"--group.instance.id", fmt.Sprintf("%s-inst-%d", r.app, i+1),
			"--notification.threshold", strconv.Itoa(threshold),
		},
	})
}

// member returns instance i's current member.
func (r *run) member(i int) *harness.Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.members[i]
}

// alive returns the members whose process runs.
func (r *run) alive() []*harness.Member { return r.fleet.Alive() }

// restart starts instance i again on its state dir (after it was stopped
// or killed).
func (r *run) restart(i int) *harness.Member {
	old := r.member(i)
	r.fleet.Forget(old)
	m := r.fleet.Start(old.Name, old.Dir)
	r.mu.Lock()
	r.members[i] = m
	r.mu.Unlock()
	return m
}

// ourExit records that this run ends member m's process on purpose.
func (r *run) ourExit(m *harness.Member) {
	r.mu.Lock()
	r.ours[m.PID] = true
	r.mu.Unlock()
}

// newExits returns the members that exited since the last call without
// this run ending them (a service must never give up while the cluster can
// still serve), and keeps them for the final check.
func (r *run) newExits() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.members {
		if !m.Alive() && !r.ours[m.PID] && !r.reported[m.PID] {
			r.reported[m.PID] = true
			out = append(out, fmt.Sprintf("%s (pid %d) %s", m.Name, m.PID, m.DescribeExit()))
		}
	}
	r.exits = append(r.exits, out...)
	return out
}

// allExits returns every unexpected exit of the run.
func (r *run) allExits() []string {
	r.newExits()
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.exits)
}

// healAll ends every fault: brokers resumed and started, proxies passing,
// instances resumed and started.
func (r *run) healAll() {
	t := r.t
	for _, n := range r.cluster.Nodes() {
		if r.cluster.Paused(n) {
			if err := r.cluster.Resume(n); err != nil {
				t.Errorf("resuming node %d: %v", n, err)
			}
		}
		if !r.cluster.Running(n) {
			if err := r.cluster.Start(n); err != nil {
				t.Fatalf("starting node %d: %v", n, err)
			}
		}
	}
	for _, p := range r.proxies {
		p.PassAll()
	}
	r.newExits()
	for i := range instances {
		m := r.member(i)
		_ = m.Signal(syscallCont)
		if !m.Alive() {
			r.restart(i)
		}
	}
}

// committed returns the group's committed input offsets summed, and by
// partition.
func (r *run) committed(ctx context.Context) (int64, error) {
	offs, err := r.admin.FetchOffsetsForTopics(ctx, r.app, r.input)
	if err != nil {
		return 0, err
	}
	if err := offs.Error(); err != nil {
		return 0, err
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == r.input && o.At > 0 {
			sum += o.At
		}
	})
	return sum, nil
}

// recovery waits, after a fault healed at healed, until every task runs
// on exactly one live instance and a commit lands past what was committed
// at healed. It returns how long after healed that was.
func (r *run) recovery(healed time.Time) (time.Duration, error) {
	var base int64 = -1
	var last error
	for time.Since(healed) < recoveryLimit {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sum, err := r.committed(ctx)
		cancel()
		switch {
		case err != nil:
			last = fmt.Errorf("committed offsets: %w", err)
		case base < 0:
			base = sum
			last = fmt.Errorf("no commit yet past %d", base)
		case sum <= base:
			last = fmt.Errorf("no commit yet past %d", base)
		default:
			if err := harness.RunEach(r.alive(), false, partitions); err != nil {
				last = err
			} else {
				return time.Since(healed), nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return recoveryLimit, fmt.Errorf("not recovered %s after the fault healed: %v", recoveryLimit, last)
}

// settle waits until the group has committed the whole input and every
// task runs once.
func (r *run) settle() {
	t := r.t
	ends, err := r.admin.ListEndOffsets(context.Background(), r.input)
	if err != nil {
		t.Fatalf("listing the input's end offsets: %v", err)
	}
	var want int64
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	t0 := time.Now()
	harness.WaitFor(t, 5*time.Minute, "the group to commit the whole input and run every task once", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, err := r.committed(ctx)
		if err != nil {
			return err
		}
		if got < want {
			return fmt.Errorf("committed %d of %d offsets", got, want)
		}
		return harness.RunEach(r.alive(), false, partitions)
	})
	t.Logf("settled %s after the faults stopped", time.Since(t0).Round(time.Millisecond))
}

// sortedKeys returns m's keys sorted.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// rng is the schedule's random source for one lane.
func laneRand(seed uint64, lane int) *rand.Rand { return rand.New(rand.NewPCG(seed, uint64(lane)+1)) }
