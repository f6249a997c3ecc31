package stream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestStoppedWhileRestoringSaysItCommittedNothing(t *testing.T) {
	// Scenario: Ctrl-C while task 0_1 is still restoring (held in its restore) and the others
	// run: 0_1's lines say its restore was canceled and that it closed while restoring with
	// nothing to commit, never that it committed with the last transaction or flushed and
	// committed; the running tasks' Closed lines still say they committed.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		in := h.startWith(h.cfg, stream.Knobs{BeforeRestore: func(ctx context.Context, p int32) {
			if p == 1 {
				<-ctx.Done()
			}
		}})
		th.WaitFor(t, 30*time.Second, "0_0 and 0_2 to run while 0_1 restores", th.Holds(func() bool {
			running := in.runningTasks()
			st, ok := in.taskStatus("0_1")
			return len(running) == 2 && ok && st.State == "restoring"
		}))
		if err := in.stop(); err != nil {
			t.Fatal(err)
		}
		closed := map[string]string{}
		for _, e := range in.logs.FilterMessageSnippet("Closed").All() {
			closed[e.ContextMap()["task"].(string)] = e.Message
		}
		if len(in.logs.FilterMessageSnippet("task [0_1] Restore canceled").All()) != 1 {
			t.Errorf("no line says 0_1's restore was canceled")
		}
		if got := closed["0_1"]; !strings.Contains(got, "while restoring") || !strings.Contains(got, "nothing to commit") ||
			strings.Contains(got, "committed with") || strings.Contains(got, "flushed and committed") {
			t.Errorf("0_1, stopped while restoring, logged %q", got)
		}
		for _, task := range []string{"0_0", "0_2"} {
			if got := closed[task]; !strings.Contains(got, "committed") {
				t.Errorf("%s, running, logged %q", task, got)
			}
		}
	})
}
