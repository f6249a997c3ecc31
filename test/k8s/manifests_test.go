package k8s

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func overlayNames() []string {
	var names []string
	for n := range Overlays {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TestRenderMatchesKubectl: the kustomize Go API and `kubectl kustomize`
// render the same objects for each overlay (skipped without kubectl; the
// other tests always render with the Go API).
func TestRenderMatchesKubectl(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not on PATH: rendering with the kustomize Go API only")
	}
	root := repoRoot(t)
	for _, overlay := range overlayNames() {
		t.Run(overlay, func(t *testing.T) {
			dir := OverlayDir(root, overlay)
			goOut, err := Render(dir)
			if err != nil {
				t.Fatal(err)
			}
			kOut, err := RenderKubectl(kubectl, dir)
			if err != nil {
				t.Fatal(err)
			}
			diffs, err := SameObjects(goOut, kOut)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range diffs {
				t.Errorf("Go API vs kubectl kustomize: %s", d)
			}
			if _, err := Decode(kOut); err != nil {
				t.Errorf("kubectl's rendering: %v", err)
			}
		})
	}
}

// TestDecodeIsStrict: a field the API type does not have, a duplicate key or
// an unexpected kind fails the decoding.
func TestDecodeIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":   "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {publishNotReadyAdresses: true}\n",
		"misplaced field": "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: s}\nspec: {template: {spec: {fsGroup: 65532}}}\n",
		"duplicate key":   "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: x, a: y}\n",
		"unexpected kind": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
		"wrong type":      "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: p}\nspec: {selector: app}\n",
	} {
		if _, err := Decode([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error:\n%s", name, doc)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	ok := "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {publishNotReadyAddresses: true}\n---\n"
	if _, err := Decode([]byte(ok)); err != nil {
		t.Errorf("a valid Service: %v", err)
	}
}

// TestExpand: the kubelet's $(VAR) expansion.
func TestExpand(t *testing.T) {
	vars := map[string]string{"POD_NAME": "salesagg-1", "NS": "prod"}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for in, want := range map[string]string{
		"$(POD_NAME).salesagg-headless.$(NS).svc:8080": "salesagg-1.salesagg-headless.prod.svc:8080",
		"$(UNDEFINED)x":   "$(UNDEFINED)x",
		"$$(POD_NAME)":    "$(POD_NAME)",
		"a$b$":            "a$b$",
		"$(POD_NAME":      "$(POD_NAME",
		"plain":           "plain",
		"$(NS)$(NS)-$$$$": "prodprod-$$",
	} {
		if got := Expand(in, lookup); got != want {
			t.Errorf("Expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOverlays renders each overlay with the kustomize Go API, decodes every
// object strictly, and checks the wiring between the objects and salesagg's
// configuration, for every pod of the StatefulSet.
func TestOverlays(t *testing.T) {
	root := repoRoot(t)
	grace, err := ShutdownGrace(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, overlay := range overlayNames() {
		t.Run(overlay, func(t *testing.T) {
			m, _, err := Load(root, overlay)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("objects: %v", m.Objects)
			checkOverlay(t, m, Overlays[overlay], grace)
		})
	}
}

func checkOverlay(t *testing.T, m *Manifests, wantReplicas int32, grace time.Duration) {
	sts, err := m.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Services) != 2 || len(m.ConfigMaps) != 1 || len(m.PDBs) != 1 || len(m.Policies) != 1 || len(m.Objects) != 6 {
		t.Fatalf("objects %v: want a StatefulSet, 2 Services, a ConfigMap, a PodDisruptionBudget and a NetworkPolicy", m.Objects)
	}
	spec := sts.Spec
	tmpl := spec.Template
	podLabels := labels.Set(tmpl.Labels)

	// Replicas, selector, policies.
	if spec.Replicas == nil || *spec.Replicas != wantReplicas {
		t.Errorf("replicas = %v, want %d", ptrString(spec.Replicas), wantReplicas)
	}
	replicas := int(wantReplicas)
	if spec.Replicas != nil {
		replicas = int(*spec.Replicas)
	}
	if !selects(t, "StatefulSet selector", spec.Selector, podLabels) {
		t.Errorf("the StatefulSet's selector does not select its pod template's labels %v", tmpl.Labels)
	}
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy = %q, want Parallel (statefulset.yaml and the README say why)", spec.PodManagementPolicy)
	}
	if spec.UpdateStrategy.Type != "" && spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
		t.Errorf("updateStrategy = %q, want RollingUpdate", spec.UpdateStrategy.Type)
	}
	if r := spec.PersistentVolumeClaimRetentionPolicy; r == nil || r.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		t.Errorf("persistentVolumeClaimRetentionPolicy = %+v: a scale-down must keep the volumes (whenScaled: Retain)", r)
	}

	// Pod-level settings.
	ps := tmpl.Spec
	if ps.TerminationGracePeriodSeconds == nil || time.Duration(*ps.TerminationGracePeriodSeconds)*time.Second <= grace {
		t.Errorf("terminationGracePeriodSeconds = %v, want above salesagg's shutdown bound %s (stream.GracePeriod + the HTTP server's 5 s)", ptrString(ps.TerminationGracePeriodSeconds), grace)
	}
	if ps.EnableServiceLinks == nil || *ps.EnableServiceLinks {
		t.Errorf("enableServiceLinks = %v, want false: the Service salesagg would add SALESAGG_SERVICE_HOST, SALESAGG_PORT, ... which salesagg refuses", ptrString(ps.EnableServiceLinks))
	}
	sc := ps.SecurityContext
	if sc == nil {
		t.Fatal("no pod securityContext")
	}
	for name, v := range map[string]*int64{"runAsUser": sc.RunAsUser, "runAsGroup": sc.RunAsGroup, "fsGroup": sc.FSGroup} {
		if v == nil || *v != RunAs {
			t.Errorf("pod securityContext.%s = %v, want %d", name, ptrString(v), RunAs)
		}
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod securityContext.runAsNonRoot = %v, want true", ptrString(sc.RunAsNonRoot))
	}
	checkAntiAffinity(t, ps.Affinity, podLabels)

	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(ps.Containers))
	}
	c := ps.Containers[0]
	if c.Image != "salesagg:latest" {
		t.Errorf("image = %q, want salesagg:latest (kustomize images)", c.Image)
	}
	csc := c.SecurityContext
	if csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Errorf("container securityContext.readOnlyRootFilesystem is not true")
	}
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext.allowPrivilegeEscalation is not false")
	}
	checkResources(t, c)

	// The http port: the container's, the probes', the Services'.
	httpPort, err := ContainerPort(c, intstr.FromString("http"))
	if err != nil {
		t.Fatal(err)
	}
	checkProbes(t, c, httpPort)
	headless, err := m.Service(spec.ServiceName)
	if err != nil {
		t.Fatalf("serviceName %q: %v", spec.ServiceName, err)
	}
	if headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s (the StatefulSet's serviceName) has clusterIP %q, want None (headless)", headless.Name, headless.Spec.ClusterIP)
	}
	if !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: publishNotReadyAddresses is false: a pod that is restoring would have no DNS name and the forwarding to it would fail", headless.Name)
	}
	client, err := m.Service("salesagg")
	if err != nil {
		t.Fatal(err)
	}
	if client.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("Service salesagg is headless; want a client Service with a cluster IP")
	}
	for _, s := range m.Services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s selector %v does not select the pods (%v)", s.Name, s.Spec.Selector, tmpl.Labels)
		}
		found := false
		for _, sp := range s.Spec.Ports {
			tp := sp.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(sp.Port)
			}
			if n, err := ContainerPort(c, tp); err == nil && n == httpPort {
				found = true
			}
		}
		if !found {
			t.Errorf("Service %s has no port targeting the container's http port %d", s.Name, httpPort)
		}
	}

	// The PodDisruptionBudget.
	pdb := m.PDBs[0]
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" || pdb.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, minAvailable %v; want maxUnavailable 1", pdb.Name, pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
	}
	if !selects(t, "PodDisruptionBudget selector", pdb.Spec.Selector, podLabels) {
		t.Errorf("PodDisruptionBudget %s does not select the pods (%v)", pdb.Name, tmpl.Labels)
	}

	// The NetworkPolicy: the HTTP port from the app's own pods, labelled
	// client namespaces and the namespace monitoring only.
	np := m.Policies[0]
	if !selects(t, "NetworkPolicy podSelector", &np.Spec.PodSelector, podLabels) {
		t.Errorf("NetworkPolicy %s does not select the pods (%v)", np.Name, tmpl.Labels)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || len(np.Spec.Ingress) != 1 {
		t.Fatalf("NetworkPolicy %s: policy types %v, %d ingress rules; want one Ingress rule", np.Name, np.Spec.PolicyTypes, len(np.Spec.Ingress))
	}
	rule := np.Spec.Ingress[0]
	var fromPods, fromNamespaces, fromMonitoring bool
	for _, peer := range rule.From {
		switch {
		case peer.PodSelector != nil && peer.NamespaceSelector == nil && selects(t, "NetworkPolicy from podSelector", peer.PodSelector, podLabels):
			fromPods = true
		case peer.NamespaceSelector != nil && peer.PodSelector == nil && len(peer.NamespaceSelector.MatchLabels) == 1 &&
			peer.NamespaceSelector.MatchLabels["salesagg.io/client"] == "true":
			fromNamespaces = true
		case peer.NamespaceSelector != nil && peer.PodSelector == nil && len(peer.NamespaceSelector.MatchLabels) == 1 &&
			peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "monitoring":
			fromMonitoring = true
		default:
			t.Errorf("NetworkPolicy %s admits more than the app's pods, labelled namespaces and monitoring: %+v", np.Name, peer)
		}
	}
	if !fromPods || !fromNamespaces || !fromMonitoring || len(rule.Ports) != 1 {
		t.Errorf("NetworkPolicy %s: from the app's pods %v, from salesagg.io/client namespaces %v, from monitoring %v, %d ports",
			np.Name, fromPods, fromNamespaces, fromMonitoring, len(rule.Ports))
	} else if n, err := ContainerPort(c, *rule.Ports[0].Port); err != nil || n != httpPort {
		t.Errorf("NetworkPolicy %s admits port %v, not the http port %d", np.Name, rule.Ports[0].Port, httpPort)
	}

	// Prometheus' annotations: scrape /metrics on the http port.
	if a := tmpl.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(httpPort)) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape \"true\", port %d, path /metrics", a, httpPort)
	}

	// Volumes: the state claim, the config, the optional credentials.
	if len(spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("%d volumeClaimTemplates, want 1", len(spec.VolumeClaimTemplates))
	}
	claim := spec.VolumeClaimTemplates[0]
	if !slices.Contains(claim.Spec.AccessModes, corev1.ReadWriteOnce) {
		t.Errorf("claim %s access modes %v: want ReadWriteOnce", claim.Name, claim.Spec.AccessModes)
	}
	if q, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]; !ok || q.IsZero() {
		t.Errorf("claim %s requests no storage", claim.Name)
	}
	for _, v := range ps.Volumes {
		if v.Secret != nil && (v.Secret.Optional == nil || !*v.Secret.Optional) {
			t.Errorf("volume %s: Secret %s is not optional: pods would not start without it", v.Name, v.Secret.SecretName)
		}
	}
	hasSecret := slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Secret != nil })
	if !hasSecret {
		t.Errorf("no Secret volume for the Kafka credentials (sasl.password.file)")
	}

	// Environment names: the downward API and config keys only.
	envNames := ConfigEnvNames()
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "SALESAGG_") {
			if _, ok := envNames[e.Name]; !ok {
				t.Errorf("env %s names no config key (config.Keys())", e.Name)
			}
		}
	}

	// Every pod: the configuration it starts with.
	ns := "rehearsal-ns"
	dir := t.TempDir()
	var partitions int32
	for ord := range replicas {
		pod, err := MakePod(m, sts, ord, ns, dir)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := EffectiveConfig(pod)
		if err != nil {
			t.Errorf("%s: salesagg would not start: %v", pod.Name, err)
			continue
		}
		partitions = cfg.TopicsPartitions
		if cfg.GroupInstanceID != pod.Name {
			t.Errorf("%s: group.instance.id = %q, want the pod name", pod.Name, cfg.GroupInstanceID)
		}
		_, port, err := net.SplitHostPort(cfg.HTTPAddr)
		if err != nil || port != strconv.Itoa(int(httpPort)) {
			t.Errorf("%s: http.addr = %q, want the container's http port %d", pod.Name, cfg.HTTPAddr, httpPort)
		}
		wantServer := fmt.Sprintf("%s.%s.%s.svc.cluster.local:%d", pod.Name, headless.Name, ns, httpPort)
		if cfg.ApplicationServer != wantServer {
			t.Errorf("%s: application.server = %q, want %q (the pod's name under the headless Service, the http port)", pod.Name, cfg.ApplicationServer, wantServer)
		}
		stateMount, ok := pod.Mount(claim.Name)
		if !ok {
			t.Fatalf("%s: the claim %s is not mounted", pod.Name, claim.Name)
		}
		if stateMount.Path != StateVolumeMount {
			t.Errorf("%s: claim %s mounted at %s, want %s (the image's volume)", pod.Name, claim.Name, stateMount.Path, StateVolumeMount)
		}
		if filepath.Dir(cfg.StateDir) != stateMount.Path {
			t.Errorf("%s: state.dir = %q, whose parent is not the claim's mountPath %s", pod.Name, cfg.StateDir, stateMount.Path)
		}
		if stateMount.ReadOnly {
			t.Errorf("%s: the state volume is mounted read-only", pod.Name)
		}
		if !cfg.LeaveGroupOnClose && cfg.SessionTimeout < 30*time.Second {
			t.Errorf("%s: leave.group.on.close false with session.timeout.ms %s: a restarting pod would lose its tasks", pod.Name, cfg.SessionTimeout)
		}
		if cfg.LeaveGroupOnClose {
			t.Errorf("%s: leave.group.on.close is true: a rolling update would move each pod's tasks away and back (the README describes false)", pod.Name)
		}
		if cfg.NumStandbyReplicas > replicas-1 {
			t.Errorf("%s: num.standby.replicas %d with %d replicas", pod.Name, cfg.NumStandbyReplicas, replicas)
		}
		if ord == 0 {
			t.Logf("%s: group.instance.id %s, application.server %s, http.addr %s, state.dir %s, partitions %d, leave.group.on.close %v, standbys %d, session %s",
				pod.Name, cfg.GroupInstanceID, cfg.ApplicationServer, cfg.HTTPAddr, cfg.StateDir, cfg.TopicsPartitions, cfg.LeaveGroupOnClose, cfg.NumStandbyReplicas, cfg.SessionTimeout)
		}
		cm := ""
		for _, v := range ps.Volumes {
			if v.ConfigMap != nil {
				cm = v.ConfigMap.Name
			}
		}
		if !slices.Contains(pod.Command, "--config") || cm == "" {
			t.Errorf("%s: arguments %q: want --config with the file from the ConfigMap volume", pod.Name, pod.Command)
		}
	}
	if int32(replicas) > partitions {
		t.Errorf("replicas %d > topics.partitions %d: a pod without a task is never ready", replicas, partitions)
	}
}

// checkProbes: startup and readiness on /readyz, liveness on /healthz, all
// on the http port, the startup budget long enough for a full restore.
func checkProbes(t *testing.T, c corev1.Container, httpPort int32) {
	t.Helper()
	for name, want := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{
		"startupProbe":   {c.StartupProbe, "/readyz"},
		"readinessProbe": {c.ReadinessProbe, "/readyz"},
		"livenessProbe":  {c.LivenessProbe, "/healthz"},
	} {
		p := want.probe
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: missing or not httpGet", name)
			continue
		}
		if p.HTTPGet.Path != want.path {
			t.Errorf("%s path %q, want %q", name, p.HTTPGet.Path, want.path)
		}
		if port, err := ContainerPort(c, p.HTTPGet.Port); err != nil || port != httpPort {
			t.Errorf("%s port %s (%d, %v), want the http port %d", name, p.HTTPGet.Port.String(), port, err, httpPort)
		}
		if p.HTTPGet.Host != "" {
			t.Errorf("%s host %q: the kubelet probes the pod IP; set no host", name, p.HTTPGet.Host)
		}
		if p.PeriodSeconds < 1 || p.TimeoutSeconds < 1 || p.FailureThreshold < 1 {
			t.Errorf("%s: periodSeconds %d timeoutSeconds %d failureThreshold %d: set each", name, p.PeriodSeconds, p.TimeoutSeconds, p.FailureThreshold)
		}
	}
	if p := c.StartupProbe; p != nil {
		budget := time.Duration(p.InitialDelaySeconds+p.FailureThreshold*p.PeriodSeconds) * time.Second
		if budget < MinStartupBudget {
			t.Errorf("startupProbe budget %s (failureThreshold × periodSeconds), want at least %s for a full restore", budget, MinStartupBudget)
		}
		t.Logf("startup budget %s", budget)
	}
	if p := c.LivenessProbe; p != nil {
		if d := time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second; d < 20*time.Second {
			t.Errorf("livenessProbe kills after %s: too eager", d)
		}
	}
}

// checkResources: requests and limits for CPU and memory, the memory request
// above the measured peak RSS, GOMEMLIMIT under the memory limit.
func checkResources(t *testing.T, c corev1.Container) {
	t.Helper()
	r := c.Resources
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := r.Requests[name]
		lim, okLim := r.Limits[name]
		if !okReq || !okLim {
			t.Errorf("resources: %s request %v, limit %v; want both", name, okReq, okLim)
			continue
		}
		if req.Cmp(lim) > 0 {
			t.Errorf("resources: %s request %s above its limit %s", name, req.String(), lim.String())
		}
	}
	memLimit := r.Limits[corev1.ResourceMemory]
	if req := r.Requests[corev1.ResourceMemory]; req.Value() < MeasuredPeakRSS/2 {
		t.Errorf("memory request %s far below the measured peak RSS %d MiB", req.String(), MeasuredPeakRSS>>20)
	}
	if memLimit.Value() < MeasuredPeakRSS*2 {
		t.Errorf("memory limit %s: want at least twice the measured peak RSS %d MiB", memLimit.String(), MeasuredPeakRSS>>20)
	}
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		// GOMEMLIMIT's units (B, KiB, MiB, GiB, TiB) less the B are
		// quantities.
		q, err := resource.ParseQuantity(strings.TrimSuffix(e.Value, "B"))
		if err != nil {
			t.Errorf("GOMEMLIMIT %q: %v", e.Value, err)
		} else if q.Cmp(memLimit) >= 0 {
			t.Errorf("GOMEMLIMIT %s is not below the memory limit %s", e.Value, memLimit.String())
		}
	}
}

// checkAntiAffinity: a preferred pod anti-affinity by hostname that selects
// the pods themselves.
func checkAntiAffinity(t *testing.T, a *corev1.Affinity, podLabels labels.Set) {
	t.Helper()
	if a == nil || a.PodAntiAffinity == nil {
		t.Error("no pod anti-affinity")
		return
	}
	for _, term := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		if term.PodAffinityTerm.TopologyKey == "kubernetes.io/hostname" && term.Weight > 0 &&
			selects(t, "anti-affinity", term.PodAffinityTerm.LabelSelector, podLabels) {
			return
		}
	}
	t.Errorf("no preferred pod anti-affinity term by kubernetes.io/hostname selecting the pods: %+v", a.PodAntiAffinity)
}

func selects(t *testing.T, what string, sel *metav1.LabelSelector, set labels.Set) bool {
	t.Helper()
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return false
	}
	return !s.Empty() && s.Matches(set)
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// TestServiceLinksWouldStopTheStart: with the kubelet's Service link
// variables (enableServiceLinks left at its default), salesagg refuses the
// environment: the reason statefulset.yaml disables them.
func TestTLSComponent(t *testing.T) {
	// Scenario: the prod overlay with the tls component: a cert-manager Certificate for the
	// headless Service's names (what the pods advertise and forward to), for server and client
	// use, into the Secret the pods mount; the HTTP TLS keys name its files (serving, client CA,
	// peer certificate and CA); every probe asks over HTTPS.
	root := repoRoot(t)
	out, err := RenderWith(root, "prod", "tls")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Certificates) != 1 {
		t.Fatalf("objects %v: want one Certificate", m.Objects)
	}
	cert := m.Certificates[0]
	if !slices.Contains(cert.Spec.Usages, "server auth") || !slices.Contains(cert.Spec.Usages, "client auth") {
		t.Errorf("Certificate usages %v: the pods serve with it and present it to each other", cert.Spec.Usages)
	}
	if !slices.Contains(cert.Spec.DNSNames, "*.salesagg-headless.default.svc.cluster.local") {
		t.Errorf("Certificate DNS names %v do not cover the pods' application.server names", cert.Spec.DNSNames)
	}
	sts, err := m.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	ps := sts.Spec.Template.Spec
	c := ps.Containers[0]
	mount := ""
	for _, v := range ps.Volumes {
		if v.Secret != nil && v.Secret.SecretName == cert.Spec.SecretName {
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name {
					mount = vm.MountPath
				}
			}
		}
	}
	if mount == "" {
		t.Fatalf("the Certificate's Secret %s is not mounted", cert.Spec.SecretName)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for key, file := range map[string]string{"http.tls.cert.file": "tls.crt", "http.tls.key.file": "tls.key", "http.tls.client.ca.file": "ca.crt",
		"http.tls.peer.cert.file": "tls.crt", "http.tls.peer.key.file": "tls.key", "http.tls.peer.ca.file": "ca.crt"} {
		name := "SALESAGG_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
		if env[name] != filepath.Join(mount, file) {
			t.Errorf("%s = %q, want %s", name, env[name], filepath.Join(mount, file))
		}
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe: %+v, want HTTPS", name, p)
		}
	}
}

// TestServiceLinksAreIgnored: the kubelet's Service-link variables
// (SALESAGG_SERVICE_HOST, SALESAGG_PORT, ...), added when a chart leaves
// enableServiceLinks on, do not stop the start: the configuration a pod gets
// with them is the one it gets without them.
func TestServiceLinksAreIgnored(t *testing.T) {
	m, _, err := Load(repoRoot(t), "prod")
	if err != nil {
		t.Fatal(err)
	}
	sts, err := m.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	off, err := MakePod(m, sts, 0, "default", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want, err := EffectiveConfig(off)
	if err != nil {
		t.Fatal(err)
	}
	on := true
	sts.Spec.Template.Spec.EnableServiceLinks = &on
	pod, err := MakePod(m, sts, 0, "default", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pod.Getenv("SALESAGG_SERVICE_HOST"); !ok {
		t.Fatalf("no SALESAGG_SERVICE_HOST among the Service links: %v", pod.Environ())
	}
	got, err := EffectiveConfig(pod)
	if err != nil {
		t.Fatalf("with Service links the configuration does not load: %v", err)
	}
	if !strings.Contains(strings.Join(got.Notes, "\n"), "SALESAGG_SERVICE_HOST") {
		t.Errorf("no start-up note names the ignored Service links: %q", got.Notes)
	}
	// The state dir is the pod's own temp dir, and the note is the one
	// difference there should be: compare the rest.
	got.StateDir, want.StateDir = "", ""
	got.Notes, want.Notes = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("with Service links the configuration differs:\n got %+v\nwant %+v", got, want)
	}
}

// TestREADMEStatesTheFigures: the README's Kubernetes section names the
// overlays and the bounds the rehearsal asserts.
func TestREADMEStatesTheFigures(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "\n## Kubernetes")
	if i < 0 {
		t.Fatal("README.md has no \"## Kubernetes\" section")
	}
	section := readme[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	for _, want := range []string{
		"kubectl apply -k deploy/k8s/overlays/prod",
		"kubectl apply -k deploy/k8s/overlays/dev",
		"make test-k8s",
		"make test-k8s-rehearsal",
		"leave.group.on.close",
		"publishNotReadyAddresses",
		"enableServiceLinks",
		"Parallel",
		fmt.Sprintf("%g s", MaxUnanswerable.Seconds()),
		fmt.Sprintf("%g s", MaxOwnerAway.Seconds()),
		"with a total number of 0 records",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("the README's Kubernetes section does not mention %q", want)
		}
	}
}
