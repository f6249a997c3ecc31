//go:build !salesaggtest

package main

import "go.uber.org/zap"

// testBuild reports whether this binary carries the test hooks: a release
// build does not, whatever its environment says (crashpoint_testbuild.go is
// the test build's).
const testBuild = false

func crashPointFromEnv(*zap.Logger) func(string) { return nil }

func restoreMemoryFromEnv() int64 { return 0 }
