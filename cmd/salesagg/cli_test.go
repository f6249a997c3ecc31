package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
	"github.com/salesagg/salesagg/test/harness"
)

// runBinary runs the test binary with args and returns its exit code,
// standard output and standard error.
func runBinary(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

func TestCommandLineErrors(t *testing.T) {
	// Scenario: a person gets the command line wrong: no subcommand, an unknown one, bad keys of
	// several kinds at once, a flag missing its value, an unknown flag. Each exits 2 with a message
	// naming every problem (and, for flags, pointing to the help), before anything starts.
	for _, tc := range []struct {
		name  string
		args  []string
		want  []string
		never []string
	}{
		{name: "no subcommand", args: nil, want: []string{"Usage:", "salesagg run", "salesagg state verify", "salesagg state reset"}},
		{name: "unknown subcommand", args: []string{"rn"}, want: []string{`unknown command "rn"`, "Usage:"}},
		{name: "decode and validation problems together", args: []string{"run", "--processing.guarantee", "nope", "--commit.interval.ms", "-5"},
			want: []string{`processing.guarantee = "nope"`, "commit.interval.ms = -5"}},
		{name: "a flag without its value", args: []string{"run", "--notification.threshold", "--http.addr", ":1"},
			want: []string{"flag --notification.threshold needs a value, but --http.addr follows it"}, never: []string{`"--http.addr"`}},
		{name: "an unknown flag", args: []string{"run", "--bogus.key", "1"},
			want: []string{"unknown flag --bogus.key (salesagg run --help lists the flags)"}, never: []string{"Usage of"}},
		{name: "an unknown flag of another command", args: []string{"produce", "--fil", "x"},
			want: []string{"unknown flag --fil: did you mean --file? (salesagg produce --help lists the flags)"}},
		{name: "an unknown flag near a key", args: []string{"run", "--bootstrap-servers", "x:1"},
			want: []string{"unknown flag --bootstrap-servers: did you mean --bootstrap.servers? (salesagg run --help lists the flags)"}},
		{name: "state without its command", args: []string{"state"}, want: []string{"salesagg state verify", "salesagg state reset"}},
		{name: "state reset without a task", args: []string{"state", "reset", "--state.dir", "/nonexistent"}, want: []string{"--task is required"}},
		{name: "state reset with a bad task", args: []string{"state", "reset", "--state.dir", "/nonexistent", "--task", "one"}, want: []string{`--task "one"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runBinary(t, nil, tc.args...)
			if code != exitUsage {
				t.Errorf("exit code %d, want %d", code, exitUsage)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("standard error lacks %q:\n%s", w, stderr)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(stderr, n) {
					t.Errorf("standard error has %q:\n%s", n, stderr)
				}
			}
			if stdout != "" {
				t.Errorf("standard output %q, want nothing", stdout)
			}
		})
	}
	// Help is not an error, and goes to standard output.
	if code, stdout, _ := runBinary(t, nil, "run", "--help"); code != 0 || !strings.Contains(stdout, "--application.id string") {
		t.Errorf("run --help: exit %d, %s", code, stdout)
	}
}

// startupLogs runs the service against a port where no Kafka listens, waits
// for its start-up line, stops it with SIGTERM and returns what it wrote to
// standard error (a pipe, not a terminal).
func startupLogs(t *testing.T, args ...string) string {
	t.Helper()
	p := startProc(t, nil, append([]string{"run", "--bootstrap.servers", harness.FreeAddr(t), "--state.dir", t.TempDir(),
		"--http.addr", harness.FreeAddr(t), "--commit.interval.ms", "100"}, args...)...)
	harness.WaitFor(t, 30*time.Second, "the start-up line", func() error {
		if !strings.Contains(p.Stderr(), "Starting salesagg") {
			return errors.New("not logged yet")
		}
		return nil
	})
	_ = p.Signal(syscall.SIGTERM)
	if !p.WaitExit(45 * time.Second) {
		t.Fatal("no exit within 45 s of SIGTERM")
	}
	return p.Stderr()
}

func TestLogsWithoutTerminal(t *testing.T) {
	// Scenario: standard error is a pipe (a file, journald, a container's log). With no log.format
	// the service writes JSON lines, its start-up line showing the format it chose and every key as
	// a field; with log.format console, plain console lines without colour codes and a short
	// start-up summary. Durations are milliseconds in both.
	t.Run("default: json", func(t *testing.T) {
		out := startupLogs(t)
		var start, shutdown map[string]any
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("not a JSON line: %q", line)
			}
			switch m["msg"] {
			case "Starting salesagg":
				start = m
			case "Shutdown requested: flushing, checkpointing and leaving the group":
				shutdown = m
			}
		}
		if start == nil || shutdown == nil {
			t.Fatalf("no start-up or shutdown line in:\n%s", out)
		}
		if start["log.format"] != "json" || start["commit.interval.ms"] != float64(100) || start["processing.guarantee"] != "exactly_once_v2" ||
			!strings.HasPrefix(fmt.Sprint(start["group.instance.id"]), "sales-aggregator-") || !strings.HasPrefix(fmt.Sprint(start["application.server"]), "127.0.0.1:") ||
			strings.HasSuffix(fmt.Sprint(start["application.server"]), ":0") {
			t.Errorf("start-up line %v", start)
		}
		if start["level"] != "info" {
			t.Errorf("level %v", start["level"])
		}
		// stream.GracePeriod (30 s) in milliseconds.
		if g, ok := shutdown["grace"].(float64); !ok || g != 30000 {
			t.Errorf("grace %v, want 30000 (milliseconds)", shutdown["grace"])
		}
	})
	t.Run("console", func(t *testing.T) {
		out := startupLogs(t, "--log.format", "console")
		if strings.Contains(out, "\x1b[") {
			t.Errorf("ANSI escape codes in console logs written to a pipe:\n%q", out)
		}
		var start string
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "Starting salesagg") {
				start = line
			}
			if strings.HasPrefix(strings.TrimSpace(line), "{") {
				t.Errorf("a JSON line in console format: %s", line)
			}
		}
		if !strings.Contains(start, "\tINFO\t") || !strings.Contains(start, "exactly_once_v2") || strings.Contains(start, "sasl.password") || len(start) > 400 {
			t.Errorf("start-up summary line %q", start)
		}
		if !strings.Contains(out, `"grace": 30000`) {
			t.Errorf("no grace of 30000 ms in:\n%s", out)
		}
	})
}

func TestReleaseBuildHasNoCrashPoint(t *testing.T) {
	// Scenario: SALESAGGTEST_CRASH_POINT makes a test build SIGKILL itself at a commit-cycle point;
	// the release build (go build ./cmd/salesagg, no tags) has no such hook: the variable's name is
	// not even in the binary, and a service started with it runs through many commit cycles,
	// never arming it.
	if testing.Short() {
		t.Skip("builds a binary")
	}
	release := filepath.Join(t.TempDir(), "salesagg-release")
	if out, err := exec.Command("go", "build", "-o", release, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for bin, want := range map[string]bool{release: false, binary: true} {
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(b, []byte("SALESAGGTEST_CRASH_POINT")); got != want {
			t.Errorf("%s holds the crash-point variable: %v, want %v", filepath.Base(bin), got, want)
		}
	}

	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	p := harness.StartService(t, harness.ServiceConfig{Bin: release, Broker: brokerAddr, StateDir: filepath.Join(work, "state"), CommitMs: 100,
		CrashPoint: "flush-start", Flags: []string{"--processing.guarantee", "at_least_once"}})
	p.WaitReady(t, 60*time.Second)
	produceSample(t, brokerAddr)
	// A total is served only once a flush wrote it, past flush-start: an
	// armed point (its first pass, by default) would have killed the
	// process before any total showed.
	p.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	if !p.Alive() {
		t.Fatalf("the release build exited: %s\n%s", p.DescribeExit(), p.Stderr())
	}
	if strings.Contains(p.Stderr(), "Crash point") {
		t.Fatalf("the release build armed a crash point:\n%s", p.Stderr())
	}
	p.Terminate(t)
}

func TestSecondProcessOnStateDirFails(t *testing.T) {
	// Scenario: a second service on the same state dir fails at start naming the lock file and the holder.
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, "", brokerAddr)
	first := startService(t, brokerAddr, work, nil)
	first.WaitReady(t, 60*time.Second)
	second := startService(t, brokerAddr, work, nil)
	if !second.WaitExit(30 * time.Second) {
		t.Fatal("second process did not fail")
	}
	if second.ExitCode() != exitError {
		t.Fatalf("second process: %s", second.DescribeExit())
	}
	msg := second.Stderr()
	for _, want := range []string{filepath.Join(work, "sales-aggregator", ".lock"), "pid=", "host="} {
		if !strings.Contains(msg, want) {
			t.Fatalf("error lacks %q: %s", want, msg)
		}
	}
	first.Terminate(t)
}

func TestBadConfigFailsAtStart(t *testing.T) {
	// Scenario: a bad value fails the start with exit code 2, naming key, value and what is allowed.
	p := startProc(t, []string{"SALESAGG_NOTIFICATION_THRESHOLD=high"}, "run", "--processing.guarantee", "sometimes", "--http.addr", harness.FreeAddr(t))
	<-p.Done()
	if p.ExitCode() != exitUsage {
		t.Fatalf("exit: %s", p.DescribeExit())
	}
	if !strings.Contains(p.Stderr(), `notification.threshold = "high"`) {
		t.Fatalf("output: %s", p.Stderr())
	}
	p = startProc(t, nil, "run", "--processing.guarantee", "sometimes", "--http.addr", harness.FreeAddr(t))
	<-p.Done()
	if !strings.Contains(p.Stderr(), `processing.guarantee = "sometimes": allowed: exactly_once_v2, at_least_once`) {
		t.Fatalf("output: %s", p.Stderr())
	}
}

func TestProduceRejectsLinesWithoutSeparator(t *testing.T) {
	// Scenario: a produce file with a line lacking "key:" sends nothing and names the line.
	f := filepath.Join(t.TempDir(), "events.txt")
	if err := os.WriteFile(f, []byte("p1:{\"value\":1}\n\nno separator here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary, "produce", "--file", f, "--bootstrap.servers", "127.0.0.1:1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "line 3: no ':' between key and value") {
		t.Fatalf("produce: %v: %s", err, out)
	}
}

// configFile writes text as a YAML file under a temporary dir and returns
// its path.
func configFile(t *testing.T, text string) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "salesagg.yaml")
	if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

// wantAll fails the test for each of want that out lacks.
func wantAll(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	// Scenario: `config check` of a nested file, the environment and flags (a boolean without a
	// value) exits 0 and prints the resolved config with the password redacted; with a typo in the
	// file, the environment and a flag it exits 2 with one line per typo and its suggestion, and
	// prints no config; a port out of range exits 2 naming the key and the value.
	file := configFile(t, "bootstrap:\n  servers: b1:9092\nsasl:\n  password: hunter2\nstate: {dir: /srv/state}\n")
	code, stdout, stderr := runBinary(t, []string{"SALESAGG_NOTIFICATION_THRESHOLD=5"}, "config", "check", "--config", file, "--http.pprof")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	wantAll(t, "config check", stdout, `bootstrap.servers: "b1:9092"`, `state.dir: "/srv/state"`, "notification.threshold: 5\n",
		"http.pprof: true\n", `sasl.password: "[redacted]"`, "commit.interval.ms: 100\n")
	if strings.Contains(stdout+stderr, "hunter2") {
		t.Errorf("the password is shown:\n%s%s", stdout, stderr)
	}

	bad := configFile(t, "notification:\n  treshold: 10\n")
	code, stdout, stderr = runBinary(t, []string{"SALESAGG_STATE_DIRR=/x"}, "config", "check", "--config", bad, "--bootstrap-servers", "x:1")
	if code != exitUsage || stdout != "" {
		t.Fatalf("exit %d (want 2), stdout %q", code, stdout)
	}
	wantAll(t, "config check of typos", stderr,
		`unknown key "notification.treshold" in `+bad+` (line 2): did you mean notification.threshold?`,
		`unknown environment variable SALESAGG_STATE_DIRR (no key "state.dirr"): did you mean SALESAGG_STATE_DIR?`,
		"unknown flag --bootstrap-servers: did you mean --bootstrap.servers? (salesagg config check --help lists the flags)")
	if n := strings.Count(strings.TrimSpace(stderr), "\n") + 1; n != 3 {
		t.Errorf("want 3 lines, one per typo, got %d:\n%s", n, stderr)
	}

	for _, cmd := range [][]string{{"config", "check"}, {"run"}} {
		code, _, stderr = runBinary(t, nil, append(cmd, "--http.addr", "127.0.0.1:99999", "--state.dir", t.TempDir())...)
		if code != exitUsage || !strings.Contains(stderr, `http.addr = "127.0.0.1:99999": must be host:port or :port, with a port from 1 to 65535`) {
			t.Errorf("%v with port 99999: exit %d (want 2), %s", cmd, code, stderr)
		}
	}
}

func TestConfigPrintSources(t *testing.T) {
	// Scenario: `config print` lists every key with its value and where it came from: the default,
	// the file, an environment variable, a flag; a secret is redacted.
	file := configFile(t, "application.id: from-file\nhttp:\n  addr: 127.0.0.1:7000\nsasl.password: hunter2\n")
	code, stdout, stderr := runBinary(t, []string{"SALESAGG_HTTP_ADDR=127.0.0.1:7001", "SALESAGG_STORE_NAME=FROM_ENV"},
		"config", "print", "--config", file, "--http.addr", "127.0.0.1:7002", "--leave.group.on.close", "false")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := map[string][]string{}
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			lines[f[0]] = f[1:]
		}
	}
	for key, want := range map[string]string{
		"application.id":       "from-file file " + file,
		"http.addr":            "127.0.0.1:7002 flag --http.addr",
		"store.name":           "FROM_ENV env SALESAGG_STORE_NAME",
		"leave.group.on.close": "false flag --leave.group.on.close",
		"input.topic":          "sales-events-v1 default",
		"sasl.password":        "[redacted] file " + file,
	} {
		if got := strings.Join(lines[key], " "); got != want {
			t.Errorf("%s: %q, want %q", key, got, want)
		}
	}
	if strings.Contains(stdout, "hunter2") {
		t.Errorf("the password is shown:\n%s", stdout)
	}
	if n := len(lines) - 1; n < 50 { // the header aside
		t.Errorf("%d keys printed:\n%s", n, stdout)
	}
}

func TestRunHelpShowsTypesAndDefaults(t *testing.T) {
	// Scenario: `run --help` gives every flag the kind of value it takes and its default.
	code, stdout, _ := runBinary(t, nil, "run", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	wantAll(t, "run --help", stdout, "--http.pprof boolean[=true]", "--session.timeout.ms milliseconds", "(default 45000)",
		"--bootstrap.servers list", "(default localhost:9092)", "--topics.partitions int", "(default 3)", "--state.dir string")
}

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
		case len(f) == 2 && f[0] == "build" && (strings.HasPrefix(f[1], "vcs.") || strings.HasPrefix(f[1], "CGO_ENABLED=")):
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
	// from the binary, and whether cgo was on. An argument after it is a usage error (exit 2).
	want := goVersionM(t, binary)
	wantText := fmt.Sprintf("salesagg %s\n  module:   %s\n  commit:   %s\n  time:     %s\n  modified: %s\n  go:       %s\n",
		want["version"], want["module"], orUnknown(want["vcs.revision"]), orUnknown(want["vcs.time"]), orUnknown(want["vcs.modified"]), want["go"])
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(binary, arg).Output()
		if err != nil {
			t.Errorf("salesagg %s: %v", arg, err)
		}
		cgo := map[string]string{"1": "on (", "0": "off ("}[want["CGO_ENABLED"]]
		if !strings.HasPrefix(string(out), wantText) || !strings.Contains(string(out), "  platform: linux/") ||
			cgo == "" || !strings.Contains(string(out), "\n  cgo:      "+cgo) {
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

func TestRegistryHoldsTheRuntimeGoAndProcessMetrics(t *testing.T) {
	// Scenario: the registry the service serves at /metrics gathers the runtime's families
	// with the Go runtime's and the process's, as the Grafana dashboard expects.
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	reg, err := newRegistry(stream.New(cfg, zap.NewNop(), dir, stream.Knobs{}))
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, want := range []string{"salesagg_ready", "go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "process_cpu_seconds_total"} {
		if !have[want] {
			t.Errorf("no %s among %v", want, have)
		}
	}
}
