package main

import (
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
)

// stateDirWithTask creates the state dir of application app under root with
// an empty store for task 0_0, as a stopped service leaves it.
func stateDirWithTask(t *testing.T, root, app string) {
	t.Helper()
	dir, err := state.OpenDir(root, app)
	if err != nil {
		t.Fatal(err)
	}
	s, err := state.Open(dir.TaskPath(0), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	_ = dir.Close()
}

func TestStateCommandsTakeTheConfig(t *testing.T) {
	// Scenario: the state commands take --state.dir and --application.id like run, or read them from
	// --config or SALESAGG_*; the old --state-dir still works but is not in the help.
	root := t.TempDir()
	stateDirWithTask(t, root, "myapp")
	want := "state dir:  " + filepath.Join(root, "myapp")
	for name, tc := range map[string]struct {
		env  []string
		args []string
	}{
		"flags":  {args: []string{"--state.dir", root, "--application.id", "myapp"}},
		"config": {args: []string{"--config", configFile(t, "state:\n  dir: "+root+"\napplication: {id: myapp}\n")}},
		"env":    {env: []string{"SALESAGG_STATE_DIR=" + root, "SALESAGG_APPLICATION_ID=myapp"}},
		"alias":  {args: []string{"--state-dir", root, "--application.id", "myapp"}},
	} {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runBinary(t, tc.env, append([]string{"state", "inspect"}, tc.args...)...)
			if code != 0 || !strings.Contains(stdout, want) || !strings.Contains(stdout, "0_0") {
				t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
			}
			code, _, stderr = runBinary(t, tc.env, append([]string{"state", "reset", "--task", "0_7"}, tc.args...)...)
			if code != exitError || !strings.Contains(stderr, "no task 0_7") {
				t.Fatalf("reset of a task not there: exit %d, %s", code, stderr)
			}
		})
	}
	_, stdout, _ := runBinary(t, nil, "state", "inspect", "--help")
	if !strings.Contains(stdout, "--state.dir string") || !strings.Contains(stdout, "(default /tmp/salesagg)") || strings.Contains(stdout, "state-dir") {
		t.Errorf("state inspect --help:\n%s", stdout)
	}
	code, _, stderr := runBinary(t, nil, "state", "inspect", "--state.dri", root)
	if code != exitUsage || !strings.Contains(stderr, "unknown flag --state.dri: did you mean --state.dir?") {
		t.Errorf("a typo: exit %d, %s", code, stderr)
	}
}
