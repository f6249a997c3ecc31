//go:build cluster

package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// ensurePackage installs Debian's package pkg (no service started by its
// scripts) when the command cmd is missing; it returns what is missing
// when it could not.
func ensurePackage(t *testing.T, cmd, pkg string) error {
	if _, err := exec.LookPath(cmd); err == nil {
		return nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%s is not installed (Debian's %s) and there is no apt-get", cmd, pkg)
	}
	const policy = "/usr/sbin/policy-rc.d"
	if _, err := os.Stat(policy); os.IsNotExist(err) {
		if err := os.WriteFile(policy, []byte("#!/bin/sh\n# make test-k8s-cluster: no service starts during its apt-get install\nexit 101\n"), 0o755); err == nil {
			defer os.Remove(policy)
		}
	}
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "--no-install-recommends", pkg}} {
		t.Logf("$ apt-get %s", strings.Join(args, " "))
		if _, errOut, err := run(10*time.Minute, env, "apt-get", args...); err != nil {
			return fmt.Errorf("apt-get: %w\n%s", err, errOut)
		}
	}
	_, err := exec.LookPath(cmd)
	return err
}

// startPolicyAgents runs kube-router's network policy controller (its
// firewall only: no routing, no service proxy) in each node's network
// namespace, as that node (--hostname-override): it enforces the
// NetworkPolicies for the pods of its node in the node's iptables and
// ipsets. Its identity system:kube-router reads what its ClusterRole (the
// one kube-router's manifests give it) lets it. Waits for each to have
// set up its chains.
func (c *cluster) startPolicyAgents() error {
	t := c.t
	if err := ensurePackage(t, "ipset", "ipset"); err != nil {
		return fmt.Errorf("kube-router needs ipset(8): %w", err)
	}
	rbac := `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-router}
rules:
  - apiGroups: [""]
    resources: [namespaces, pods, services, nodes, endpoints]
    verbs: [list, get, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [list, get, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, get, watch]
  - apiGroups: [""]
    resources: [events]
    verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-router}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: system:kube-router}
`
	path := filepath.Join(c.dir, "kube-router-rbac.yaml")
	if err := os.WriteFile(path, []byte(rbac), 0o644); err != nil {
		return err
	}
	c.mustKubectl("apply", "--server-side", "-f", path)
	for _, n := range c.nodes {
		start := time.Now()
		p := c.startIn(n, "kube-router", "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
			"--run-loadbalancer=false", "--enable-cni=false",
			"--kubeconfig", filepath.Join(c.dir, "kube-router.kubeconfig"), "--hostname-override", n.name,
			"--service-cluster-ip-range", svcCIDR, "--health-port", "0", "--metrics-port", "0", "--v=1")
		if err := harness.Poll(time.Minute, func() error {
			if err := p.Exited(); err != nil {
				return fmt.Errorf("%w: %w", harness.ErrGiveUp, err)
			}
			out, err := n.rules("filter", "FORWARD")
			if err != nil {
				return err
			}
			if !strings.Contains(out, "KUBE-ROUTER-FORWARD") {
				return fmt.Errorf("no jump to KUBE-ROUTER-FORWARD in node %s's FORWARD chain yet", n.name)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("kube-router on node %s: %w\n%s", n.name, err, p.Tail(20))
		}
		t.Logf("kube-router's network policy controller on node %s: its chains in place after %s", n.name, time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// outsiderNS is a namespace the service's NetworkPolicy does not admit:
// no client label, not monitoring.
const outsiderNS = "salesagg-outsider"

// policyEnforced checks the prod overlay's NetworkPolicy as the agents
// enforce it, on port 8080 through the Service and at each pod's address:
// from the probe pod of the clients' namespace (admitted) each answers 200;
// from a pod of outsiderNS, whose names resolve (the network and DNS work
// there), none answers.
func (c *cluster) policyEnforced(t *testing.T, service string, podIPs map[string]string) {
	c.startProbeIn(outsiderNS, nil)
	if _, err := c.probeIn(outsiderNS, "resolve", service); err != nil {
		t.Fatalf("from namespace %s, %s does not resolve: %v", outsiderNS, service, err)
	}
	targets := []string{"http://" + service + ":8080/healthz"}
	for _, ip := range podIPs {
		targets = append(targets, "http://"+ip+":8080/healthz")
	}
	start := time.Now()
	var admitted, outsider map[string]string
	harness.WaitFor(t, 2*time.Minute, "200 on port 8080 from namespace "+probeNS+", no answer from namespace "+outsiderNS, func() error {
		admitted, _ = c.probeIn(probeNS, append([]string{"get"}, targets...)...)
		outsider, _ = c.probeIn(outsiderNS, append([]string{"get"}, targets...)...)
		var wrong []string
		for _, u := range targets {
			if !strings.HasPrefix(admitted[u], "200 ") {
				wrong = append(wrong, fmt.Sprintf("from %s, %s: %s", probeNS, u, admitted[u]))
			}
			if !strings.HasPrefix(outsider[u], "error ") {
				wrong = append(wrong, fmt.Sprintf("from %s, %s: %s", outsiderNS, u, outsider[u]))
			}
		}
		return harness.Summarize(wrong)
	})
	for _, u := range targets {
		t.Logf("%s: from %s %s; from %s %s", u, probeNS, admitted[u], outsiderNS, outsider[u])
	}
	t.Logf("the NetworkPolicy enforced %s after the outsider's probe started", time.Since(start).Round(100*time.Millisecond))
}
