//go:build salesaggtest

package main

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"
)

// This file is only in test builds (go build -tags salesaggtest): a release
// build has no way to make the process kill itself (crashpoint_release.go).

// crashPointEnv names a commit-cycle point at which the process kills itself
// with SIGKILL, for crash tests: "POINT" or "POINT:N" (the Nth time).
const crashPointEnv = "SALESAGGTEST_CRASH_POINT"

// testBuild reports whether this binary carries the test hooks.
const testBuild = true

func crashPointFromEnv(log *zap.Logger) func(string) {
	spec := os.Getenv(crashPointEnv)
	if spec == "" {
		return nil
	}
	point, nth, _ := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nth)
	if err != nil || n < 1 {
		n = 1
	}
	var hits atomic.Int64
	log.Warn("Crash point armed (testing only)", zap.String("point", point), zap.Int("nth", n))
	return func(p string) {
		if p == point && hits.Add(1) == int64(n) {
			_ = log.Sync()
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal arrives; nothing after this point runs
		}
	}
}

// restoreMemoryEnv overrides the memory the bulk loads of full restores
// share, in bytes, for tests that need a load to spill sorted runs.
const restoreMemoryEnv = "SALESAGGTEST_RESTORE_MEMORY"

func restoreMemoryFromEnv() int64 {
	n, _ := strconv.ParseInt(os.Getenv(restoreMemoryEnv), 10, 64)
	return max(n, 0)
}
