package state_test

import (
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
)

func TestParseTasks(t *testing.T) {
	got, err := state.ParseTasks([]string{"0_2", "1, 0_0", "2"})
	if err != nil || !slices.Equal(got, []int32{0, 1, 2}) {
		t.Fatalf("ParseTasks = %v, %v; want [0 1 2]", got, err)
	}
	for _, bad := range []string{"0_x", "-1", ""} {
		if _, err := state.ParseTasks([]string{bad}); err == nil || !strings.Contains(err.Error(), "a task is 0_<partition>") {
			t.Errorf("ParseTasks(%q) = %v, want an error naming the form", bad, err)
		}
	}
}

// TestOfflineDir: an offline tool refuses a state dir that does not exist
// or that a service holds, selects only tasks the dir has, and summarizes
// each store.
func TestOfflineDir(t *testing.T) {
	root := t.TempDir()
	if _, err := state.OpenExistingDir(root, "app"); err == nil || !strings.Contains(err.Error(), "no state for application app") {
		t.Fatalf("OpenExistingDir on nothing: %v", err)
	}
	held, err := state.OpenDir(root, "app")
	if err != nil {
		t.Fatal(err)
	}
	s, err := state.Open(held.TaskPath(1), zap.NewNop(), state.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]state.Update{{Product: "a", Entry: state.Entry{Total: 5}}, {Product: "b", Entry: state.Entry{Total: 7}}},
		state.Checkpoint{ChangelogOffset: 2, InputOffset: 9}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := state.OpenExistingDir(root, "app"); err == nil || !strings.Contains(err.Error(), "refusing while the service runs") {
		t.Fatalf("OpenExistingDir while held: %v", err)
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	dir, err := state.OpenExistingDir(root, "app")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if _, err := dir.Select([]int32{0}); err == nil || !strings.Contains(err.Error(), "no task 0_0") || !strings.Contains(err.Error(), "tasks: 0_1") {
		t.Fatalf("Select of a missing task: %v", err)
	}
	if got, err := dir.Select(nil); err != nil || !slices.Equal(got, []int32{1}) {
		t.Fatalf("Select(nil) = %v, %v", got, err)
	}
	sums, err := dir.Inspect()
	if err != nil || len(sums) != 1 {
		t.Fatalf("Inspect = %v, %v", sums, err)
	}
	v := sums[0]
	if v.Task != "0_1" || v.Products != 2 || v.SumOfTotals != 12 || v.ChangelogOffset == nil || *v.ChangelogOffset != 2 || *v.InputOffset != 9 || v.Error != "" {
		t.Fatalf("Inspect = %+v", v)
	}
	totals, cp, found, err := state.Totals(dir.TaskPath(1))
	if err != nil || !found || cp.ChangelogOffset != 2 || totals["a"] != 5 || totals["b"] != 7 || len(totals) != 2 {
		t.Fatalf("Totals = %v %+v %v %v", totals, cp, found, err)
	}
}
