//go:build cluster

package cluster

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// The cluster's addresses, all in 198.18.0.0/15 (RFC 2544's range for
// testing network devices: no real network uses it), on interfaces and in
// network namespaces the test makes and removes. The host's bridge cpIface
// (no address of the machine's on it) carries the control plane's address
// (the API server, Kafka) and links the nodes: each node is a network
// namespace of its own with a veth to the bridge, its address the Node's
// InternalIP, its pods on a bridge of its own (the CNI bridge plugin's) in
// a subnet of its own, routed between the nodes; the Services' virtual IPs
// (kube-proxy's rules, in each node) are in 198.19.0.0/24.
const (
	cpIface = "sa-cp0"
	cpAddr  = "198.18.0.1"
	// cpPrefix is the length of the prefix the nodes share with cpAddr.
	cpPrefix = "24"
	// podBridge is each node's bridge, in the node's namespace.
	podBridge = "sa-pods0"
	// clusterCIDR holds every node's pod subnet (kube-proxy's clusterCIDR:
	// traffic from elsewhere to a Service is masqueraded).
	clusterCIDR = "198.18.0.0/22"
	svcCIDR     = "198.19.0.0/24"
	kubeSvcIP   = "198.19.0.1"
	dnsSvcIP    = "198.19.0.10"
	// clusterDomain is the kubelet's cluster domain, CoreDNS's zone.
	clusterDomain = "cluster.local"
	// The images the test builds besides the project's.
	corednsRef = "salesagg.test/coredns:1"
	probeRef   = "salesagg.test/probe:1"
)

// node is one of the cluster's nodes: a network namespace of its own,
// linked to the host's bridge cpIface by a veth pair, in which its
// containerd, kubelet and kube-proxy run (the mount and pid namespaces are
// the host's: the test reads the containers' processes and volumes from
// the host). Its fields are set by the test's goroutine: the network ones
// by clusterNetwork, dir and ctrSock by startNode.
type node struct {
	name      string // the Node's name and kubernetes.io/hostname label
	netns     string // its network namespace (ip netns)
	link      string // the host's end of its veth, on cpIface
	addr      string // its address on cpIface's subnet: the InternalIP
	podSubnet string // its pods' addresses
	podGW     string // its bridge's address, the pods' gateway
	dir       string // what its containerd and kubelet write
	ctrSock   string // containerd's socket, once it runs
}

// nodeSpecs are the cluster's two nodes.
var nodeSpecs = []node{
	{name: "node-a", netns: "sa-node-a", link: "sa-node-a", addr: "198.18.0.2", podSubnet: "198.18.1.0/24", podGW: "198.18.1.1"},
	{name: "node-b", netns: "sa-node-b", link: "sa-node-b", addr: "198.18.0.3", podSubnet: "198.18.2.0/24", podGW: "198.18.2.1"},
}

// in is the command line that runs name with args in the node's network
// namespace (nsenter: the network namespace only).
func (n *node) in(name string, args ...string) (string, []string) {
	return "nsenter", append([]string{"--net=/run/netns/" + n.netns, "--", name}, args...)
}

// rules lists the rules of chain in table of the node's iptables.
func (n *node) rules(table, chain string) (string, error) {
	name, args := n.in("iptables", "-t", table, "-S", chain)
	out, _, err := run(10*time.Second, nil, name, args...)
	return out, err
}

// ip runs ip(8) with args.
func ip(args ...string) error {
	_, _, err := run(30*time.Second, nil, "ip", args...)
	return err
}

// clusterNetwork makes the cluster's network and returns its nodes: the
// bridge cpIface with the control plane's address, and for each node a
// network namespace, a veth from it to the bridge with the node's address,
// a default route to the host and routes to the other nodes' pod subnets
// (the host gets a route to each). When the test ends it removes them all,
// the pods' network namespaces containerd left (the containers are killed
// through containerd, not torn down through the CRI) and libcni's cached
// results. What a run that was killed left is removed first.
func clusterNetwork(t *testing.T) []*node {
	for _, need := range []string{"ip", "nsenter", "sysctl"} {
		if _, err := exec.LookPath(need); err != nil {
			t.Fatalf("the cluster's network needs %s (Debian's iproute2, util-linux, procps): %v", need, err)
		}
	}
	nodes := make([]*node, len(nodeSpecs))
	for i := range nodeSpecs {
		n := nodeSpecs[i]
		nodes[i] = &n
	}
	remove := func(logf func(string, ...any)) {
		for _, n := range nodes {
			if _, err := os.Stat("/run/netns/" + n.netns); err == nil {
				if err := ip("netns", "del", n.netns); err != nil {
					logf("removing network namespace %s: %v", n.netns, err)
				}
			}
			if ip("link", "show", n.link) == nil {
				_ = ip("link", "del", n.link)
			}
		}
		if ip("link", "show", cpIface) == nil {
			if err := ip("link", "del", cpIface); err != nil {
				logf("removing %s: %v", cpIface, err)
			}
		}
	}
	remove(t.Logf)
	podNetns := map[string]bool{}
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			podNetns[e.Name()] = true
		}
	}
	t.Cleanup(func() {
		remove(t.Errorf)
		entries, _ := os.ReadDir("/run/netns")
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "cni-") && !podNetns[e.Name()] {
				if err := ip("netns", "del", e.Name()); err != nil {
					t.Logf("removing a pod's network namespace %s: %v", e.Name(), err)
				}
			}
		}
		// libcni's cache of each pod's network result (containerd gives no
		// other place for it).
		for _, g := range []string{"salesagg-pods-*", "cni-loopback-*"} {
			results, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", g))
			for _, r := range results {
				_ = os.Remove(r)
			}
		}
	})
	steps := [][]string{
		{"link", "add", cpIface, "type", "bridge"},
		{"addr", "add", cpAddr + "/" + cpPrefix, "dev", cpIface},
		{"link", "set", cpIface, "up"},
	}
	for _, n := range nodes {
		steps = append(steps,
			[]string{"netns", "add", n.netns},
			[]string{"link", "add", n.link, "type", "veth", "peer", "name", "eth0", "netns", n.netns},
			[]string{"link", "set", n.link, "master", cpIface},
			[]string{"link", "set", n.link, "up"},
			[]string{"-n", n.netns, "link", "set", "lo", "up"},
			[]string{"-n", n.netns, "addr", "add", n.addr + "/" + cpPrefix, "dev", "eth0"},
			[]string{"-n", n.netns, "link", "set", "eth0", "up"},
			[]string{"-n", n.netns, "route", "add", "default", "via", cpAddr},
			[]string{"route", "add", n.podSubnet, "via", n.addr},
		)
		for _, m := range nodes {
			if m != n {
				steps = append(steps, []string{"-n", n.netns, "route", "add", m.podSubnet, "via", m.addr})
			}
		}
	}
	for _, args := range steps {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		// The node routes its pods' packets (the bridge plugin would too,
		// when its first pod starts).
		name, args := n.in("sysctl", "-qw", "net.ipv4.ip_forward=1")
		if _, _, err := run(10*time.Second, nil, name, args...); err != nil {
			t.Fatal(err)
		}
		t.Logf("node %s: network namespace %s, %s on eth0 (%s on %s), pods on %s (%s)", n.name, n.netns, n.addr, n.link, cpIface, podBridge, n.podSubnet)
	}
	t.Logf("the control plane's address %s on %s; Services in %s", cpAddr, cpIface, svcCIDR)
	return nodes
}

// cniConfig is the node's pod network: the bridge plugin (the bridge,
// a veth per pod, the gateway address, IP forwarding) with host-local
// addresses from the node's pod subnet, and portmap for hostPorts.
func (n *node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "salesagg-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podBridge, n.podSubnet, n.podGW, filepath.Join(n.dir, "cni-ipam"))
}

// startKubeProxy runs kube-proxy in iptables mode in each node's network
// namespace: the Services' virtual IPs in the node's iptables (removed with
// the namespace). It touches no sysctl (conntrack sizes and timeouts left
// as they are, no localhost NodePorts).
func (c *cluster) startKubeProxy() error {
	t := c.t
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		return fmt.Errorf("kube-proxy needs iptables (Debian's iptables): %w", err)
	}
	for _, n := range c.nodes {
		cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: iptables
hostnameOverride: %s
clusterCIDR: %s
nodePortAddresses: ["%s/32"]
healthzBindAddress: 127.0.0.1:%s
metricsBindAddress: 127.0.0.1:%s
iptables:
  localhostNodePorts: false
  syncPeriod: 30s
  minSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, filepath.Join(c.dir, "kube-proxy.kubeconfig"), n.name, clusterCIDR, n.addr, port(t), port(t))
		path := filepath.Join(n.dir, "kube-proxy.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			return err
		}
		p := c.startIn(n, "kube-proxy", "--config", path, "--v=1")
		if err := harness.Poll(time.Minute, func() error {
			if err := p.Exited(); err != nil {
				return fmt.Errorf("%w: %w", harness.ErrGiveUp, err)
			}
			out, err := n.rules("nat", "KUBE-SERVICES")
			if err != nil {
				return err
			}
			if !strings.Contains(out, kubeSvcIP+"/32") {
				return fmt.Errorf("no rule for the kubernetes Service (%s) in node %s yet", kubeSvcIP, n.name)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	return nil
}

// deployCoreDNS runs CoreDNS (built from source, image corednsRef) in
// kube-system with the kubernetes plugin serving clusterDomain, behind the
// Service kube-dns at dnsSvcIP, and waits for it to be ready.
func (c *cluster) deployCoreDNS() {
	t := c.t
	manifest := fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: system:coredns}
rules:
  - apiGroups: [""]
    resources: [services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects:
  - {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:1053 {
        errors
        health :8080
        ready :8181
        kubernetes %[1]s in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 5
        }
        cache 5
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: coredns
          image: %[2]s
          imagePullPolicy: Never
          args: ["-conf", "/etc/coredns/Corefile"]
          ports:
            - {name: dns, containerPort: 1053, protocol: UDP}
            - {name: dns-tcp, containerPort: 1053, protocol: TCP}
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
            periodSeconds: 2
          livenessProbe:
            httpGet: {path: /health, port: 8080}
            periodSeconds: 10
          securityContext:
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities: {drop: [ALL]}
          volumeMounts:
            - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
        - name: config
          configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: %[3]s
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
    - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
`, clusterDomain, corednsRef, dnsSvcIP)
	path := filepath.Join(c.dir, "coredns.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.mustKubectl("apply", "--server-side", "-f", path)
	c.mustKubectl("rollout", "status", "deployment/coredns", "-n", "kube-system", "--timeout=3m")
	t.Logf("CoreDNS ready at %s after %s", dnsSvcIP, time.Since(start).Round(100*time.Millisecond))
}

// probeNS is the namespace of the probe pod: another namespace than the
// service's, labelled as a client the service's NetworkPolicy admits.
// monitoringNS is where Prometheus runs, as the NetworkPolicy expects.
const (
	probeNS      = "salesagg-client"
	monitoringNS = "monitoring"
)

// startProbe runs the probe pod (image probeRef) in probeNS and waits for it.
func (c *cluster) startProbe() {
	c.startProbeIn(probeNS, map[string]string{"salesagg.io/client": "true"})
}

// startProbeIn runs a probe pod in namespace ns (made with labels) and
// waits for it.
func (c *cluster) startProbeIn(ns string, labels map[string]string) {
	var l strings.Builder
	for k, v := range labels {
		fmt.Fprintf(&l, "\n    %s: %q", k, v)
	}
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
  labels: {}%[3]s
---
apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: %[1]s}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: probe
      image: %[2]s
      imagePullPolicy: Never
      securityContext:
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
`, ns, probeRef, l.String())
	if len(labels) > 0 {
		manifest = strings.Replace(manifest, "labels: {}", "labels:", 1)
	}
	path := filepath.Join(c.dir, "probe-"+ns+".yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.mustKubectl("apply", "--server-side", "-f", path)
	c.mustKubectl("wait", "pod/probe", "-n", ns, "--for=condition=Ready", "--timeout=2m")
}

// probe runs the probe command in the probe pod of probeNS.
func (c *cluster) probe(args ...string) (map[string]string, error) {
	return c.probeIn(probeNS, args...)
}

// probeIn runs the probe command in the probe pod of namespace ns (kubectl
// exec) and returns its output lines as "first word → rest".
func (c *cluster) probeIn(ns string, args ...string) (map[string]string, error) {
	out, errOut, err := run(time.Minute, []string{"KUBECONFIG=" + c.admin}, filepath.Join(c.bin, "kubectl"),
		append([]string{"exec", "-n", ns, "probe", "--", "/probe"}, args...)...)
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			m[k] = v
		}
	}
	if err != nil {
		return m, fmt.Errorf("%w\n%s%s", err, out, errOut)
	}
	return m, nil
}

// podNetwork: the prod overlay as shipped, three replicas on the pod
// network. Its bootstrap.servers, kafka-bootstrap.kafka.svc.cluster.local:9092,
// is a Service without selector whose EndpointSlice is the test's Kafka;
// its claims (10Gi) bind local volumes of that size. Every pod gets an
// address of the pod network and a DNS name of the headless Service,
// advertised as its application.server; from a pod in another namespace
// every product's total is exact through the Service and from each pod
// (which gathers from the others, pod to pod).
func podNetwork(t *testing.T, c *cluster, root, kafka string) {
	_, kport, ok := strings.Cut(kafka, ":")
	if !ok || strings.Contains(kafka, ",") {
		t.Fatalf("Kafka at %q: want one host:port", kafka)
	}
	bootstrap := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: kafka}
---
apiVersion: v1
kind: Service
metadata: {name: kafka-bootstrap, namespace: kafka}
spec:
  ports:
    - {name: kafka, port: 9092, targetPort: %[1]s, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kafka-bootstrap-1
  namespace: kafka
  labels: {kubernetes.io/service-name: kafka-bootstrap}
addressType: IPv4
ports:
  - {name: kafka, port: %[1]s, protocol: TCP}
endpoints:
  - addresses: [%[2]q]
`, kport, cpAddr)
	path := filepath.Join(c.dir, "kafka-bootstrap.yaml")
	if err := os.WriteFile(path, []byte(bootstrap), 0o644); err != nil {
		t.Fatal(err)
	}
	c.mustKubectl("apply", "--server-side", "-f", path)
	// Two volumes on each node: the scheduler may put the replicas on
	// either, and their anti-affinity spreads them over both.
	var nodeNames []string
	for _, n := range c.nodes {
		nodeNames = append(nodeNames, n.name)
	}
	prodPVs := localVolumes(t, c, filepath.Join(c.dir, "pv-prod"), "local-prod", 2*len(c.nodes), "10Gi", nodeNames...)
	// The prod overlay creates its internal topics, not its input topic
	// (topics.input.create is false): the operator makes it, with the
	// partitions the replicas need.
	cl := harness.NewClient(t, kafka)
	harness.CreateTopic(t, kafka, inputTopic, 3, nil)

	// The first subtest's namespace is gone before this one is made again.
	harness.WaitFor(t, 3*time.Minute, "namespace "+prodNS+" of the first subtest to be gone", func() error {
		var ns map[string]any
		if err := c.get("/api/v1/namespaces/"+prodNS, &ns); err == nil {
			return fmt.Errorf("still there")
		} else if !strings.Contains(err.Error(), "404") {
			return err
		}
		return nil
	})
	c.mustKubectl("apply", "--server-side", "-f", filepath.Join(c.dir, "prod-namespace.yaml"))
	// Whatever happens here, the namespace goes: its pods must not stay in
	// the group of the overlay the next test runs. On a failure, what the
	// pods and their logs say first.
	t.Cleanup(func() {
		if t.Failed() {
			_, _, _ = c.kubectl("get", "pods,endpointslices", "-A", "-o", "wide")
			_, _, _ = c.kubectl("describe", "pods", "-n", prodNS)
			for i := range 3 {
				_, _, _ = c.kubectl("logs", fmt.Sprintf("salesagg-%d", i), "-n", prodNS, "--tail=40")
			}
			_, _, _ = c.kubectl("logs", "-n", "kube-system", "deployment/coredns", "--tail=40")
		}
		_, _, _ = c.kubectl("delete", "namespace", prodNS, "--wait=true", "--timeout=3m")
		// The volumes go too: one the replicas left unbound would take the
		// next overlay's claim.
		_, _, _ = c.kubectl(append([]string{"delete", "pv", "--wait=false"}, slices.Sorted(maps.Keys(prodPVs))...)...)
	})
	c.mustKubectl("apply", "--server-side", "-n", prodNS, "-k", filepath.Join(root, "deploy", "k8s", "overlays", "prod"))
	c.mustKubectl("rollout", "status", "statefulset/salesagg", "-n", prodNS, "--timeout=5m")
	c.mustKubectl("get", "pods,svc,endpointslices,pvc", "-n", prodNS, "-o", "wide")

	var pods struct {
		Items []struct {
			Metadata struct {
				Name        string
				Annotations map[string]string
			}
			Spec struct {
				HostNetwork bool
				NodeName    string
			}
			Status struct{ PodIP string }
		}
	}
	if err := c.get("/api/v1/namespaces/"+prodNS+"/pods", &pods); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 3 {
		t.Fatalf("%d pods in %s, want 3", len(pods.Items), prodNS)
	}
	podIP := map[string]string{}
	onNode := map[string][]string{}
	for _, p := range pods.Items {
		var subnet string
		for _, n := range c.nodes {
			if n.name == p.Spec.NodeName {
				subnet = n.podSubnet
			}
		}
		if p.Spec.HostNetwork || !inSubnet(p.Status.PodIP, subnet) {
			t.Errorf("%s on node %s: host network %v, pod IP %q; want an address of the node's pod subnet %s", p.Metadata.Name, p.Spec.NodeName, p.Spec.HostNetwork, p.Status.PodIP, subnet)
		}
		podIP[p.Metadata.Name] = p.Status.PodIP
		onNode[p.Spec.NodeName] = append(onNode[p.Spec.NodeName], p.Metadata.Name)
	}
	if len(onNode) != len(c.nodes) {
		t.Errorf("the pods by node: %v; want the replicas on each of the %d nodes (the StatefulSet's anti-affinity)", onNode, len(c.nodes))
	}
	t.Logf("the pods by node: %v", onNode)
	var svc struct{ Spec struct{ ClusterIP string } }
	if err := c.get("/api/v1/namespaces/"+prodNS+"/services/salesagg", &svc); err != nil {
		t.Fatal(err)
	}

	// Names, from the probe pod's resolver (CoreDNS).
	service := "salesagg." + prodNS + ".svc." + clusterDomain
	names := []string{service}
	for i := range 3 {
		names = append(names, fmt.Sprintf("salesagg-%d.salesagg-headless.%s.svc.%s", i, prodNS, clusterDomain))
	}
	got, err := c.probe(append([]string{"resolve"}, names...)...)
	if err != nil {
		t.Fatalf("resolving from the probe pod: %v", err)
	}
	if got[service] != svc.Spec.ClusterIP {
		t.Errorf("%s resolves to %q, want the Service's cluster IP %s", service, got[service], svc.Spec.ClusterIP)
	}
	for i, n := range names[1:] {
		if want := podIP[fmt.Sprintf("salesagg-%d", i)]; got[n] != want {
			t.Errorf("%s resolves to %q, want the pod's IP %s", n, got[n], want)
		}
	}
	t.Logf("from the probe pod: %v", got)

	// The NetworkPolicy, enforced: a pod of a namespace it does not admit
	// gets no answer. Everything below runs under it: the clients' and
	// Prometheus' namespaces are admitted, the pods reach each other, and
	// the kubelet's probes (from the node) pass.
	c.policyEnforced(t, service, podIP)

	// The group: each pod advertises its DNS name.
	members, err := c.probe("get", "http://"+service+":8080/v1/instances")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names[1:] {
		if !strings.Contains(members["http://"+service+":8080/v1/instances"], `"server":"`+n+`:8080"`) {
			t.Errorf("/v1/instances does not name %s:8080: %s", n, members["http://"+service+":8080/v1/instances"])
		}
	}

	// Totals: through the Service and from each pod, from the probe pod.
	rng := rand.New(rand.NewPCG(3, 4))
	evs := harness.GenEvents(rng, "q", 60, 3000)
	harness.Produce(t, cl, harness.Records(inputTopic, evs)...)
	want := harness.TotalsOf(evs)
	urls := []string{"http://" + service + ":8080/v1/products?limit=1000"}
	for _, n := range names[1:] {
		urls = append(urls, "http://"+n+":8080/v1/products?limit=1000")
	}
	harness.WaitFor(t, 3*time.Minute, "every total exact through the Service and from each pod", func() error {
		return c.checkTotals(urls, want)
	})
	t.Logf("%d events, %d products: every total exact through the Service and from each of the 3 pods", len(evs), len(want))

	// Prometheus' way in: from a pod of the namespace monitoring, each
	// pod's metrics at the address its annotations give (kubernetes_sd,
	// role pod). Every pod is ready, and together they folded every event.
	c.startProbeIn(monitoringNS, nil)
	var targets []string
	for _, p := range pods.Items {
		a := p.Metadata.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] == "" || a["prometheus.io/path"] == "" {
			t.Fatalf("%s: annotations %v, want prometheus.io/scrape, port and path", p.Metadata.Name, a)
		}
		targets = append(targets, "http://"+p.Status.PodIP+":"+a["prometheus.io/port"]+a["prometheus.io/path"])
	}
	scrapes, err := c.probeIn(monitoringNS, append([]string{"get"}, targets...)...)
	if err != nil {
		t.Fatalf("scraping from namespace %s: %v", monitoringNS, err)
	}
	var processed float64
	for _, u := range targets {
		code, body, _ := strings.Cut(scrapes[u], " ")
		// The probe puts the body on one line: "name{labels} value name …".
		f := strings.Fields(body)
		ready := false
		for i := 0; i+1 < len(f); i++ {
			switch {
			case f[i] == "salesagg_ready" && f[i+1] == "1":
				ready = true
			case strings.HasPrefix(f[i], "salesagg_events_processed_total{"):
				v, err := strconv.ParseFloat(f[i+1], 64)
				if err == nil {
					processed += v
				}
			}
		}
		if code != "200" || !ready {
			t.Errorf("scrape of %s: HTTP %s, salesagg_ready 1: %v", u, code, ready)
		}
	}
	if processed < float64(len(evs)) {
		t.Errorf("the scrapes count %.0f events processed over the 3 pods, want at least the %d produced", processed, len(evs))
	}
	t.Logf("scraped %d pods from namespace %s: all ready, %.0f events processed", len(targets), monitoringNS, processed)

	pr := &prodRun{c: c, root: root, service: urls[0], urls: urls, want: want}
	t.Run("RollingUpdateWithAConfigChange", func(t *testing.T) { c.t = t; pr.rollingUpdate(t) })
	t.Run("DrainUnderThePDB", func(t *testing.T) { c.t = t; pr.drain(t) })
	t.Run("LivenessKill", func(t *testing.T) { c.t = t; pr.livenessKill(t) })
	c.t = t
}

// checkTotals asks each of urls (GET /v1/products, from the probe pod) and
// is nil when each answers every product of want with its total and no
// task unavailable.
func (c *cluster) checkTotals(urls []string, want map[string]int64) error {
	pages, err := c.probe(append([]string{"get"}, urls...)...)
	if err != nil {
		return err
	}
	var diffs []string
	for _, u := range urls {
		code, body, _ := strings.Cut(pages[u], " ")
		var page struct {
			Products []struct {
				Product string
				Total   int64
			}
			Unavailable []string `json:"unavailable_tasks"`
		}
		if code != "200" || json.Unmarshal([]byte(body), &page) != nil {
			diffs = append(diffs, fmt.Sprintf("%s: %s", u, pages[u]))
			continue
		}
		totals := map[string]int64{}
		for _, p := range page.Products {
			totals[p.Product] = p.Total
		}
		if !maps.Equal(totals, want) || len(page.Unavailable) > 0 {
			diffs = append(diffs, fmt.Sprintf("%s: %d products (want %d), unavailable %v", u, len(totals), len(want), page.Unavailable))
		}
	}
	return harness.Summarize(diffs)
}

// inSubnet reports whether the address addr is in the CIDR subnet.
func inSubnet(addr, subnet string) bool {
	_, n, err := net.ParseCIDR(subnet)
	a := net.ParseIP(addr)
	return err == nil && a != nil && n.Contains(a)
}
