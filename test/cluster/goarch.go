package cluster

import "runtime"

func goarch() string { return runtime.GOARCH }
