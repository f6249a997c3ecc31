// Package cluster runs salesagg's Kubernetes manifests (deploy/k8s) on a real
// single-node cluster built from source: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and a kubelet on a containerd of
// the test's own, all on loopback, with certificates the test makes.
//
// The binaries are built from k8s.io/kubernetes (module build, next to this
// one, so that the service's go.mod stays small) and cached under
// ~/.cache/salesagg/k8s/<version>. The test itself needs the build tag
// cluster and root: `make test-k8s-cluster`.
package cluster
