package kit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestGroup(t *testing.T) {
	// Scenario: numbers get thousands separators, negative ones too.
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45678: "-45,678"} {
		if got := Group(n); got != want {
			t.Errorf("Group(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSplitList(t *testing.T) {
	// Scenario: a comma-separated flag value loses its empty items and spaces.
	if got := strings.Join(SplitList(" a, ,b,,c "), "|"); got != "a|b|c" {
		t.Errorf("SplitList = %q", got)
	}
}

func TestOneOf(t *testing.T) {
	// Scenario: a list flag's values are checked: empty, unknown and repeated values are each
	// one problem naming the flag; allowed values in any order are none.
	if got := OneOf("--systems", []string{"b", "a"}, "a", "b"); len(got) != 0 {
		t.Errorf("allowed values: %q", got)
	}
	if got := OneOf("--systems", nil, "a"); len(got) != 1 || got[0] != "--systems is empty" {
		t.Errorf("empty: %q", got)
	}
	got := OneOf("--systems", []string{"a", "x", "a"}, "a", "b")
	want := []string{`--systems: unknown value "x" (allowed: a, b)`, `--systems: "a" listed twice`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("unknown and repeated: %q, want %q", got, want)
	}
}

func TestErrorLines(t *testing.T) {
	// Scenario: every error line counts, the first five are kept, each cut to the given length.
	var e ErrorLines
	for range 7 {
		e.Note("0123456789", 4)
	}
	if e.Count != 7 || len(e.First) != 5 || e.First[0] != "0123…" {
		t.Errorf("after 7 lines: %+v", e)
	}
}

func TestWriteJSON(t *testing.T) {
	// Scenario: WriteJSON creates the directory and leaves no .tmp file behind.
	path := filepath.Join(t.TempDir(), "a", "r.json")
	if err := WriteJSON(path, map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "{\n  \"x\": 1\n}\n" {
		t.Errorf("wrote %q, %v", b, err)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf(".tmp left: %v", err)
	}
}

func TestProc(t *testing.T) {
	// Scenario: a process's lines reach OnLine and its log files, its exit is described, and Stop ends one that runs.
	dir := t.TempDir()
	lines := make(chan string, 10)
	p, err := Start(Spec{Name: "sh", LogDir: dir, Path: "/bin/sh", Args: []string{"-c", "echo out; echo err >&2; exit 3"}, SampleRSS: true,
		OnLine: func(stream string, _ time.Time, line string) { lines <- stream + ":" + line }})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Alive() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if code, sig, _ := p.ExitInfo(); code != 3 || sig != "" {
		t.Errorf("exit %d %q, want 3", code, sig)
	}
	close(lines)
	var got []string
	for l := range lines {
		got = append(got, l)
	}
	if len(got) != 2 {
		t.Errorf("lines %q, want stdout:out and stderr:err", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sh.stderr")); string(b) != "err\n" {
		t.Errorf("sh.stderr holds %q", b)
	}
	if msg := p.ExitError("while testing").Error(); !strings.Contains(msg, "sh exited (exit code 3) while testing") || !strings.Contains(msg, "\nerr") {
		t.Errorf("ExitError = %q", msg)
	}

	q, err := Start(Spec{Name: "sleep", LogDir: dir, Path: "/bin/sleep", Args: []string{"60"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, killed := q.Stop(10 * time.Second); killed || q.Alive() {
		t.Errorf("sleep: killed %v, running %v after SIGTERM", killed, q.Alive())
	}
	if _, sig, _ := q.ExitInfo(); sig != "terminated" {
		t.Errorf("sleep ended by %q, want SIGTERM", sig)
	}
}
