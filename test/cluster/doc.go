// Package cluster runs salesagg's Kubernetes manifests (deploy/k8s) on a real
// two-node cluster built from source: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler on the host; two nodes, each a
// network namespace in which a kubelet, a containerd of the test's own and
// kube-proxy (iptables mode) run; CoreDNS and a pod network of the CNI
// reference plugins (bridge, host-local, loopback, portmap), with
// certificates the test makes. etcd and the controllers are on loopback; the
// API server and Kafka on 198.18.0.1, on a bridge the nodes' veths join
// (198.18.0.2 and .3); the pods on 198.18.1.0/24 and 198.18.2.0/24, one
// subnet per node (RFC 2544's test range); the Services' virtual IPs are
// 198.19.0.0/24. The test makes every interface and namespace and removes
// them.
//
// The binaries are built from k8s.io/kubernetes, go.etcd.io/etcd,
// github.com/coredns/coredns and github.com/containernetworking/plugins
// (module build, next to this one, so that the service's go.mod stays
// small) and cached under ~/.cache/salesagg/k8s/<version>. The test itself
// needs the build tag cluster and root: `make test-k8s-cluster`.
package cluster
