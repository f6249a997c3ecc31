package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
