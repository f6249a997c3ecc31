//go:build tools

// Package kuberouter pins kube-router, whose network policy controller
// enforces the cluster test's NetworkPolicies (run with its firewall only:
// no routing, no service proxy). A module of its own: it is built against
// client-go v0.29, not the v0.37 of the Kubernetes build beside it.
// v2.1.0 is the release the module proxy serves here; the dependencies
// reported with security flaws at the versions it requires are raised in
// go.mod to fixed releases that still build it: golang.org/x/net v0.63.0,
// golang.org/x/sys v0.50.0, golang.org/x/oauth2 v0.38.0, google.golang.org/grpc
// v1.85.0, google.golang.org/protobuf v1.36.12, github.com/docker/docker
// v25.0.6, k8s.io/{api,apimachinery,client-go} v0.29.15 (the last v0.29
// patch).
package kuberouter

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
