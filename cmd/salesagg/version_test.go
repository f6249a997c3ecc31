package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// goVersionM reads what `go version -m` says of bin: its Go version, the
// main module's version and the VCS settings (vcs.revision, ...).
func goVersionM(t *testing.T, bin string) map[string]string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		switch {
		case first && len(f) == 2:
			m["go"] = f[1]
		case len(f) >= 3 && f[0] == "mod":
			m["module"], m["version"] = f[1], f[2]
		case len(f) == 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs."):
			k, v, _ := strings.Cut(f[1], "=")
			m[k] = v
		}
	}
	return m
}

// orUnknown is v, or "unknown" when empty.
func orUnknown(v string) string {
	if v == "" {
		return "unknown"
	}
	return v
}

func TestVersionPrintsTheBuild(t *testing.T) {
	// Scenario: `salesagg version` and `salesagg --version` print the same lines, exit 0: the
	// module version first, then the module, the VCS commit, time and modified flag (unknown
	// when the build carries no VCS stamp) and the Go version, as `go version -m` reads them
	// from the binary. An argument after it is a usage error (exit 2).
	want := goVersionM(t, binary)
	wantText := fmt.Sprintf("salesagg %s\n  module:   %s\n  commit:   %s\n  time:     %s\n  modified: %s\n  go:       %s\n",
		want["version"], want["module"], orUnknown(want["vcs.revision"]), orUnknown(want["vcs.time"]), orUnknown(want["vcs.modified"]), want["go"])
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(binary, arg).Output()
		if err != nil {
			t.Errorf("salesagg %s: %v", arg, err)
		}
		if !strings.HasPrefix(string(out), wantText) || !strings.Contains(string(out), "  platform: linux/") {
			t.Errorf("salesagg %s printed\n%s\nwant it to start with\n%s", arg, out, wantText)
		}
	}
	cmd := exec.Command(binary, "version", "--short")
	_ = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != exitUsage {
		t.Errorf("salesagg version --short exited %d, want %d", code, exitUsage)
	}
}

func TestMetricsServeBuildInfo(t *testing.T) {
	// Scenario: a running service's /metrics has salesagg_build_info 1, labelled with the
	// version, commit and Go version `salesagg version` prints.
	broker := kfakeCluster(t, 3)
	svc := startService(t, broker, t.TempDir(), nil)
	svc.WaitReady(t, 60*time.Second)
	code, body, _, err := svc.Get("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	line := regexp.MustCompile(`(?m)^salesagg_build_info\{.*\} 1$`).FindString(string(body))
	if line == "" {
		t.Fatalf("no salesagg_build_info ... 1 line in /metrics:\n%s", body)
	}
	want := goVersionM(t, binary)
	for _, l := range []string{
		fmt.Sprintf("commit=%q", orUnknown(want["vcs.revision"])), fmt.Sprintf("go_version=%q", want["go"]), fmt.Sprintf("version=%q", want["version"]),
	} {
		if !strings.Contains(line, l) {
			t.Errorf("%s lacks %s", line, l)
		}
	}
}
