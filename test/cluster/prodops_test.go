//go:build cluster

package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// prodRun is the prod overlay running on the pod network as podNetwork
// made it; its methods are the operations an operator runs on it. The
// test's goroutine owns it.
type prodRun struct {
	c       *cluster
	root    string
	service string   // GET /v1/products through the Service
	urls    []string // the same through the Service, then from each pod
	want    map[string]int64
}

// pods reads the prod overlay's pods by name.
func (pr *prodRun) pods(t *testing.T) map[string]pod {
	t.Helper()
	var l podList
	if err := pr.c.get("/api/v1/namespaces/"+prodNS+"/pods", &l); err != nil {
		t.Fatal(err)
	}
	m := map[string]pod{}
	for _, p := range l.Items {
		m[p.Metadata.Name] = p
	}
	return m
}

// volumeOf is the volume the pod's claim is bound to.
func (pr *prodRun) volumeOf(t *testing.T, name string) string {
	t.Helper()
	return pr.c.claimIn(t, prodNS, "data-"+name).Spec.VolumeName
}

// restores is the pod's restore lines (its running container's log).
func (pr *prodRun) restores(t *testing.T, name string) []harness.RestoreLine {
	t.Helper()
	out, _, err := run(time.Minute, []string{"KUBECONFIG=" + pr.c.admin}, filepath.Join(pr.c.bin, "kubectl"), "logs", name, "-n", prodNS)
	if err != nil {
		t.Fatal(err)
	}
	return harness.RestoreLines(harness.JSONLines(strings.Split(strings.TrimSpace(out), "\n")))
}

// restoredNothing checks that the pod logged restore lines, each of 0
// records.
func (pr *prodRun) restoredNothing(t *testing.T, name, after string) {
	t.Helper()
	lines := pr.restores(t, name)
	if len(lines) == 0 {
		t.Errorf("%s logged no restore after %s", name, after)
	}
	for _, l := range lines {
		if l.Records != 0 || !l.Agrees {
			t.Errorf("%s restored %d records for changelog partition %d after %s, want 0: %s", name, l.Records, l.Partition, after, l.Msg)
		}
	}
	t.Logf("%s: %d restore lines after %s, each of 0 records", name, len(lines), after)
}

// rollingUpdate: a rolling update with a config change, an overlay of the
// prod overlay whose config file sets one more key. The controller replaces
// each pod (a new ConfigMap name in the template); each comes back as the
// same static member on the same claim and restores 0 records.
func (pr *prodRun) rollingUpdate(t *testing.T) {
	c := pr.c
	changed := filepath.Join(c.dir, "overlay-prod-changed")
	prodDir := filepath.Join(pr.root, "deploy", "k8s", "overlays", "prod")
	rel, err := filepath.Rel(changed, prodDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(prodDir, "salesagg.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(changed, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [%s]
configMapGenerator:
  - name: salesagg-config
    behavior: replace
    files: [salesagg.yaml]
`, rel),
		"salesagg.yaml": string(cfg) + "\nacceptable.recovery.lag: 20000\n",
	} {
		if err := os.WriteFile(filepath.Join(changed, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := pr.pods(t)
	start := time.Now()
	c.mustKubectl("apply", "--server-side", "-n", prodNS, "-k", changed)
	c.mustKubectl("rollout", "status", "statefulset/salesagg", "-n", prodNS, "--timeout=5m")
	t.Logf("rolling update with a config change done in %s", time.Since(start).Round(100*time.Millisecond))
	for name, p := range pr.pods(t) {
		if p.Metadata.UID == before[name].Metadata.UID {
			t.Errorf("%s was not replaced by the rolling update", name)
			continue
		}
		pr.restoredNothing(t, name, "the rolling update")
	}
	harness.WaitFor(t, 2*time.Minute, "every total exact after the rolling update", func() error {
		return c.checkTotals(pr.urls, pr.want)
	})
}

// drain: `kubectl drain` of the node that runs two of the three replicas.
// Both are evicted at once; the PodDisruptionBudget (maxUnavailable 1)
// admits the first and refuses the second, so the drain waits until its
// timeout with the node cordoned. The evicted pod, made again by the
// controller, waits for its node (its claim is bound to a local volume
// there) while the others answer every product (its tasks from the
// standbys); on `kubectl uncordon` it comes back on its node and volume and
// restores 0 records.
func (pr *prodRun) drain(t *testing.T) {
	c := pr.c
	before := pr.pods(t)
	byNode := map[string][]string{}
	for name, p := range before {
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], name)
	}
	var busy string
	for n, names := range byNode {
		if len(names) >= 2 {
			busy = n
		}
	}
	if busy == "" {
		t.Fatalf("the pods by node: %v; want a node with two of the replicas", byNode)
	}
	volumes := map[string]string{}
	for name := range before {
		volumes[name] = pr.volumeOf(t, name)
	}

	// Down, for the budget: a replica deleted, being deleted, or not
	// running (the replacement waits unscheduled). Watched until the end.
	var (
		mu      sync.Mutex
		maxDown []string // guarded by mu
		stop    = make(chan struct{})
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			var l podList
			if err := c.get("/api/v1/namespaces/"+prodNS+"/pods", &l); err == nil {
				var down []string
				for i := range 3 {
					name := fmt.Sprintf("salesagg-%d", i)
					j := slices.IndexFunc(l.Items, func(p pod) bool { return p.Metadata.Name == name })
					if j < 0 || l.Items[j].Metadata.DeletionTimestamp != nil || l.Items[j].Status.Phase != "Running" {
						down = append(down, name)
					}
				}
				mu.Lock()
				if len(down) > len(maxDown) {
					maxDown = down
				}
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	stopWatch := func() []string {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return maxDown
	}
	defer func() {
		select {
		case <-stop:
		default:
			stopWatch()
		}
	}()

	start := time.Now()
	out, errOut, err := c.kubectl("drain", busy, "--pod-selector=app.kubernetes.io/name=salesagg", "--timeout=40s")
	t.Logf("kubectl drain %s ended after %s", busy, time.Since(start).Round(100*time.Millisecond))
	if err == nil {
		t.Errorf("kubectl drain %s completed; want it held by the PodDisruptionBudget (two replicas on the node, maxUnavailable 1)", busy)
	}
	if !strings.Contains(out+errOut, "disruption budget") {
		t.Errorf("kubectl drain %s did not report an eviction refused by the disruption budget", busy)
	}
	var nodeObj struct{ Spec struct{ Unschedulable bool } }
	if err := c.get("/api/v1/nodes/"+busy, &nodeObj); err != nil {
		t.Fatal(err)
	}
	if !nodeObj.Spec.Unschedulable {
		t.Errorf("node %s is not cordoned after the drain", busy)
	}

	// One replica of the node was evicted and waits; the other runs on.
	var evicted, kept string
	harness.WaitFor(t, time.Minute, "the evicted replica to wait for its node", func() error {
		now := pr.pods(t)
		evicted, kept = "", ""
		for _, name := range byNode[busy] {
			p, ok := now[name]
			switch {
			case ok && p.Metadata.UID == before[name].Metadata.UID && p.Metadata.DeletionTimestamp == nil:
				kept = name
			case ok && p.Metadata.UID != before[name].Metadata.UID && p.Spec.NodeName == "" && p.condition("PodScheduled") == "False":
				evicted = name
			}
		}
		if evicted == "" || kept == "" {
			return fmt.Errorf("of %v on %s: none both unscheduled and new (evicted %q), or none still the same (kept %q)", byNode[busy], busy, evicted, kept)
		}
		return nil
	})
	c.mustKubectl("get", "pods", "-n", prodNS, "-o", "wide")
	c.mustKubectl("get", "events", "-n", prodNS, "--field-selector", "involvedObject.name="+evicted+",reason=FailedScheduling")
	t.Logf("%s evicted and waiting for node %s; %s still runs there", evicted, busy, kept)

	// Every product answered by the replicas still running.
	urls := []string{pr.service}
	for _, u := range pr.urls[1:] {
		if !strings.Contains(u, "//"+evicted+".") {
			urls = append(urls, u)
		}
	}
	harness.WaitFor(t, 2*time.Minute, "every total exact with "+evicted+" away", func() error {
		return c.checkTotals(urls, pr.want)
	})
	t.Logf("with %s away, every total exact through the Service and from the 2 other pods", evicted)

	c.mustKubectl("uncordon", busy)
	harness.WaitFor(t, 3*time.Minute, evicted+" back and Ready", func() error {
		p, ok := pr.pods(t)[evicted]
		if !ok || p.condition("Ready") != "True" {
			return fmt.Errorf("not Ready yet")
		}
		return nil
	})
	if down := stopWatch(); len(down) > 1 {
		t.Errorf("%v were down at once during the drain; the PodDisruptionBudget allows one", down)
	} else {
		t.Logf("at most one replica down during the drain: %v", down)
	}
	after := pr.pods(t)
	if n := after[evicted].Spec.NodeName; n != busy {
		t.Errorf("%s came back on node %s, want its node %s", evicted, n, busy)
	}
	if after[kept].Metadata.UID != before[kept].Metadata.UID {
		t.Errorf("%s, which the budget kept, was replaced", kept)
	}
	for name, v := range volumes {
		if now := pr.volumeOf(t, name); now != v {
			t.Errorf("%s's claim is bound to %s, want %s as before the drain", name, now, v)
		}
	}
	pr.restoredNothing(t, evicted, "the uncordon")
	harness.WaitFor(t, 2*time.Minute, "every total exact after the uncordon", func() error {
		return c.checkTotals(pr.urls, pr.want)
	})
}

// livenessKill: the prod overlay's liveness probe for real. A replica's
// process stopped (SIGSTOP) answers no /healthz; after the probe's
// failures the kubelet kills the container (SIGTERM unanswered, SIGKILL
// after the grace period) and starts it again, on the same node and claim.
func (pr *prodRun) livenessKill(t *testing.T) {
	c := pr.c
	const name = "salesagg-0"
	before := pr.pods(t)[name]
	volume := pr.volumeOf(t, name)
	if len(before.Status.ContainerStatuses) == 0 {
		t.Fatalf("%s has no container status", name)
	}
	restarts := before.Status.ContainerStatuses[0].RestartCount
	pid := c.stopContainer(t, before)
	start := time.Now()
	t.Logf("SIGSTOP to %s's process %d on node %s", name, pid, before.Spec.NodeName)
	var p pod
	harness.WaitFor(t, 4*time.Minute, "the kubelet to restart "+name+"'s container and the new one to be Ready", func() error {
		p = pr.pods(t)[name]
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount <= restarts {
			return fmt.Errorf("not restarted yet")
		}
		if p.condition("Ready") != "True" {
			return fmt.Errorf("restarted, not Ready yet")
		}
		return nil
	})
	t.Logf("%s restarted by the kubelet and Ready %s after the SIGSTOP", name, time.Since(start).Round(100*time.Millisecond))
	c.mustKubectl("get", "events", "-n", prodNS, "--field-selector", "involvedObject.name="+name+",reason=Unhealthy")
	cs := p.Status.ContainerStatuses[0]
	if cs.LastState.Terminated == nil || cs.LastState.Terminated.ExitCode != 137 {
		t.Errorf("the container's last state: %+v, want terminated by SIGKILL (137)", cs.LastState.Terminated)
	}
	if p.Metadata.UID != before.Metadata.UID || p.Spec.NodeName != before.Spec.NodeName {
		t.Errorf("%s is pod %s on %s, want the same pod %s on %s restarted in place", name, p.Metadata.UID, p.Spec.NodeName, before.Metadata.UID, before.Spec.NodeName)
	}
	if now := pr.volumeOf(t, name); now != volume {
		t.Errorf("%s's claim is bound to %s, want %s", name, now, volume)
	}
	lines := pr.restores(t, name)
	if len(lines) == 0 {
		t.Errorf("%s logged no restore after the restart", name)
	}
	var restored int64
	for _, l := range lines {
		restored += l.Records
	}
	t.Logf("%s: %d restore lines, %d records in all", name, len(lines), restored)
	harness.WaitFor(t, 2*time.Minute, "every total exact after the liveness restart", func() error {
		return c.checkTotals(pr.urls, pr.want)
	})
}
