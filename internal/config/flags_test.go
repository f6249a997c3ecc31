package config

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func loadArgs(env []string, args ...string) (Config, error) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	RegisterFlags(fs)
	return LoadArgs(fs, args, env)
}

func TestEveryProblemReportedAtOnce(t *testing.T) {
	// Scenario: whatever their kind (a flag without its value, an unknown flag, an argument, an
	// unreadable file, an unknown environment variable, a value of the wrong type, a value not
	// allowed), every problem of the command line and the configuration is in the one error.
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		want  []string
		never []string
	}{
		{
			name: "decode and validation problems",
			args: []string{"--processing.guarantee", "nope", "--commit.interval.ms", "-5"},
			want: []string{`processing.guarantee = "nope": allowed: exactly_once_v2, at_least_once`, "commit.interval.ms = -5: must be from 1 to 3600000"},
		},
		{
			name:  "a flag missing its value does not take the next flag",
			args:  []string{"--notification.threshold", "--http.addr", ":1"},
			want:  []string{"flag --notification.threshold needs a value, but --http.addr follows it"},
			never: []string{`notification.threshold = "--http.addr"`, "http.addr ="},
		},
		{
			name: "a flag missing its value at the end",
			args: []string{"--http.addr", ":1", "--state.dir"},
			want: []string{"flag --state.dir needs a value"},
		},
		{
			name: "unknown flags point to the help, beside other problems",
			env:  []string{"SALESAGG_LOG_LEVEL=loud"},
			args: []string{"--bogus.key", "1", "--processing.guarantee", "nope", "--also-bogus", "--log.format=xml"},
			want: []string{"unknown flag --bogus.key (salesagg run --help lists the flags)\nunknown flag --also-bogus (salesagg run --help lists the flags)",
				`processing.guarantee = "nope"`, `log.level = "loud"`, `log.format = "xml"`},
			never: []string{"unexpected argument"},
		},
		{
			name: "a stray argument, a bad value and an unknown variable",
			env:  []string{"SALESAGG_NOPE=1"},
			args: []string{"extra", "--topics.partitions", "x"},
			want: []string{`unexpected argument "extra"`, `topics.partitions = "x"`, "SALESAGG_NOPE"},
		},
		{
			name: "an unreadable config file beside bad flags",
			args: []string{"--config", "/nonexistent/salesagg.yaml", "--commit.interval.ms", "0", "--unknown"},
			want: []string{"reading /nonexistent/salesagg.yaml", "commit.interval.ms = 0", "unknown flag --unknown"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadArgs(tc.env, tc.args...)
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%s", w, msg)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(msg, n) {
					t.Errorf("error has %q:\n%s", n, msg)
				}
			}
		})
	}
}

func TestFlagValues(t *testing.T) {
	// Scenario: values are taken as given: negative numbers, --key=value (also one starting with
	// "--"), and the last of a repeated flag.
	c, err := loadArgs(nil, "--notification.threshold", "-100", "--http.addr=127.0.0.1:9", "--application.id", "a", "--application.id", "b",
		"--state.dir=--odd")
	if err != nil {
		t.Fatal(err)
	}
	if c.NotificationThreshold != -100 || c.HTTPAddr != "127.0.0.1:9" || c.ApplicationID != "b" || c.StateDir != "--odd" {
		t.Fatalf("got threshold %d, http %q, app %q, state %q", c.NotificationThreshold, c.HTTPAddr, c.ApplicationID, c.StateDir)
	}
	// Flags win over the environment, which still works.
	c, err = loadArgs([]string{"SALESAGG_STATE_DIR=/env", "SALESAGG_HTTP_ADDR=:7"}, "--state.dir", "/flag")
	if err != nil || c.StateDir != "/flag" || c.HTTPAddr != ":7" {
		t.Fatalf("got %q %q %v", c.StateDir, c.HTTPAddr, err)
	}
}

func TestHelpFlag(t *testing.T) {
	// Scenario: --help (or -h) prints the flags and gives pflag.ErrHelp alone, whatever else is on
	// the command line.
	for _, args := range [][]string{{"--help"}, {"--bogus", "-h"}} {
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		var out bytes.Buffer
		fs.SetOutput(&out)
		RegisterFlags(fs)
		_, err := LoadArgs(fs, args, nil)
		if err != pflag.ErrHelp { // alone, not joined with the unknown flag
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out.String(), "--application.id string") {
			t.Fatalf("%v: usage lacks the keys:\n%s", args, out.String())
		}
	}
}

func TestParseFlagsOtherCommands(t *testing.T) {
	// Scenario: a subcommand's own flag set gets the same treatment, the hint naming it; a boolean
	// flag needs no value.
	fs := pflag.NewFlagSet("state inspect", pflag.ContinueOnError)
	dir := fs.String("state-dir", "", "")
	asJSON := fs.Bool("json", false, "")
	if err := ParseFlags(fs, []string{"--json", "--state-dir", filepath.Join("a", "b")}); err != nil || !*asJSON || *dir != "a/b" {
		t.Fatalf("got %v %v %q", err, *asJSON, *dir)
	}
	err := ParseFlags(fs, []string{"--stat-dir", "x"})
	if err == nil || !strings.Contains(err.Error(), "unknown flag --stat-dir: did you mean --state-dir? (salesagg state inspect --help lists the flags)") {
		t.Fatalf("got %v", err)
	}
}

func TestBooleanFlagsWithoutValue(t *testing.T) {
	// Scenario: a boolean flag alone (at the end, or before another flag) means true; a value after
	// it is still its value, and a bad one is reported as a bad value of that key.
	for _, tc := range []struct {
		args  []string
		pprof bool
	}{
		{[]string{"--http.pprof"}, true},
		{[]string{"--http.pprof", "--http.addr", ":1"}, true},
		{[]string{"--http.pprof", "false"}, false},
		{[]string{"--http.pprof=false"}, false},
		{[]string{"--http.pprof", "true", "--leave.group.on.close", "false"}, true},
	} {
		c, err := loadArgs(nil, tc.args...)
		if err != nil || c.HTTPPprof != tc.pprof {
			t.Errorf("%v: pprof %v, %v", tc.args, c.HTTPPprof, err)
		}
	}
	if _, err := loadArgs(nil, "--http.pprof", "maybe"); err == nil || !strings.Contains(err.Error(), `http.pprof = "maybe": must be true or false`) {
		t.Errorf("a bad bool: %v", err)
	}
}

func TestHelpShowsTypesAndDefaults(t *testing.T) {
	// Scenario: --help gives each flag the kind of value it takes and its default.
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	RegisterFlags(fs)
	help := fs.FlagUsages()
	for _, want := range []string{
		"--http.pprof boolean[=true]", "(default false)",
		"--commit.interval.ms milliseconds",
		"--session.timeout.ms milliseconds", "(default 45000)",
		"--bootstrap.servers list", "(default localhost:9092)",
		"--topics.partitions int", "(default 3)",
		"--application.id string", "(default sales-aggregator)",
		"--sasl.username string", "SASL user (default: none)",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	if n := strings.Count(help, " string[") + strings.Count(help, `[=""]`); n != 0 {
		t.Errorf("optional values shown on string flags:\n%s", help)
	}
}
