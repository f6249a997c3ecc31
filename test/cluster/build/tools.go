//go:build tools

// Package build pins the commands the cluster test builds: the Kubernetes
// control plane, the kubelet and kubectl from k8s.io/kubernetes, and etcd.
package build

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
