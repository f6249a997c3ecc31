// Package cluster runs salesagg's Kubernetes manifests (deploy/k8s) on a real
// single-node cluster built from source: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, a kubelet on a containerd of the
// test's own, kube-proxy (iptables mode), CoreDNS and a pod network of the
// CNI reference plugins (bridge, host-local, loopback, portmap), with
// certificates the test makes. etcd, the controllers and the kubelet's API
// are on loopback; the API server, Kafka and the node's address are on
// 198.18.0.1 and the pods on 198.18.1.0/24 (RFC 2544's test range), on two
// bridges the test makes and removes; the Services'
// virtual IPs are 198.19.0.0/24.
//
// The binaries are built from k8s.io/kubernetes, go.etcd.io/etcd,
// github.com/coredns/coredns and github.com/containernetworking/plugins
// (module build, next to this one, so that the service's go.mod stays
// small) and cached under ~/.cache/salesagg/k8s/<version>. The test itself
// needs the build tag cluster and root: `make test-k8s-cluster`.
package cluster
