package main

import (
	"strings"
	"testing"
)

func TestHelpLayoutAndErrorPrefix(t *testing.T) {
	// Scenario: a new user asks for help. salesagg --help lists every command in one block; every
	// "X --help" exits 0 with the same layout (a Usage line, what it does, its flags) on standard
	// output; reset's flags are named like the configuration keys; and an error of the
	// configuration is prefixed once, not "salesagg config: config: ...".
	code, stdout, _ := runBinary(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	var block []int // lines naming a command
	lines := strings.Split(stdout, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "  salesagg ") {
			block = append(block, i)
		}
	}
	for i := block[0]; i <= block[len(block)-1]; i++ {
		if l := lines[i]; !strings.HasPrefix(l, "  ") {
			t.Errorf("--help: the commands are split by %q:\n%s", l, stdout)
		}
	}
	for _, args := range [][]string{
		{"run"}, {"broker"}, {"produce"}, {"consume"}, {"reset"}, {"health"}, {"version"},
		{"config"}, {"config", "check"}, {"config", "print"},
		{"state"}, {"state", "inspect"}, {"state", "verify"}, {"state", "reset"}, {"state", "export"},
	} {
		name := strings.Join(args, " ")
		code, stdout, stderr := runBinary(t, nil, append(args, "--help")...)
		if code != 0 || stderr != "" {
			t.Errorf("%s --help: exit %d, standard error %q; want 0 and nothing", name, code, stderr)
		}
		if !strings.HasPrefix(stdout, "Usage: salesagg "+name) {
			t.Errorf("%s --help does not start with %q:\n%s", name, "Usage: salesagg "+name, stdout)
		}
		if len(args) == 1 && args[0] != "config" && args[0] != "state" && !strings.Contains(stdout, "\nFlags:\n") {
			t.Errorf("%s --help has no Flags: section:\n%s", name, stdout)
		}
	}
	_, stdout, _ = runBinary(t, nil, "reset", "--help")
	if !strings.Contains(stdout, "--input.topic") || strings.Contains(stdout, "--input-topics") {
		t.Errorf("reset --help: want --input.topic (a key's name) and not --input-topics:\n%s", stdout)
	}
	code, _, stderr := runBinary(t, []string{"SALESAGG_NOPE=1"}, "config", "check")
	if code != exitUsage || !strings.Contains(stderr, "salesagg config: unknown environment variable SALESAGG_NOPE") || strings.Contains(stderr, "config: config:") {
		t.Errorf("config check with SALESAGG_NOPE: exit %d, want %d and one prefix:\n%s", code, exitUsage, stderr)
	}
}
