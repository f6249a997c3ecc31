package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/salesagg/salesagg/internal/config"
)

// buildInfo is what the binary knows of its own build (from
// runtime/debug.ReadBuildInfo): the main module's version, the VCS commit,
// its time and whether the tree had local changes, the Go version, and
// whether cgo was on (Pebble's caches then live outside the Go heap).
// Unknown fields are "unknown": a binary built with -buildvcs=false (or
// outside a checkout) carries no VCS stamp, and `go build` in a checkout
// gives the module version "(devel)".
type buildInfo struct {
	Module, Version, Commit, Time, GoVersion, Platform string
	Modified                                           string // "true", "false" or "unknown"
	CGO                                                string // CGO_ENABLED: "1", "0" or "unknown"
}

// readBuildInfo returns the binary's buildInfo.
func readBuildInfo() buildInfo {
	bi := buildInfo{Module: "unknown", Version: "unknown", Commit: "unknown", Time: "unknown", Modified: "unknown", CGO: "unknown",
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return bi
	}
	bi.Module, bi.GoVersion = info.Main.Path, info.GoVersion
	if info.Main.Version != "" {
		bi.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			bi.Commit = s.Value
		case "vcs.time":
			bi.Time = s.Value
		case "vcs.modified":
			bi.Modified = s.Value
		case "CGO_ENABLED":
			bi.CGO = s.Value
		}
	}
	return bi
}

// runVersion implements "salesagg version": no arguments but --help.
func runVersion(args []string) error {
	fs := pflag.NewFlagSet("version", pflag.ContinueOnError)
	setHelp(fs, "version", "Prints the build: the module version on the first line, then the VCS commit, its time,\n"+
		"whether the tree was modified, the Go version, the platform and whether cgo was on (with cgo\n"+
		"Pebble's block cache and memtables are outside the Go heap).", false)
	if err := config.ParseFlags(fs, args); errors.Is(err, pflag.ErrHelp) {
		return err
	} else if err != nil {
		return usageError{err}
	}
	printVersion(os.Stdout)
	return nil
}

// printVersion writes `salesagg version`'s answer: the version on the first
// line (for scripts: `salesagg version | head -1`), then one "key: value"
// line per field.
func printVersion(w io.Writer) {
	bi := readBuildInfo()
	fmt.Fprintf(w, "salesagg %s\n", bi.Version)
	fmt.Fprintf(w, "  module:   %s\n  commit:   %s\n  time:     %s\n  modified: %s\n  go:       %s\n  platform: %s\n  cgo:      %s\n",
		bi.Module, bi.Commit, bi.Time, bi.Modified, bi.GoVersion, bi.Platform, bi.cgo())
}

// newBuildInfoGauge returns salesagg_build_info{version,commit,go_version},
// always 1, the Prometheus convention for joining a build's identity to the
// other series (`* on(instance) group_left(version) salesagg_build_info`).
func newBuildInfoGauge() prometheus.Collector {
	bi := readBuildInfo()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "salesagg_build_info",
		Help:        "1, labelled with the build's module version, VCS commit and Go version.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.Commit, "go_version": bi.GoVersion},
	})
	g.Set(1)
	return g
}

// cgo says whether the build had cgo and what that means for the memory.
func (bi buildInfo) cgo() string {
	switch bi.CGO {
	case "1":
		return "on (Pebble's block cache and memtables outside the Go heap)"
	case "0":
		return "off (Pebble's block cache and memtables in the Go heap)"
	}
	return bi.CGO
}

// short is the version with the commit's first 12 digits when known, for
// the status page: "v1.2.0 (0123456789ab)".
func (bi buildInfo) short() string {
	if len(bi.Commit) >= 12 {
		return bi.Version + " (" + bi.Commit[:12] + ")"
	}
	return bi.Version
}
