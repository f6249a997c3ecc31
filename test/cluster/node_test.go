//go:build cluster

package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// cluster is the control plane and the nodes the test runs. The test's
// goroutine owns it (t is the running subtest's).
type cluster struct {
	t      *testing.T
	bin    string // the binaries (cache dir)
	dir    string // everything the cluster writes
	pki    *PKI
	server string // https://cpAddr:PORT
	admin  string // the admin kubeconfig
	api    *http.Client
	procs  map[string]*harness.Proc
	nodes  []*node
}

// run runs a command with a time bound and returns stdout, stderr.
func run(timeout time.Duration, env []string, name string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no end within %s", timeout)
		}
		err = fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, harness.LastLine(stderr.String()+"\n"+stdout.String()))
	}
	return stdout.String(), stderr.String(), err
}

// kubectl runs kubectl as the admin; the command and its output go to the
// test log unless quiet.
func (c *cluster) kubectl(args ...string) (string, string, error) {
	c.t.Helper()
	out, errOut, err := run(6*time.Minute, []string{"KUBECONFIG=" + c.admin}, filepath.Join(c.bin, "kubectl"), args...)
	c.t.Logf("$ kubectl %s\n%s%s", strings.Join(args, " "), out, errOut)
	return out, errOut, err
}

func (c *cluster) mustKubectl(args ...string) string {
	c.t.Helper()
	out, _, err := c.kubectl(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// get reads an API object (path under the server, e.g.
// /api/v1/namespaces/x/pods/y) into v; the error of a 404 says so.
func (c *cluster) get(path string, v any) error {
	resp, err := c.api.Get(c.server + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(b.String()))
	}
	return json.Unmarshal(b.Bytes(), v)
}

// start runs a component in a process group of its own (stopped with it
// when the test ends), logging to <dir>/logs/<name>.log.
func (c *cluster) start(name string, args ...string) *harness.Proc {
	c.t.Helper()
	p := harness.Start(c.t, harness.Spec{Name: filepath.Base(name), Path: c.binPath(name), Args: args, Job: true})
	c.procs[filepath.Base(name)] = p
	return p
}

// binPath is the command name: the binaries' one when the cache holds it,
// else name itself (an absolute path, or one looked up in $PATH).
func (c *cluster) binPath(name string) string {
	if !filepath.IsAbs(name) {
		if _, err := os.Stat(filepath.Join(c.bin, name)); err == nil {
			return filepath.Join(c.bin, name)
		}
	}
	return name
}

// startIn runs a component as start does, in node n's network namespace;
// its name (and log) is <name>-<node>.
func (c *cluster) startIn(n *node, name string, args ...string) *harness.Proc {
	c.t.Helper()
	nsenter, nargs := n.in(c.binPath(name), args...)
	key := filepath.Base(name) + "-" + n.name
	p := harness.Start(c.t, harness.Spec{Name: key, Path: nsenter, Args: nargs, Job: true})
	c.procs[key] = p
	return p
}

// alive is nil while the components run.
func (c *cluster) alive() error {
	for _, p := range c.procs {
		if err := p.Exited(); err != nil {
			return fmt.Errorf("%w\n%s", err, p.Tail(15))
		}
	}
	return nil
}

func port(t *testing.T) string {
	_, p, _ := strings.Cut(harness.FreeAddr(t), ":")
	return p
}

// startControlPlane makes the certificates and starts etcd, the API server,
// the controller manager and the scheduler, and waits for the API server.
func startControlPlane(t *testing.T, bin, dir string, nodes []*node) *cluster {
	c := &cluster{t: t, bin: bin, dir: dir, procs: map[string]*harness.Proc{}, nodes: nodes}
	pki, err := NewPKI(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	c.pki = pki
	svcIP := kubeSvcIP
	type certSpec struct {
		name, cn string
		orgs     []string
		hosts    []string
	}
	issue := []certSpec{
		{"etcd", "etcd", nil, []string{"127.0.0.1", "localhost"}},
		{"apiserver-etcd-client", "kube-apiserver-etcd-client", nil, nil},
		{"apiserver", "kube-apiserver", nil, []string{"127.0.0.1", "localhost", cpAddr, svcIP, "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil},
		{"admin", "admin", []string{"system:masters"}, nil},
		{"controller-manager", "system:kube-controller-manager", nil, []string{"127.0.0.1", "localhost"}},
		{"scheduler", "system:kube-scheduler", nil, []string{"127.0.0.1", "localhost"}},
		{"kube-proxy", "system:kube-proxy", nil, nil},
		{"kube-router", "system:kube-router", nil, nil},
	}
	// Each node's kubelet: its client identity (the Node authorizer and
	// NodeRestriction admit it to its own Node and pods only) and its
	// serving certificate, for the API server's calls at its address.
	for _, n := range nodes {
		issue = append(issue,
			certSpec{"kubelet-" + n.name, "system:node:" + n.name, []string{"system:nodes"}, nil},
			certSpec{"kubelet-serving-" + n.name, "system:node:" + n.name, []string{"system:nodes"}, []string{n.addr, n.name}})
	}
	for _, i := range issue {
		if err := pki.Issue(i.name, i.cn, i.orgs, i.hosts...); err != nil {
			t.Fatal(err)
		}
	}
	saPub, saKey, err := pki.KeyPair("service-account")
	if err != nil {
		t.Fatal(err)
	}
	cert := func(n string) (string, string) { return pki.Cert(n) }

	etcdClient, etcdPeer := port(t), port(t)
	ec, ek := cert("etcd")
	c.start("etcd", "--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "https://127.0.0.1:"+etcdClient, "--advertise-client-urls", "https://127.0.0.1:"+etcdClient,
		"--listen-peer-urls", "http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls", "http://127.0.0.1:"+etcdPeer,
		"--initial-cluster", "default=http://127.0.0.1:"+etcdPeer,
		"--cert-file", ec, "--key-file", ek, "--trusted-ca-file", pki.CA(), "--client-cert-auth",
		"--log-level", "warn", "--unsafe-no-fsync")

	apiPort := port(t)
	c.server = "https://" + cpAddr + ":" + apiPort
	ac, ak := cert("apiserver")
	eccl, eckl := cert("apiserver-etcd-client")
	kc, kk := cert("apiserver-kubelet-client")
	c.start("kube-apiserver",
		// On the control plane's address, which pods reach: the
		// "kubernetes" Service's endpoint (CoreDNS's way to the API).
		"--bind-address", cpAddr, "--secure-port", apiPort, "--advertise-address", cpAddr,
		"--etcd-servers", "https://127.0.0.1:"+etcdClient, "--etcd-cafile", pki.CA(), "--etcd-certfile", eccl, "--etcd-keyfile", eckl,
		"--tls-cert-file", ac, "--tls-private-key-file", ak, "--client-ca-file", pki.CA(),
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", svcCIDR,
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--kubelet-client-certificate", kc, "--kubelet-client-key", kk, "--kubelet-certificate-authority", pki.CA(),
		// The API server reaches each kubelet (logs, exec) at its node's
		// address, in the node's network namespace.
		"--kubelet-preferred-address-types", "InternalIP",
		"--profiling=false", "--v=1")

	c.admin = filepath.Join(dir, "admin.kubeconfig")
	kubeconfigs := []string{"admin", "controller-manager", "scheduler", "kube-proxy", "kube-router"}
	for _, n := range nodes {
		kubeconfigs = append(kubeconfigs, "kubelet-"+n.name)
	}
	for _, n := range kubeconfigs {
		if err := pki.Kubeconfig(filepath.Join(dir, n+".kubeconfig"), c.server, n); err != nil {
			t.Fatal(err)
		}
	}
	admC, admK := cert("admin")
	pair, err := tls.LoadX509KeyPair(admC, admK)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(pki.CA())
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	c.api = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}

	start := time.Now()
	harness.WaitFor(t, 3*time.Minute, "the API server to be ready (/readyz)", func() error {
		if err := c.alive(); err != nil {
			return fmt.Errorf("%w: %w", harness.ErrGiveUp, err)
		}
		resp, err := c.api.Get(c.server + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	t.Logf("etcd and kube-apiserver ready at %s after %s", c.server, time.Since(start).Round(10*time.Millisecond))

	cmc, cmk := cert("controller-manager")
	kcm := filepath.Join(dir, "controller-manager.kubeconfig")
	c.start("kube-controller-manager", "--kubeconfig", kcm,
		"--authentication-kubeconfig", kcm, "--authorization-kubeconfig", kcm,
		"--bind-address", "127.0.0.1", "--secure-port", port(t), "--tls-cert-file", cmc, "--tls-private-key-file", cmk,
		"--leader-elect=false", "--use-service-account-credentials",
		"--service-account-private-key-file", saKey, "--root-ca-file", pki.CA(),
		"--profiling=false", "--v=1")
	sc, sk := cert("scheduler")
	ks := filepath.Join(dir, "scheduler.kubeconfig")
	c.start("kube-scheduler", "--kubeconfig", ks,
		"--authentication-kubeconfig", ks, "--authorization-kubeconfig", ks,
		"--bind-address", "127.0.0.1", "--secure-port", port(t), "--tls-cert-file", sc, "--tls-private-key-file", sk,
		"--leader-elect=false", "--profiling=false", "--v=1")
	// The controller manager runs once the service account controller has
	// made the default namespace's service account.
	harness.WaitFor(t, 2*time.Minute, "the controller manager (the default service account)", func() error {
		if err := c.alive(); err != nil {
			return fmt.Errorf("%w: %w", harness.ErrGiveUp, err)
		}
		var sa map[string]any
		return c.get("/api/v1/namespaces/default/serviceaccounts/default", &sa)
	})
	t.Logf("control plane up after %s", time.Since(start).Round(10*time.Millisecond))
	return c
}

// startNode starts node n's containerd and kubelet in its network
// namespace, imports the images into its containerd and waits for the Node
// to be Ready. An error says which part could not run on this machine and
// why; the caller skips what needs the nodes.
func (c *cluster) startNode(n *node, images []string) error {
	t := c.t
	dir := n.dir
	for _, need := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr"} {
		if _, err := exec.LookPath(need); err != nil {
			return fmt.Errorf("%s is not installed (apt-get install docker.io brings containerd and runc): %w", need, err)
		}
	}
	ctrDir := filepath.Join(dir, "containerd")
	cniConf := filepath.Join(ctrDir, "cni")
	for _, d := range []string{ctrDir, cniConf, filepath.Join(dir, "pod-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	n.ctrSock = filepath.Join(ctrDir, "c.sock")
	// Teardown, last of all (registered before containerd starts, so it
	// runs after containerd stopped): the shims left, the mounts under the
	// test's dir, the pod cgroups.
	t.Cleanup(func() { c.teardownNode(n) })
	// The kubelet's cgroup root, its own (the two kubelets share the
	// machine's hierarchies): it must exist before the kubelet starts.
	if err := makeCgroupRoot(n.cgroupRoot()); err != nil {
		return err
	}

	// CNI: the pod network (cniConfig), with the reference plugins built
	// from source into the binaries' dir.
	if err := os.WriteFile(filepath.Join(cniConf, "10-salesagg-pods.conflist"), []byte(n.cniConfig()), 0o644); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Without CAP_SYS_RESOURCE (as on this machine) no process may lower its
  # oom_score_adj: runc fails the sandbox the kubelet asks for at -998
  # ("can't get final child's PID from pipe: EOF"). Restricted, a score is
  # never below containerd's own.
  restrict_oom_score_adj = %[8]t
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[9]q
    conf_dir = %[7]q
`, filepath.Join(ctrDir, "root"), filepath.Join(ctrDir, "state"), n.ctrSock, n.ctrSock+".ttrpc",
		filepath.Join(ctrDir, "opt"), pauseRef, cniConf, !hasCapability(capSysResource), c.bin)
	cfgPath := filepath.Join(ctrDir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	containerd, _ := exec.LookPath("containerd")
	ctrd := c.startIn(n, containerd, "--config", cfgPath)
	if err := harness.Poll(time.Minute, func() error {
		if err := ctrd.Exited(); err != nil {
			return err
		}
		_, _, err := n.ctr("version")
		return err
	}); err != nil {
		return fmt.Errorf("containerd did not start: %w\n%s", err, ctrd.Tail(20))
	}
	// Registered after containerd, so run before it stops: the pods'
	// containers and sandboxes, killed and removed.
	t.Cleanup(func() { n.removeContainers() })
	v, _, _ := n.ctr("version")
	t.Logf("node %s: containerd up (%s)", n.name, strings.Join(strings.Fields(v), " "))
	for _, img := range images {
		start := time.Now()
		if _, _, err := n.ctr("images", "import", "--snapshotter", "overlayfs", img); err != nil {
			return fmt.Errorf("importing %s into containerd: %w", filepath.Base(img), err)
		}
		t.Logf("imported %s into containerd in %s", filepath.Base(img), time.Since(start).Round(time.Millisecond))
	}
	out, _, _ := n.ctr("images", "ls", "-q")
	t.Logf("containerd images (namespace k8s.io):\n%s", out)

	kubeletPort, healthz := port(t), port(t)
	kcrt, kkey := c.pki.Cert("kubelet-serving-" + n.name)
	kcfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %s
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://%s
# This machine's cgroups are v1; kubelets refuse them unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
failSwapOn: false
podLogsDir: %s
staticPodPath: ""
serializeImagePulls: false
# No image is ever pulled (no registry): none is collected either.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
registerNode: true
# The pods' resolver: CoreDNS behind the kube-dns Service; no host resolver
# behind it (nothing outside the cluster is looked up).
clusterDNS: [%s]
clusterDomain: %s
resolvConf: ""
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
`, n.addr, kubeletPort, healthz, kcrt, kkey, c.pki.CA(), n.ctrSock, n.cgroupRoot(), filepath.Join(dir, "pod-logs"), dnsSvcIP, clusterDomain)
	kcfgPath := filepath.Join(dir, "kubelet.yaml")
	if err := os.WriteFile(kcfgPath, []byte(kcfg), 0o644); err != nil {
		return err
	}
	kubelet := c.startIn(n, "kubelet", "--config", kcfgPath, "--kubeconfig", filepath.Join(c.dir, "kubelet-"+n.name+".kubeconfig"),
		"--root-dir", filepath.Join(dir, "kubelet"), "--hostname-override", n.name, "--node-ip", n.addr, "--v=1")
	var last string
	err := harness.Poll(3*time.Minute, func() error {
		if err := kubelet.Exited(); err != nil {
			return err
		}
		var node struct {
			Status struct {
				Conditions []struct{ Type, Status, Reason, Message string }
			}
		}
		if err := c.get("/api/v1/nodes/"+n.name, &node); err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == "Ready" {
				last = cond.Reason + ": " + cond.Message
				if cond.Status == "True" {
					return nil
				}
			}
		}
		return fmt.Errorf("node %s not ready: %s", n.name, last)
	})
	if err != nil {
		return fmt.Errorf("node %s did not turn Ready: %w\nkubelet log:\n%s", n.name, err, kubeletErrors(kubelet))
	}
	return nil
}

const capSysResource = 24

// hasCapability reports whether this process has the capability (bit) in
// its effective set.
func hasCapability(bit uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<bit) != 0
		}
	}
	return false
}

// kubeletErrors is the kubelet log's error lines (klog "E...."), at most 20.
func kubeletErrors(p *harness.Proc) string {
	var errs []string
	for _, l := range p.StderrLines() {
		if strings.HasPrefix(l, "E") || strings.Contains(l, "error") {
			errs = append(errs, l)
		}
	}
	if len(errs) > 20 {
		errs = errs[len(errs)-20:]
	}
	if len(errs) == 0 {
		return p.Tail(20)
	}
	return strings.Join(errs, "\n")
}

// ctr runs the node's containerd client on the namespace the CRI uses.
func (n *node) ctr(args ...string) (string, string, error) {
	return run(5*time.Minute, nil, "ctr", append([]string{"--address", n.ctrSock, "--namespace", "k8s.io"}, args...)...)
}

// containerPID is the host pid of the process of the pod's (first)
// container.
func (c *cluster) containerPID(p pod) (int, error) {
	if len(p.Status.ContainerStatuses) == 0 {
		return 0, fmt.Errorf("pod %s has no container status", p.Metadata.Name)
	}
	return c.taskPID(strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://"))
}

// stopContainer stops the process of the pod's container with SIGSTOP (it
// answers no probe from then on) and returns its pid.
func (c *cluster) stopContainer(t *testing.T, p pod) int {
	t.Helper()
	pid, err := c.containerPID(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	return pid
}

// taskPID is the host pid of a container's process (its id is the CRI's),
// on whichever node runs it.
func (c *cluster) taskPID(id string) (int, error) {
	for _, n := range c.nodes {
		if n.ctrSock == "" {
			continue
		}
		out, _, err := n.ctr("tasks", "ls")
		if err != nil {
			return 0, err
		}
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) >= 3 && f[0] == id {
				return strconv.Atoi(f[1])
			}
		}
	}
	return 0, fmt.Errorf("no task %s in the nodes' containerd", id)
}

// removeContainers kills every container's task and removes the
// containers, while the node's containerd runs.
func (n *node) removeContainers() {
	out, _, err := n.ctr("containers", "ls", "-q")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		_, _, _ = n.ctr("tasks", "kill", "-s", "SIGKILL", id)
		_ = harness.Poll(10*time.Second, func() error {
			_, _, err := n.ctr("tasks", "delete", id)
			if err != nil && strings.Contains(err.Error(), "not found") {
				return nil
			}
			return err
		})
		_, _, _ = n.ctr("containers", "delete", id)
	}
}

// teardownNode ends the shims of the node's containerd still running,
// unmounts everything mounted under the node's dir (the kubelet's volumes,
// containerd's snapshots and sandboxes' shm) and removes the cgroups the
// kubelet made and its cgroup root.
func (c *cluster) teardownNode(n *node) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], "containerd-shim-runc-v2") && slices.Contains(args, n.ctrSock) {
			c.t.Logf("killing containerd shim %d of node %s left running", pid, n.name)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	unmountUnder(c.t, n.dir)
	removeCgroups(c.t, n.cgroupRoot())
}

// cgroupRoot is the node's kubelet's cgroup root (cgroupfs driver): its
// pods are under <root>/kubepods in every hierarchy.
func (n *node) cgroupRoot() string { return "/salesagg-" + n.name }

// cgroupHierarchies are the cgroup hierarchies mounted under
// /sys/fs/cgroup: the v1 ones, and the unified one of a hybrid mount (where
// runc makes cgroups too) if unified.
func cgroupHierarchies(unified bool) []string {
	var dirs []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if st, err := os.Stat(p); err != nil || !st.IsDir() || (e.Name() == "unified" && !unified) || e.Type()&os.ModeSymlink != 0 {
			continue
		}
		dirs = append(dirs, p)
	}
	return dirs
}

// makeCgroupRoot makes the cgroup root in every v1 hierarchy; in cpuset's,
// with the parent's CPUs and memory nodes (a new cpuset has none).
func makeCgroupRoot(root string) error {
	for _, h := range cgroupHierarchies(false) {
		d := filepath.Join(h, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("the kubelet's cgroup root: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("the kubelet's cgroup root: %w", err)
				}
			}
		}
	}
	return nil
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(t *testing.T, dir string) {
	for range 3 {
		f, err := os.Open("/proc/self/mountinfo")
		if err != nil {
			return
		}
		var points []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
				points = append(points, fields[4])
			}
		}
		f.Close()
		if len(points) == 0 {
			return
		}
		slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
				t.Logf("unmounting %s: %v", p, err)
			}
		}
	}
}

// removeCgroups removes the cgroup root and every cgroup under it,
// deepest first, from every hierarchy; a cgroup with a process left stays
// and is named.
func removeCgroups(t *testing.T, root string) {
	for _, h := range cgroupHierarchies(true) {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Logf("removing cgroup %s: %v", d, err)
			}
		}
	}
}
