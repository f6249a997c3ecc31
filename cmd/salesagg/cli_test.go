package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
