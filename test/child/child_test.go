package child

import (
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestLineWriter(t *testing.T) {
	// Scenario: a LineWriter emits each complete line, without its line ending, whatever the writes' boundaries, and the unended last one on Flush.
	var got []string
	w := &LineWriter{Emit: func(l string) { got = append(got, l) }}
	for _, s := range []string{"a", "b\r\nc\n", "\nd"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"ab", "c", ""}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q, want %q", got, want)
	}
	w.Flush()
	if want := []string{"ab", "c", "", "d"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines after Flush %q, want %q", got, want)
	}
}

func TestProcess(t *testing.T) {
	// Scenario: a process's lines reach OnLine by stream, its exit is described, SIGTERM stops a group's leader and SIGKILL one that ignores it.
	var mu sync.Mutex
	lines := map[string][]string{}
	p, err := Start(Spec{Name: "sh", Path: "/bin/sh", Args: []string{"-c", "echo out; echo err >&2; printf last; exit 3"},
		OnLine: func(stream string, _ time.Time, l string) {
			mu.Lock()
			defer mu.Unlock()
			lines[stream] = append(lines[stream], l)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if !p.WaitExit(10 * time.Second) {
		t.Fatal("sh did not exit")
	}
	mu.Lock()
	if got := strings.Join(lines["stdout"], "|"); got != "out|last" {
		t.Errorf("stdout %q", got)
	}
	if got := strings.Join(lines["stderr"], "|"); got != "err" {
		t.Errorf("stderr %q", got)
	}
	mu.Unlock()
	if p.Alive() || p.ExitCode() != 3 || p.DescribeExit() != "exit code 3" || p.ExitedAt().Before(p.Started) {
		t.Errorf("exit: alive %v, code %d, %q", p.Alive(), p.ExitCode(), p.DescribeExit())
	}

	q, err := Start(Spec{Name: "sleep", Path: "/bin/sleep", Args: []string{"60"}, Group: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, killed := q.Stop(10 * time.Second); killed || !q.KilledBy(syscall.SIGTERM) {
		t.Errorf("sleep after Stop: killed %v, %s", killed, q.DescribeExit())
	}

	up := make(chan struct{}, 1)
	r, err := Start(Spec{Name: "stubborn", Path: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo up; while :; do sleep 1; done"}, Job: true,
		OnLine: func(string, time.Time, string) { up <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Kill()
	select {
	case <-up:
	case <-time.After(10 * time.Second):
		t.Fatal("stubborn did not start")
	}
	if _, killed := r.Stop(500 * time.Millisecond); !killed || !r.KilledBy(syscall.SIGKILL) || r.ExitSignal() != "killed" {
		t.Errorf("stubborn after Stop: killed %v, %s", killed, r.DescribeExit())
	}
}
