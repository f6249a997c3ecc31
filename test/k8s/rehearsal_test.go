//go:build e2e

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/salesagg/salesagg/test/harness"
	"github.com/salesagg/salesagg/test/port"
)

const (
	// rehearsalProducts is how many products the events go to.
	rehearsalProducts = 30
	// preloadPerProduct events of value 1 each go in before the pods start.
	preloadPerProduct = 10
	// produceTick and produceBatch pace the producer: 200 events/s.
	produceTick  = 100 * time.Millisecond
	produceBatch = 20
	// proberPeriod is how often each pod is asked for each probe product.
	proberPeriod = 100 * time.Millisecond
	// readyTimeout bounds every wait for a pod's readiness (the startup
	// probe allows 10 min; a restart with its volume takes about a second).
	readyTimeout = 90 * time.Second
)

var intstrHTTP = intstr.FromString("http")

// TestStatefulSetRehearsal runs the prod overlay's StatefulSet as local
// processes the way the kubelet would, on a real Apache Kafka broker, and
// rolls it while events flow:
//
//   - the rendered StatefulSet's container: its args, its env (the downward
//     API resolved with the pod names salesagg-0..2 and namespace default,
//     $(VAR) expanded), the config file from the ConfigMap written where
//     --config points (a local dir for the mount), one local dir per volume
//     claim for /shared-volume (owned by group fsGroup, mode 2775, and the
//     process run as runAsUser/runAsGroup with fsGroup when the test runs as
//     root), and the substitutions a laptop needs: loopback HTTP ports for
//     http.addr's :8080 and for application.server's pod DNS name, and
//     bootstrap.servers the local broker;
//   - its probes polled with their periods, timeouts and thresholds (startup
//     first, then readiness and liveness; readiness gates "ready");
//   - podManagementPolicy: Parallel starts every pod at once;
//   - a rolling update in StatefulSet order (salesagg-2, -1, -0), each once
//     every pod is ready: SIGTERM, exit within terminationGracePeriodSeconds
//     (exit code 0), start again on the same claim, wait for readiness;
//   - meanwhile a producer sends 200 events/s over 30 products, and a prober
//     asks every pod for one product of each task every 100 ms.
//
// It asserts exact totals from every pod (X-Served-By naming a pod and the
// task), that each restarted pod restored 0 records (the "Finished restoring
// changelog ... with a total number of 0 records" lines, field records),
// that no task moved, that no product was unanswerable (no pod answering
// 200) longer than MaxUnanswerable nor without its owner's answer longer
// than MaxOwnerAway (the README states both), and that no probe would have
// made the kubelet restart a container.
func TestStatefulSetRehearsal(t *testing.T) {
	tStart := time.Now()
	root := repoRoot(t)
	m, _, err := Load(root, "prod")
	if err != nil {
		t.Fatal(err)
	}
	sts, err := m.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	replicas := int(*sts.Spec.Replicas)
	grace := time.Duration(*sts.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	podSec := sts.Spec.Template.Spec.SecurityContext
	httpPort, err := ContainerPort(sts.Spec.Template.Spec.Containers[0], intstrHTTP)
	if err != nil {
		t.Fatal(err)
	}

	// The pods run as another user: every directory above the work dir
	// must let it through (a private TMPDIR does not).
	parent := os.TempDir()
	if bad := untraversable(parent); bad != "" && os.Geteuid() == 0 {
		t.Logf("%s is not traversable by other users (the pods' user); using /tmp instead", bad)
		parent = "/tmp"
		if bad := untraversable(parent); bad != "" {
			t.Fatalf("%s is not traversable by other users: the pods' user could not reach its binary and volumes", bad)
		}
	}
	work, err := os.MkdirTemp(parent, "salesagg-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(work) }) // registered first: runs last
	// The pods' user must reach the binary and the volumes.
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(work, "logs")
	if d := os.Getenv("K8S_LOG_DIR"); d != "" {
		logDir = d
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildSalesagg(t, root, work)
	broker, external := harness.StartKafka(t, root, work)
	if os.Geteuid() == 0 {
		t.Logf("running the pods as uid %d gid %d with group %d (runAsUser, runAsGroup, fsGroup)", *podSec.RunAsUser, *podSec.RunAsGroup, *podSec.FSGroup)
	} else {
		t.Logf("not root: running the pods as this user (runAsUser/fsGroup not exercised)")
	}

	// Each pod keeps its loopback port across restarts, as it keeps its
	// DNS name.
	listen := make([]string, replicas)
	for i := range listen {
		if listen[i], err = port.Free(); err != nil {
			t.Fatal(err)
		}
	}
	suffix := strconv.FormatInt(time.Now().UnixNano()%1_000_000, 10)
	const ns = "default"
	volumes := filepath.Join(work, "volumes")
	makePod := func(ord int) *Pod {
		t.Helper()
		pod, err := MakePod(m, sts, ord, ns, volumes)
		if err != nil {
			t.Fatal(err)
		}
		// What the manifest declares, before the laptop substitutions.
		if v, _ := pod.Getenv("SALESAGG_HTTP_ADDR"); v != fmt.Sprintf(":%d", httpPort) {
			t.Fatalf("%s: SALESAGG_HTTP_ADDR = %q, want :%d", pod.Name, v, httpPort)
		}
		wantServer := fmt.Sprintf("%s.%s.%s.svc.cluster.local:%d", pod.Name, sts.Spec.ServiceName, ns, httpPort)
		if v, _ := pod.Getenv("SALESAGG_APPLICATION_SERVER"); v != wantServer {
			t.Fatalf("%s: SALESAGG_APPLICATION_SERVER = %q, want %q", pod.Name, v, wantServer)
		}
		if v, _ := pod.Getenv("SALESAGG_GROUP_INSTANCE_ID"); v != pod.Name {
			t.Fatalf("%s: SALESAGG_GROUP_INSTANCE_ID = %q, want the pod name", pod.Name, v)
		}
		// <pod IP>:8080 and the pod's DNS name are 127.0.0.1:PORT here.
		pod.Setenv("SALESAGG_HTTP_ADDR", listen[ord])
		pod.Setenv("SALESAGG_APPLICATION_SERVER", listen[ord])
		pod.LocalizePaths()
		pod.Setenv("SALESAGG_BOOTSTRAP_SERVERS", broker)
		// K8S_REHEARSAL_ENV="SALESAGG_NUM_STANDBY_REPLICAS=0 ...": other
		// settings, to compare (the README's figures are without it).
		for _, kv := range strings.Fields(os.Getenv("K8S_REHEARSAL_ENV")) {
			if name, value, ok := strings.Cut(kv, "="); ok {
				pod.Setenv(name, value)
			}
		}
		if external {
			// A long-lived broker: names of this run only.
			pod.Setenv("SALESAGG_APPLICATION_ID", "k8s-rehearsal-"+suffix)
			pod.Setenv("SALESAGG_INPUT_TOPIC", "k8s-rehearsal-sales-"+suffix)
			pod.Setenv("SALESAGG_NOTIFICATION_TOPIC", "k8s-rehearsal-notifications-"+suffix)
		}
		// The kubelet's fsGroup: the volume's group is fsGroup, group
		// writable, set-gid.
		if os.Geteuid() == 0 && podSec.FSGroup != nil {
			for _, mt := range pod.Mounts {
				if mt.Claim == "" {
					continue
				}
				if err := os.Chown(mt.Local, 0, int(*podSec.FSGroup)); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(mt.Local, 0o775|os.ModeSetgid); err != nil {
					t.Fatal(err)
				}
			}
		}
		return pod
	}

	cfgPod := makePod(0)
	cfg, err := EffectiveConfig(cfgPod)
	if err != nil {
		t.Fatalf("the pods' configuration: %v", err)
	}
	if int(cfg.TopicsPartitions) < replicas {
		t.Fatalf("replicas %d > topics.partitions %d", replicas, cfg.TopicsPartitions)
	}
	t.Logf("prod StatefulSet: %d replicas, %s, grace %s; application.id %s, input %s (%d partitions), %s, leave.group.on.close %v, standbys %d, state.dir %s",
		replicas, sts.Spec.PodManagementPolicy, grace, cfg.ApplicationID, cfg.InputTopic, cfg.TopicsPartitions, cfg.ProcessingGuarantee, cfg.LeaveGroupOnClose, cfg.NumStandbyReplicas, cfg.StateDir)
	t.Logf("salesagg-0: %s %s", bin, strings.Join(cfgPod.Command, " "))

	// The input topic, as the platform would create it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(broker, ",")...), kgo.DefaultProduceTopic(cfg.InputTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	{
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := kadm.NewClient(cl).CreateTopic(ctx, cfg.TopicsPartitions, -1, nil, cfg.InputTopic)
		cancel()
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating %s: %v", cfg.InputTopic, err)
		}
	}
	products := make([]string, rehearsalProducts)
	for i := range products {
		products[i] = fmt.Sprintf("k8s-p%02d", i)
	}
	prod := harness.NewEndlessProducer(cl, cfg.InputTopic, func(i int) harness.Event {
		return harness.Event{Product: products[i%len(products)], Value: 1}
	})
	for range preloadPerProduct {
		if _, err := prod.Send(len(products)); err != nil {
			t.Fatal(err)
		}
	}

	// Start: Parallel starts every pod at once; OrderedReady one by one.
	current := make([]*container, replicas)
	t0 := time.Now()
	for ord := range replicas {
		pod := cfgPod
		if ord != 0 {
			pod = makePod(ord)
		}
		current[ord] = startContainer(t, pod, podSec, bin, 0, listen[ord], logDir)
		if sts.Spec.PodManagementPolicy != "Parallel" {
			if err := current[ord].waitReady(readyTimeout); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range current {
		if err := c.waitReady(readyTimeout); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("all %d pods ready %s after the start", replicas, time.Since(t0).Round(time.Millisecond))

	hc := &http.Client{Timeout: 2 * time.Second}
	harness.WaitFor(t, 60*time.Second, "every pod to answer the preload's totals", func() error {
		return checkTotals(hc, listen, prod.Totals(), false)
	})
	// One probe product per task, by X-Served-By.
	taskOf := map[string]string{}
	for _, p := range products {
		a := query(hc, listen[0], p)
		if a.err != nil || a.task == "" {
			t.Fatalf("GET /v1/products/%s: %v (X-Served-By %q)", p, a.err, a.servedBy)
		}
		taskOf[p] = a.task
	}
	probeProducts := map[string]string{} // task → product
	for _, p := range products {
		if _, ok := probeProducts[taskOf[p]]; !ok {
			probeProducts[taskOf[p]] = p
		}
	}
	if len(probeProducts) != int(cfg.TopicsPartitions) {
		t.Fatalf("the products cover tasks %v, want %d tasks", probeProducts, cfg.TopicsPartitions)
	}
	// The assignment settles after readiness (a member with no task yet is
	// ready too): take it once each task runs on exactly one pod, each pod
	// runs one, and two readings a few seconds apart agree.
	var before map[string][]string
	harness.WaitFor(t, 2*time.Minute, "a settled assignment, one task per pod", func() error {
		first := assignment(t, hc, listen)
		seen := map[string]int{}
		for pod, tasks := range first {
			if len(tasks) == 0 {
				return fmt.Errorf("%s runs no task: %v", pod, first)
			}
			for _, task := range tasks {
				seen[task]++
			}
		}
		for task, n := range seen {
			if n != 1 {
				return fmt.Errorf("task %s runs on %d pods: %v", task, n, first)
			}
		}
		time.Sleep(3 * time.Second) // the second reading of the pair
		if again := assignment(t, hc, listen); fmt.Sprint(again) != fmt.Sprint(first) {
			return fmt.Errorf("the assignment still moves: %v, then %v", first, again)
		}
		before = first
		return nil
	})
	t.Logf("tasks before the rolling update: %v; probe products %v", before, probeProducts)

	pr := startProber(listen, probeProducts)
	prod.Start(t, produceBatch, produceTick)
	target := prod.Sent() + 4*produceBatch
	harness.WaitFor(t, 30*time.Second, "events to flow", sentAtLeast(prod, target))

	// The rolling update: highest ordinal first, each once all are ready.
	type step struct {
		pod                                  string
		stopTook, startToReady, serviceReady time.Duration
	}
	var steps []step
	for ord := replicas - 1; ord >= 0; ord-- {
		for _, c := range current {
			if err := c.waitReady(readyTimeout); err != nil {
				t.Fatalf("before updating salesagg-%d: %v", ord, err)
			}
		}
		old := current[ord]
		took, inGrace := old.stop(grace)
		if !inGrace {
			t.Errorf("%s did not exit within terminationGracePeriodSeconds (%s) of SIGTERM: SIGKILLed", old.pod.Name, grace)
		} else if code := old.exitCode(); code != 0 {
			t.Errorf("%s exited with %s after SIGTERM, want exit code 0", old.pod.Name, old.describeExit())
		}
		nc := startContainer(t, makePod(ord), podSec, bin, 1, listen[ord], logDir)
		current[ord] = nc
		if err := nc.waitReady(readyTimeout); err != nil {
			t.Fatal(err)
		}
		nc.mu.Lock()
		st := step{nc.pod.Name, took, nc.readyAt.Sub(nc.started), nc.serviceReadyAt.Sub(nc.started)}
		nc.mu.Unlock()
		steps = append(steps, st)
		t.Logf("%s: SIGTERM → exit %s, start → /readyz 200 %s, → the readiness probe passed %s (producer at %d events)",
			nc.pod.Name, took.Round(time.Millisecond), st.serviceReady.Round(time.Millisecond), st.startToReady.Round(time.Millisecond), prod.Sent())
	}
	target = prod.Sent() + 4*produceBatch
	harness.WaitFor(t, 30*time.Second, "events to flow after the update", sentAtLeast(prod, target))
	if err := prod.Stop(); err != nil {
		t.Errorf("producer: %v", err)
	}
	want := prod.Totals()
	var sum int64
	for _, v := range want {
		sum += v
	}
	harness.WaitFor(t, 60*time.Second, "every pod to answer every product's exact total, from its owner", func() error {
		return checkTotals(hc, listen, want, true)
	})
	pr.stop()
	t.Logf("exact totals from every pod: %d products, %d events", len(want), sum)

	// The restarted pods restored nothing: their volumes held the state.
	for _, c := range current {
		lines := restoreLines(c)
		if len(lines) == 0 {
			t.Errorf("%s (restarted) logged no \"Finished restoring changelog\" line", c.pod.Name)
		}
		for _, l := range lines {
			switch {
			case !l.Agrees:
				t.Errorf("%s (restarted): %q: its field records (%d) disagrees with the message", c.pod.Name, l.Msg, l.Records)
			case l.Records != 0:
				t.Errorf("%s (restarted): %q: want 0 records (the volume held the state)", c.pod.Name, l.Msg)
			default:
				t.Logf("%s: %s (records=%d)", c.pod.Name, l.Msg, l.Records)
			}
		}
	}
	after := assignment(t, hc, listen)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("tasks moved: before %v, after %v (static membership with leave.group.on.close false should move none)", before, after)
	}

	// Probes: nothing would have restarted a container.
	for _, c := range current {
		for _, p := range c.problemsSoFar() {
			t.Errorf("%s: %s", c.pod.Name, p)
		}
	}

	// Availability.
	rep := pr.report()
	for _, task := range slices.Sorted(maps.Keys(rep)) {
		r := rep[task]
		t.Logf("task %s (%s): longest unanswerable %s (%d stretches), longest without the owner's answer %s, %d of %d answers from a standby copy (max lag %d), %d answers",
			task, probeProducts[task], r.maxUnanswerable.Round(time.Millisecond), r.unanswerableStretches, r.maxOwnerAway.Round(time.Millisecond), r.stale, r.ok, r.maxLag, r.total)
		if r.maxUnanswerable > MaxUnanswerable {
			t.Errorf("task %s: unanswerable (no pod answered 200) for %s, over the README's %s", task, r.maxUnanswerable.Round(time.Millisecond), MaxUnanswerable)
		}
		if r.maxOwnerAway > MaxOwnerAway {
			t.Errorf("task %s: no answer from its owner for %s, over the README's %s", task, r.maxOwnerAway.Round(time.Millisecond), MaxOwnerAway)
		}
	}
	var worstU, worstO time.Duration
	for _, r := range rep {
		worstU, worstO = max(worstU, r.maxUnanswerable), max(worstO, r.maxOwnerAway)
	}
	for _, s := range steps {
		t.Logf("rolling update %s: SIGTERM → exit %s, start → /readyz 200 %s, start → ready (readiness probe) %s", s.pod, s.stopTook.Round(time.Millisecond), s.serviceReady.Round(time.Millisecond), s.startToReady.Round(time.Millisecond))
	}
	t.Logf("SUMMARY: longest a product was unanswerable at every pod %s (bound %s); longest without its owner's answer %s (bound %s); rehearsal %s",
		worstU.Round(time.Millisecond), MaxUnanswerable, worstO.Round(time.Millisecond), MaxOwnerAway, time.Since(tStart).Round(time.Second))

	for _, c := range current {
		if _, ok := c.stop(grace); !ok {
			t.Errorf("%s did not stop within %s at the end", c.pod.Name, grace)
		} else if c.exitCode() != 0 {
			t.Errorf("%s: %s at the end, want exit code 0", c.pod.Name, c.describeExit())
		}
	}
}

// ---------------------------------------------------------------------------
// HTTP answers

type answer struct {
	code            int
	total           int64
	stale           bool
	servedBy, task  string
	instance        string
	standbyLag      int64
	err             error
	at              time.Time
	answeredProduct string
}

var servedByRE = regexp.MustCompile(`^(\S+); task=(\d+_\d+)(; standby)?$`)

// query asks addr for product: GET /v1/products/{product}.
func query(hc *http.Client, addr, product string) answer {
	a := answer{}
	resp, err := hc.Get("http://" + addr + "/v1/products/" + product)
	a.at = time.Now()
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	a.code = resp.StatusCode
	a.servedBy = resp.Header.Get("X-Served-By")
	if g := servedByRE.FindStringSubmatch(a.servedBy); g != nil {
		a.instance, a.task = g[1], g[2]
		a.stale = g[3] != ""
	}
	if lag := resp.Header.Get("X-Salesagg-Standby-Lag"); lag != "" {
		a.stale = true
		a.standbyLag, _ = strconv.ParseInt(lag, 10, 64)
	}
	if a.code != http.StatusOK {
		a.err = fmt.Errorf("HTTP %d: %s", a.code, strings.TrimSpace(string(body)))
		return a
	}
	var v struct {
		Product string `json:"product"`
		Total   int64  `json:"total"`
		Stale   bool   `json:"stale"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		a.err = fmt.Errorf("decoding %q: %w", body, err)
		return a
	}
	a.total, a.answeredProduct = v.Total, v.Product
	a.stale = a.stale || v.Stale
	if v.Product != product {
		a.err = fmt.Errorf("answered product %q", v.Product)
	}
	return a
}

// checkTotals asks every pod for every product: nil when each answers 200
// with the exact total and an X-Served-By naming a pod and a task (and,
// with fresh, not from a standby copy).
func checkTotals(hc *http.Client, addrs []string, want map[string]int64, fresh bool) error {
	var diffs []string
	for i, addr := range addrs {
		for _, p := range slices.Sorted(maps.Keys(want)) {
			a := query(hc, addr, p)
			switch {
			case a.err != nil:
				diffs = append(diffs, fmt.Sprintf("salesagg-%d %s: %v", i, p, a.err))
			case a.total != want[p]:
				diffs = append(diffs, fmt.Sprintf("salesagg-%d %s: total %d, want %d (%s)", i, p, a.total, want[p], a.servedBy))
			case a.task == "" || !strings.HasPrefix(a.instance, "salesagg-"):
				diffs = append(diffs, fmt.Sprintf("salesagg-%d %s: X-Served-By %q does not name a pod and a task", i, p, a.servedBy))
			case fresh && a.stale:
				diffs = append(diffs, fmt.Sprintf("salesagg-%d %s: answered by a standby copy (%s)", i, p, a.servedBy))
			}
		}
	}
	return harness.Summarize(diffs)
}

// assignment reads each pod's running active tasks (GET /v1/tasks).
func assignment(t *testing.T, hc *http.Client, addrs []string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for i, addr := range addrs {
		resp, err := hc.Get("http://" + addr + "/v1/tasks")
		if err != nil {
			t.Fatalf("salesagg-%d: GET /v1/tasks: %v", i, err)
		}
		var body struct {
			Tasks []struct {
				Task  string `json:"task"`
				Role  string `json:"role"`
				State string `json:"state"`
			} `json:"tasks"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("salesagg-%d: GET /v1/tasks: %v", i, err)
		}
		name := fmt.Sprintf("salesagg-%d", i)
		out[name] = []string{}
		for _, tk := range body.Tasks {
			if tk.Role == "active" || tk.Role == "" {
				out[name] = append(out[name], tk.Task)
			}
		}
		sort.Strings(out[name])
	}
	return out
}

// ---------------------------------------------------------------------------
// Logs

// restoreLines returns the container's "Finished restoring changelog" lines
// (the records of each come from its field records, which must agree with
// the message).
func restoreLines(c *container) []harness.RestoreLine { return harness.RestoreLines(c.logs()) }

// ---------------------------------------------------------------------------
// Prober

// prober asks every pod for one product of each task every proberPeriod
// (one loop per pod and product, 1 s timeout). A task is unanswerable while
// the latest answer of every pod for its product is not a 200; it is
// without its owner while none is a 200 that did not come from a standby
// copy. Each stretch runs from the answer that made the last pod fail to
// the next answer that passes: accurate to about one period plus one
// request.
type prober struct {
	quit    chan struct{}
	loops   sync.WaitGroup
	results chan proberResult
	done    chan struct{}
	stats   map[string]*taskStats
}

type proberResult struct {
	pod  int
	task string
	a    answer
}

type taskStats struct {
	latest                        map[int]answer
	unanswerableSince, ownerSince time.Time
	maxUnanswerable, maxOwnerAway time.Duration
	unanswerableStretches         int
	total, ok, stale              int
	maxLag                        int64
}

func startProber(addrs []string, probeProducts map[string]string) *prober {
	pr := &prober{quit: make(chan struct{}), results: make(chan proberResult, 1024), done: make(chan struct{}), stats: map[string]*taskStats{}}
	for task := range probeProducts {
		pr.stats[task] = &taskStats{latest: map[int]answer{}}
	}
	// A slow answer is still an answer: the timeout only ends a request a
	// pod will not answer (it is stopping or starting).
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
	}}
	for i, addr := range addrs {
		for task, product := range probeProducts {
			pr.loops.Add(1)
			go func() {
				defer pr.loops.Done()
				tk := time.NewTicker(proberPeriod)
				defer tk.Stop()
				for {
					pr.results <- proberResult{i, task, query(hc, addr, product)}
					select {
					case <-pr.quit:
						return
					case <-tk.C:
					}
				}
			}()
		}
	}
	go func() {
		defer close(pr.done)
		for r := range pr.results {
			pr.record(r, len(addrs))
		}
		now := time.Now()
		for _, s := range pr.stats {
			if !s.unanswerableSince.IsZero() {
				s.maxUnanswerable = max(s.maxUnanswerable, now.Sub(s.unanswerableSince))
			}
			if !s.ownerSince.IsZero() {
				s.maxOwnerAway = max(s.maxOwnerAway, now.Sub(s.ownerSince))
			}
		}
	}()
	return pr
}

func (pr *prober) record(r proberResult, pods int) {
	s := pr.stats[r.task]
	s.latest[r.pod] = r.a
	s.total++
	if r.a.err == nil {
		s.ok++
		if r.a.stale {
			s.stale++
			s.maxLag = max(s.maxLag, r.a.standbyLag)
		}
	}
	if len(s.latest) < pods {
		return // not every pod has answered once yet
	}
	anyOK, anyFresh := false, false
	for _, a := range s.latest {
		if a.err == nil {
			anyOK = true
			if !a.stale {
				anyFresh = true
			}
		}
	}
	at := r.a.at
	switch {
	case !anyOK && s.unanswerableSince.IsZero():
		s.unanswerableSince = at
		s.unanswerableStretches++
	case anyOK && !s.unanswerableSince.IsZero():
		s.maxUnanswerable = max(s.maxUnanswerable, at.Sub(s.unanswerableSince))
		s.unanswerableSince = time.Time{}
	}
	switch {
	case !anyFresh && s.ownerSince.IsZero():
		s.ownerSince = at
	case anyFresh && !s.ownerSince.IsZero():
		s.maxOwnerAway = max(s.maxOwnerAway, at.Sub(s.ownerSince))
		s.ownerSince = time.Time{}
	}
}

func (pr *prober) stop() {
	close(pr.quit)
	pr.loops.Wait()
	close(pr.results)
	<-pr.done
}

func (pr *prober) report() map[string]*taskStats { return pr.stats }

// ---------------------------------------------------------------------------
// Helpers

// sentAtLeast returns a condition: the producer has had n events
// acknowledged (it gives up once the producer failed).
func sentAtLeast(p *harness.Producer, n int64) func() error {
	return func() error {
		if err := p.Err(); err != nil {
			return fmt.Errorf("%w: %w", harness.ErrGiveUp, err)
		}
		if s := p.Sent(); s < n {
			return fmt.Errorf("%d events sent, waiting for %d", s, n)
		}
		return nil
	}
}

// untraversable returns the first directory of dir and its parents that
// users other than its owner cannot pass through (no o+x), "" when none.
func untraversable(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir
	}
	for d := abs; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}
