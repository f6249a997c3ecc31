//go:build cluster

package cluster

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

const (
	// pauseRef is the sandbox image containerd's CRI runs: a static pause
	// built here (no registry is reachable).
	pauseRef = "salesagg.test/pause:1"
	// imageRef is the project's image as the manifests name it.
	imageRef = "salesagg:latest"
	// The namespaces: the prod overlay under the restricted Pod Security
	// Standard, and the test's own overlay (host network, which no Pod
	// Security level but privileged allows).
	prodNS = "salesagg-prod"
	runNS  = "salesagg-run"
	// inputTopic is the config's input.topic.
	inputTopic = "sales-events-v1"
	// runAppID is the test overlay's application.id: a group and
	// changelog of its own, apart from the prod overlay's, whose static
	// members stay in their group for session.timeout.ms after they went.
	runAppID = "sales-aggregator-run"
)

func TestCluster(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the cluster needs root (the kubelet mounts volumes, containerd runs containers): run make test-k8s-cluster as root")
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	bin, err := Binaries(t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Kubernetes %s binaries in %s (%s)", KubernetesVersion, bin, time.Since(start).Round(time.Millisecond))
	dir := t.TempDir()
	nodes := clusterNetwork(t)
	c := startControlPlane(t, bin, dir, nodes)
	c.mustKubectl("version")

	// Storage: local volumes under the test's dir, bound when a pod using
	// the claim is scheduled (WaitForFirstConsumer), through the default
	// class the manifests' claims (which name none) get.
	pvs := storage(t, c, dir, 3)

	t.Run("ProdOverlayRestricted", func(t *testing.T) { c.t = t; prodOverlay(t, c, root) })
	c.t = t

	images := buildImages(t, root, bin, filepath.Join(dir, "images"))
	ensureContainerd(t)
	for _, n := range c.nodes {
		start := time.Now()
		n.dir = filepath.Join(dir, "nodes", n.name)
		if err := c.startNode(n, images); err != nil {
			t.Skipf("the nodes (containerd, kubelet) cannot run on this machine, so no pod runs; the control plane and the prod overlay's checks ran. Reason: %v", err)
		}
		t.Logf("node %s Ready after %s", n.name, time.Since(start).Round(100*time.Millisecond))
	}
	c.mustKubectl("get", "nodes", "-o", "wide")
	start = time.Now()
	if err := c.startKubeProxy(); err != nil {
		t.Fatalf("kube-proxy: %v", err)
	}
	t.Logf("kube-proxy's rules in place after %s", time.Since(start).Round(100*time.Millisecond))
	if err := c.startPolicyAgents(); err != nil {
		t.Fatalf("the NetworkPolicy agent: %v", err)
	}
	c.deployCoreDNS()
	c.startProbe()
	// Kafka on the control plane's address: the test, host-network pods
	// and pods on the pod network all reach it there.
	kafka := harness.StartKafkaOn(t, root, dir, cpAddr)
	t.Run("ProdOverlayOnThePodNetwork", func(t *testing.T) { c.t = t; podNetwork(t, c, root, kafka) })
	c.t = t
	runOverlay(t, c, root, dir, kafka, pvs)
}

// ensureContainerd installs Debian's docker.io (containerd, runc, ctr) when
// containerd is missing; startNode says what is missing if it could not.
func ensureContainerd(t *testing.T) {
	if err := ensurePackage(t, "containerd", "docker.io"); err != nil {
		t.Log(err)
	}
}

// storage makes a StorageClass (default, WaitForFirstConsumer) and n local
// PersistentVolumes of 1Gi on the first node, and returns their host paths
// by PV name.
func storage(t *testing.T, c *cluster, dir string, n int) map[string]string {
	f := filepath.Join(dir, "storageclass.yaml")
	if err := os.WriteFile(f, []byte(`apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c.mustKubectl("apply", "--server-side", "-f", f)
	return localVolumes(t, c, filepath.Join(dir, "pv"), "local", n, "1Gi", nodeSpecs[0].name)
}

// localVolumes makes n local PersistentVolumes of size in class local, named
// prefix-0…, on the nodes in turn, their directories under dir, and returns
// their host paths by PV name.
func localVolumes(t *testing.T, c *cluster, dir, prefix string, n int, size string, nodes ...string) map[string]string {
	var b strings.Builder
	pvs := map[string]string{}
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("pv-%d", i))
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%s-%d", prefix, i)
		pvs[name] = p
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: %s
spec:
  capacity: {storage: %s}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  volumeMode: Filesystem
  local: {path: %s}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/hostname, operator: In, values: [%s]}
`, name, size, p, nodes[i%len(nodes)])
	}
	f := filepath.Join(c.dir, prefix+"-volumes.yaml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c.mustKubectl("apply", "--server-side", "-f", f)
	return pvs
}

// prodOverlay: the prod overlay, server-side applied as a dry run, then for
// real, in a namespace enforcing the restricted Pod Security Standard; the
// StatefulSet controller makes its 3 pods (admitted under restricted) and
// their claims.
func prodOverlay(t *testing.T, c *cluster, root string) {
	nsFile := filepath.Join(c.dir, "prod-namespace.yaml")
	_ = os.WriteFile(nsFile, []byte(`apiVersion: v1
kind: Namespace
metadata:
  name: `+prodNS+`
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
    pod-security.kubernetes.io/warn: restricted
`), 0o644)
	c.mustKubectl("apply", "--server-side", "-f", nsFile)
	prod := filepath.Join(root, "deploy", "k8s", "overlays", "prod")

	out, errOut, err := c.kubectl("apply", "--server-side", "--dry-run=server", "-n", prodNS, "-k", prod)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"configmap/salesagg-config-", "service/salesagg ", "service/salesagg-headless ", "poddisruptionbudget.policy/salesagg ",
		"networkpolicy.networking.k8s.io/salesagg ", "statefulset.apps/salesagg "} {
		if !hasLine(out, want, "serverside-applied (server dry run)") {
			t.Errorf("the server dry run did not apply %q:\n%s", want, out)
		}
	}
	if strings.Contains(errOut, "Warning") {
		t.Errorf("the API server warned on the prod overlay:\n%s", errOut)
	}
	var sts map[string]any
	if err := c.get("/apis/apps/v1/namespaces/"+prodNS+"/statefulsets/salesagg", &sts); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("the dry run left a StatefulSet (GET: %v)", err)
	}

	out, errOut, err = c.kubectl("apply", "--server-side", "-n", prodNS, "-k", prod)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(errOut, "Warning") {
		t.Errorf("the API server warned on the prod overlay:\n%s", errOut)
	}
	harness.WaitFor(t, 2*time.Minute, "the StatefulSet controller to make 3 pods and 3 claims", func() error {
		var pods podList
		if err := c.get("/api/v1/namespaces/"+prodNS+"/pods", &pods); err != nil {
			return err
		}
		var claims pvcList
		if err := c.get("/api/v1/namespaces/"+prodNS+"/persistentvolumeclaims", &claims); err != nil {
			return err
		}
		if len(pods.Items) != 3 || len(claims.Items) != 3 {
			return fmt.Errorf("%d pods, %d claims", len(pods.Items), len(claims.Items))
		}
		return nil
	})
	c.mustKubectl("get", "statefulset,pods,pvc", "-n", prodNS, "-o", "wide")
	var pods podList
	if err := c.get("/api/v1/namespaces/"+prodNS+"/pods", &pods); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		ct := p.Spec.Containers[0]
		sc := p.Spec.SecurityContext
		claim := ""
		for _, v := range p.Spec.Volumes {
			if v.Name == "data" && v.PersistentVolumeClaim != nil {
				claim = v.PersistentVolumeClaim.ClaimName
			}
		}
		switch {
		case ct.Image != imageRef:
			t.Errorf("%s: image %q, want %q", p.Metadata.Name, ct.Image, imageRef)
		case claim != "data-"+p.Metadata.Name:
			t.Errorf("%s: volume data is claim %q, want data-%s", p.Metadata.Name, claim, p.Metadata.Name)
		case sc.FSGroup == nil || *sc.FSGroup != 65532 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
			t.Errorf("%s: pod security context %+v", p.Metadata.Name, sc)
		case ct.SecurityContext.ReadOnlyRootFilesystem == nil || !*ct.SecurityContext.ReadOnlyRootFilesystem:
			t.Errorf("%s: root file system not read-only", p.Metadata.Name)
		}
	}
	var claims pvcList
	if err := c.get("/api/v1/namespaces/"+prodNS+"/persistentvolumeclaims", &claims); err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if cl.Spec.Resources.Requests["storage"] != "10Gi" || cl.Spec.StorageClassName != "local" || cl.Status.Phase != "Pending" {
			t.Errorf("claim %s: %s in class %q, %s; want 10Gi in the default class local, Pending (bound only for a scheduled pod)",
				cl.Metadata.Name, cl.Spec.Resources.Requests["storage"], cl.Spec.StorageClassName, cl.Status.Phase)
		}
	}
	// Leave nothing for the node to run: the namespace goes (its pods were
	// never scheduled: no node yet, and no 10Gi volume).
	c.mustKubectl("delete", "namespace", prodNS, "--wait=false")
}

// hasLine reports whether a line of out starts with prefix and contains s.
func hasLine(out, prefix, s string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// buildImages returns, as `docker save` tarballs in dir, the sandbox
// (pause) and probe images, built here from ./pause and ./probe, CoreDNS's
// (the binary in bin), and the project's image: the one
// the container test builds with `docker build` from the Dockerfile, which
// test/docker's TestProjectImage finds in its cache or builds on a dockerd
// of its own (root dir, the repository). SALESAGG_K8S_IMAGE names a
// `docker save` tarball of salesagg:latest to use instead, e.g. from
// `docker build -t salesagg . && docker save -o salesagg.tar salesagg:latest`.
func buildImages(t *testing.T, root, bin, dir string) []string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// One static binary per image: pause and probe built here, CoreDNS
	// from the binaries' cache.
	var tars []string
	for _, img := range []struct{ ref, name, src string }{
		{pauseRef, "pause", "./pause"},
		{probeRef, "probe", "./probe"},
		{corednsRef, "coredns", filepath.Join(bin, "coredns")},
	} {
		path := img.src
		if strings.HasPrefix(img.src, "./") {
			path = filepath.Join(dir, img.name)
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", path, img.src)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build %s: %v\n%s", img.src, err, b)
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tar := filepath.Join(dir, img.name+".tar")
		if err := WriteImageFile(tar, img.ref, ImageConfig{Entrypoint: []string{"/" + img.name}},
			[]File{{Name: img.name, Mode: 0o755, Data: data}}); err != nil {
			t.Fatal(err)
		}
		tars = append(tars, tar)
	}
	if prebuilt := os.Getenv("SALESAGG_K8S_IMAGE"); prebuilt != "" {
		t.Logf("the project's image from %s (SALESAGG_K8S_IMAGE)", prebuilt)
		return append(tars, prebuilt)
	}
	imgTar := filepath.Join(dir, "salesagg.tar")
	cmd := exec.Command("go", "test", "-tags", "docker", "-count=1", "-timeout", "40m", "-v",
		"-run", "^TestProjectImage$", "./test/docker/")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "SALESAGG_IMAGE_OUT="+imgTar)
	out, err := cmd.CombinedOutput()
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		t.Logf("test/docker: %s", l)
	}
	if err != nil {
		t.Fatalf("the project's image from test/docker (go test -tags docker -run TestProjectImage ./test/docker/): %v", err)
	}
	t.Logf("the images %s, %s, %s (built here) and %s (docker build, from test/docker) in %s", pauseRef, probeRef, corednsRef, imageRef, time.Since(start).Round(time.Millisecond))
	return append(tars, imgTar)
}

// The parts of the API objects the test reads.
type (
	meta struct {
		Name              string
		UID               string
		DeletionTimestamp *string
	}
	pod struct {
		Metadata meta
		Spec     struct {
			NodeName        string
			HostNetwork     bool
			SecurityContext struct {
				FSGroup      *int64
				RunAsNonRoot *bool
			}
			Containers []struct {
				Name            string
				Image           string
				SecurityContext struct {
					ReadOnlyRootFilesystem *bool
				}
			}
			Volumes []struct {
				Name                  string
				PersistentVolumeClaim *struct{ ClaimName string }
			}
		}
		Status struct {
			Phase      string
			Conditions []struct {
				Type, Status, Reason, Message string
			}
			ContainerStatuses []struct {
				Name         string
				Ready        bool
				RestartCount int
				ContainerID  string
				LastState    struct {
					Terminated *struct {
						ExitCode int
						Reason   string
					}
				}
			}
		}
	}
	podList struct{ Items []pod }
	pvc     struct {
		Metadata meta
		Spec     struct {
			StorageClassName string
			VolumeName       string
			Resources        struct{ Requests map[string]string }
		}
		Status struct{ Phase string }
	}
	pvcList struct{ Items []pvc }
)

func (p pod) condition(typ string) string {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// runOverlay: the test's overlay runs for real.
func runOverlay(t *testing.T, c *cluster, root, dir, kafka string, pvs map[string]string) {
	// On the host network of the node its volumes are on: the pod's
	// address is the node's; the test reaches it there.
	httpPort := port(t)
	httpAddr := c.nodes[0].addr + ":" + httpPort
	overlay := filepath.Join(dir, "overlay-run")
	writeRunOverlay(t, root, overlay, kafka, httpAddr, httpPort)
	c.mustKubectl("apply", "--server-side", "-k", overlay)
	api := harness.NewAPI(httpAddr)

	first := c.waitPodReady(t, "", 5*time.Minute)
	c.mustKubectl("get", "pods,pvc,pv", "-n", runNS, "-o", "wide")
	claim := c.claim(t)
	pvPath := pvs[claim.Spec.VolumeName]
	if claim.Status.Phase != "Bound" || pvPath == "" {
		t.Fatalf("claim data-salesagg-0: %s to %q, want Bound to a local PV", claim.Status.Phase, claim.Spec.VolumeName)
	}
	t.Logf("claim data-salesagg-0 is bound to %s (%s)", claim.Spec.VolumeName, pvPath)
	c.checkContainer(t, first, pvPath)
	restoredAll(t, c.logs(t, false), -1)

	rng := rand.New(rand.NewPCG(1, 2))
	cl := harness.NewClient(t, kafka)
	var events []harness.Event
	produce := func(n int) map[string]int64 {
		evs := harness.GenEvents(rng, "p", 40, n)
		harness.Produce(t, cl, harness.Records(inputTopic, evs)...)
		events = append(events, evs...)
		return harness.TotalsOf(events)
	}
	want := produce(2000)
	harness.WaitFor(t, 2*time.Minute, "the exact totals over HTTP (GET /v1/products/...)", func() error { return api.CheckTotals(want) })
	t.Logf("%d events, %d products: every total exact over HTTP", len(events), len(want))

	// A pod deleted: the StatefulSet controller makes it again, on the
	// same claim; its stores are intact, so it restores 0 records.
	t.Run("DeletePod", func(t *testing.T) {
		c.t = t
		old := c.pod(t)
		logs := c.followLogs(t)
		c.mustKubectl("delete", "pod", "salesagg-0", "-n", runNS)
		c.backOnItsClaim(t, old.Metadata.UID, logs(), claim, pvPath)
		harness.WaitFor(t, time.Minute, "the exact totals after the pod was made again", func() error { return api.CheckTotals(want) })
	})
	c.t = t

	t.Run("RolloutRestart", func(t *testing.T) {
		c.t = t
		want = produce(1000)
		harness.WaitFor(t, time.Minute, "the new events' totals", func() error { return api.CheckTotals(want) })
		old := c.pod(t)
		logs := c.followLogs(t)
		c.mustKubectl("rollout", "restart", "statefulset/salesagg", "-n", runNS)
		c.mustKubectl("rollout", "status", "statefulset/salesagg", "-n", runNS, "--timeout=5m")
		c.backOnItsClaim(t, old.Metadata.UID, logs(), claim, pvPath)
		harness.WaitFor(t, time.Minute, "the exact totals after the rollout", func() error { return api.CheckTotals(want) })
	})
	c.t = t

	// The claim deleted with its pod: the controller makes both again; the
	// new claim binds another volume, empty, and the pod restores every
	// changelog in full.
	t.Run("DeleteClaimAndPod", func(t *testing.T) {
		c.t = t
		want = produce(1000)
		harness.WaitFor(t, time.Minute, "the new events' totals", func() error { return api.CheckTotals(want) })
		old := c.pod(t)
		c.mustKubectl("delete", "pvc", "data-salesagg-0", "-n", runNS, "--wait=false")
		c.mustKubectl("delete", "pod", "salesagg-0", "-n", runNS)
		p := c.waitPodReady(t, old.Metadata.UID, 5*time.Minute)
		c.mustKubectl("get", "pods,pvc,pv", "-n", runNS, "-o", "wide")
		nc := c.claim(t)
		if nc.Metadata.UID == claim.Metadata.UID || nc.Spec.VolumeName == claim.Spec.VolumeName || pvs[nc.Spec.VolumeName] == "" {
			t.Fatalf("the new claim %s is bound to %s; want a new claim on another local volume than %s", nc.Metadata.UID, nc.Spec.VolumeName, claim.Spec.VolumeName)
		}
		claim, pvPath = nc, pvs[nc.Spec.VolumeName]
		c.checkContainer(t, p, pvPath)
		restored := restoredAll(t, c.logs(t, false), -1)
		changelog, err := harness.ReadTopic(kafka, sales.ChangelogTopic(runAppID, sales.StoreName), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("restored %d records on the new claim; the changelog holds %d (%d written), the state %d products",
			restored, len(changelog.Records), changelog.Written(), len(want))
		if restored < int64(len(want)) || restored > int64(len(changelog.Records)) {
			t.Errorf("restored %d records, want the full changelog: at least one per product (%d), at most the %d it holds",
				restored, len(want), len(changelog.Records))
		}
		harness.WaitFor(t, time.Minute, "the exact totals after the full restore", func() error { return api.CheckTotals(want) })
	})
	c.t = t

	// Liveness for real: the process stopped (SIGSTOP) answers no /healthz;
	// the kubelet's liveness probe fails and the kubelet kills and restarts
	// the container, which comes back on the same claim.
	t.Run("LivenessKill", func(t *testing.T) {
		c.t = t
		want = produce(1000)
		harness.WaitFor(t, time.Minute, "the new events' totals", func() error { return api.CheckTotals(want) })
		pid := c.stopContainer(t, c.pod(t))
		t.Logf("SIGSTOP to the container's process %d", pid)
		harness.WaitFor(t, 3*time.Minute, "the kubelet to restart the container (liveness)", func() error {
			q := c.pod(t)
			if len(q.Status.ContainerStatuses) == 0 || q.Status.ContainerStatuses[0].RestartCount < 1 {
				return fmt.Errorf("not restarted yet")
			}
			return nil
		})
		c.mustKubectl("get", "events", "-n", runNS, "--field-selector", "involvedObject.name=salesagg-0,reason=Unhealthy")
		c.mustKubectl("get", "events", "-n", runNS, "--field-selector", "involvedObject.name=salesagg-0,reason=Killing")
		q := c.waitPodReady(t, "", 5*time.Minute)
		cs := q.Status.ContainerStatuses[0]
		if cs.LastState.Terminated == nil || cs.LastState.Terminated.ExitCode != 137 {
			t.Errorf("the container's last state: %+v, want terminated by SIGKILL (137)", cs.LastState.Terminated)
		}
		c.mustKubectl("get", "pod", "salesagg-0", "-n", runNS, "-o", "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].lastState}{\"\\n\"}")
		c.sameClaim(t, claim)
		c.checkContainer(t, q, pvPath)
		restoredAll(t, c.logs(t, false), -1)
		harness.WaitFor(t, time.Minute, "the exact totals after the liveness restart", func() error { return api.CheckTotals(want) })
	})
	c.t = t
}

// writeRunOverlay writes the test's overlay: the base with 1 replica on the
// node's network, HTTP on the node's address (the probes ask it there),
// Kafka at kafka, leave.group.on.close so that the shutdown leaves the
// group, and a liveness probe faster than the base's (same path).
func writeRunOverlay(t *testing.T, root, overlay, kafka, httpAddr, httpPort string) {
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := filepath.Rel(overlay, filepath.Join(root, "deploy", "k8s", "base"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
  - namespace.yaml
  - %s
replicas:
  - name: salesagg
    count: 1
configMapGenerator:
  - name: salesagg-config
    behavior: replace
    files:
      - salesagg.yaml
patches:
  - path: statefulset.yaml
  - target: {kind: StatefulSet, name: salesagg}
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/ports/0/containerPort
        value: %s
`, runNS, base, httpPort),
		"namespace.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + runNS + "\n",
		"salesagg.yaml": fmt.Sprintf(`application.id: %s
bootstrap.servers: %s
input.topic: %s
notification.topic: notifications-events-v1
processing.guarantee: exactly_once_v2
topics.create: true
topics.input.create: true
topics.partitions: 3
replication.factor: -1
leave.group.on.close: true
session.timeout.ms: 45000
num.standby.replicas: 0
log.level: info
log.format: json
`, runAppID, kafka, inputTopic),
		"statefulset.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: salesagg
spec:
  template:
    spec:
      hostNetwork: true
      containers:
        - name: salesagg
          env:
            - name: SALESAGG_HTTP_ADDR
              value: %[1]q
            - name: SALESAGG_APPLICATION_SERVER
              value: %[1]q
          startupProbe:
            httpGet: {host: %[2]s}
            periodSeconds: 1
          readinessProbe:
            httpGet: {host: %[2]s}
          livenessProbe:
            httpGet: {host: %[2]s}
            periodSeconds: 2
            timeoutSeconds: 1
            failureThreshold: 3
            terminationGracePeriodSeconds: 5
          resources:
            requests: {cpu: 100m, memory: 256Mi}
`, httpAddr, strings.Split(httpAddr, ":")[0]),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(overlay, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// pod reads salesagg-0 of the one-replica run.
func (c *cluster) pod(t *testing.T) pod {
	t.Helper()
	return c.podIn(t, runNS, "salesagg-0")
}

// podIn reads pod name of namespace ns.
func (c *cluster) podIn(t *testing.T, ns, name string) pod {
	t.Helper()
	var p pod
	if err := c.get("/api/v1/namespaces/"+ns+"/pods/"+name, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// claimIn reads claim name of namespace ns.
func (c *cluster) claimIn(t *testing.T, ns, name string) pvc {
	t.Helper()
	var cl pvc
	if err := c.get("/api/v1/namespaces/"+ns+"/persistentvolumeclaims/"+name, &cl); err != nil {
		t.Fatal(err)
	}
	return cl
}

// waitPodReady waits for salesagg-0 (another than the one of uid notUID,
// when given) to be Ready: its real probes passed.
func (c *cluster) waitPodReady(t *testing.T, notUID string, timeout time.Duration) pod {
	t.Helper()
	var p pod
	start := time.Now()
	harness.WaitFor(t, timeout, "pod salesagg-0 to be Ready", func() error {
		if err := c.alive(); err != nil {
			return fmt.Errorf("%w: %w", harness.ErrGiveUp, err)
		}
		p = pod{}
		if err := c.get("/api/v1/namespaces/"+runNS+"/pods/salesagg-0", &p); err != nil {
			return err
		}
		if p.Metadata.UID == notUID || p.Metadata.DeletionTimestamp != nil {
			return fmt.Errorf("the old pod %s is still there", p.Metadata.UID)
		}
		if p.condition("Ready") != "True" {
			return fmt.Errorf("pod %s: phase %s, conditions %+v; last warning: %s", p.Metadata.UID, p.Status.Phase, p.Status.Conditions, c.lastWarning())
		}
		return nil
	})
	t.Logf("pod salesagg-0 (%s) Ready after %s", p.Metadata.UID, time.Since(start).Round(10*time.Millisecond))
	return p
}

// lastWarning is the message of the latest Warning event about salesagg-0
// (a sandbox or container the kubelet could not start, a failing probe).
func (c *cluster) lastWarning() string {
	var events struct {
		Items []struct {
			Type, Reason, Message string
			Count                 int
		}
	}
	if err := c.get("/api/v1/namespaces/"+runNS+"/events?fieldSelector=involvedObject.name%3Dsalesagg-0%2Ctype%3DWarning", &events); err != nil {
		return err.Error()
	}
	if len(events.Items) == 0 {
		return "none"
	}
	e := events.Items[len(events.Items)-1]
	return fmt.Sprintf("%s (x%d): %s", e.Reason, e.Count, e.Message)
}

// claim reads data-salesagg-0 of the one-replica run.
func (c *cluster) claim(t *testing.T) pvc {
	t.Helper()
	return c.claimIn(t, runNS, "data-salesagg-0")
}

// backOnItsClaim checks a pod made again after a clean stop (the old
// container's log lines): the new pod, not notUID, turns Ready on the same
// claim and volume, and every task restored 0 records.
func (c *cluster) backOnItsClaim(t *testing.T, notUID string, oldLog []string, claim pvc, pvPath string) {
	t.Helper()
	cleanShutdown(t, oldLog)
	p := c.waitPodReady(t, notUID, 5*time.Minute)
	c.sameClaim(t, claim)
	c.checkContainer(t, p, pvPath)
	restoredAll(t, c.logs(t, false), 0)
}

// sameClaim checks that the pod runs on the claim it had.
func (c *cluster) sameClaim(t *testing.T, was pvc) {
	t.Helper()
	now := c.claim(t)
	c.mustKubectl("get", "pvc", "data-salesagg-0", "-n", runNS, "-o", "custom-columns=NAME:.metadata.name,UID:.metadata.uid,STATUS:.status.phase,VOLUME:.spec.volumeName")
	if now.Metadata.UID != was.Metadata.UID || now.Spec.VolumeName != was.Spec.VolumeName || now.Status.Phase != "Bound" {
		t.Errorf("claim data-salesagg-0 is %s on %s (%s), want the same claim %s on %s", now.Metadata.UID, now.Spec.VolumeName, now.Status.Phase, was.Metadata.UID, was.Spec.VolumeName)
	}
}

// checkContainer checks the running container from the host: its process
// runs as 65532 with the supplementary group 65532 (fsGroup), its root file
// system is mounted read-only, /shared-volume is the claim's local volume
// (pvPath), whose state dir belongs to the group 65532.
func (c *cluster) checkContainer(t *testing.T, p pod, pvPath string) {
	t.Helper()
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	pid, err := c.containerPID(p)
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var uid, groups string
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uid = strings.Fields(v)[0]
		}
		if v, ok := strings.CutPrefix(l, "Groups:"); ok {
			groups = strings.TrimSpace(v)
		}
	}
	if uid != "65532" || !slices.Contains(strings.Fields(groups), "65532") {
		t.Errorf("container process %d: uid %s, groups %q; want uid 65532 in group 65532 (fsGroup)", pid, uid, groups)
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	var rootOpts, volRoot string
	sc := bufio.NewScanner(bytes.NewReader(mi))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		switch f[4] {
		case "/":
			rootOpts = f[5]
		case "/shared-volume":
			volRoot = f[3]
		}
	}
	if !slices.Contains(strings.Split(rootOpts, ","), "ro") {
		t.Errorf("container process %d: / is mounted %q, want read-only", pid, rootOpts)
	}
	if volRoot == "" || !strings.HasSuffix(volRoot, filepath.Base(pvPath)) {
		t.Errorf("container process %d: /shared-volume is %q, want the local volume %s", pid, volRoot, pvPath)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(pvPath, "state_store"), &st); err != nil {
		t.Errorf("the state dir on the volume: %v", err)
	} else if st.Gid != 65532 {
		t.Errorf("%s/state_store: group %d, want 65532", pvPath, st.Gid)
	}
	t.Logf("container %s (pid %d): uid %s, groups %s, / %s, /shared-volume = %s (group 65532)", id[:12], pid, uid, groups, rootOpts, pvPath)
}

// logs is `kubectl logs salesagg-0` (of the previous container if
// previous), as lines.
func (c *cluster) logs(t *testing.T, previous bool) []string {
	t.Helper()
	args := []string{"logs", "salesagg-0", "-n", runNS}
	if previous {
		args = append(args, "--previous")
	}
	out, _, err := run(time.Minute, []string{"KUBECONFIG=" + c.admin}, filepath.Join(c.bin, "kubectl"), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("$ kubectl %s | grep -E 'restoring|Restoration'", strings.Join(args, " "))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines {
		if strings.Contains(l, "Finished restoring") || strings.Contains(l, "Restoration took") {
			t.Log(l)
		}
	}
	return lines
}

// followLogs starts `kubectl logs -f salesagg-0`; the function it returns
// waits for the stream to end (the container stopped) and returns it.
func (c *cluster) followLogs(t *testing.T) func() []string {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, "kubectl"), "logs", "-f", "salesagg-0", "-n", runNS)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.admin)
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return func() []string {
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("kubectl logs -f did not end within 2 minutes of the pod's deletion")
		}
		return strings.Split(strings.TrimSpace(out.String()), "\n")
	}
}

// cleanShutdown checks the stopped container's log: SIGTERM, then the
// group left, the stores closed, "Stopped", within the grace period.
func cleanShutdown(t *testing.T, lines []string) {
	t.Helper()
	t.Log("$ kubectl logs -f salesagg-0 (until the container stopped) | grep -E 'Shutdown|group|Stopped'")
	var seen []string
	for _, e := range harness.JSONLines(lines) {
		m := e.Msg()
		if strings.HasPrefix(m, "Shutdown requested") || strings.Contains(m, "the group") || m == "Stopped" {
			seen = append(seen, m)
			t.Logf("  %s", m)
		}
	}
	for _, want := range []string{"Shutdown requested", "Left the group", "Stopped"} {
		if !slices.ContainsFunc(seen, func(m string) bool { return strings.HasPrefix(m, want) }) {
			t.Errorf("the stopped container did not log %q: its shutdown was not clean:\n%s", want, strings.Join(lines[max(0, len(lines)-15):], "\n"))
		}
	}
}

// restoredAll checks that the container restored each of the 3 tasks
// (want records each, or any number if want < 0) and returns the total.
func restoredAll(t *testing.T, lines []string, want int64) int64 {
	t.Helper()
	var total int64
	parts := map[int]bool{}
	for _, l := range harness.RestoreLines(harness.JSONLines(lines)) {
		parts[l.Partition] = true
		total += l.Records
		if !l.Agrees {
			t.Errorf("restore line %q: its records field disagrees", l.Msg)
		}
		if want >= 0 && l.Records != want {
			t.Errorf("restored %d records for changelog partition %d, want %d: %s", l.Records, l.Partition, want, l.Msg)
		}
	}
	if len(parts) != 3 {
		t.Errorf("restore lines for %d changelog partitions, want 3", len(parts))
	}
	return total
}
