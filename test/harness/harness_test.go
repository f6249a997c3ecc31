package harness

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestPoll(t *testing.T) {
	// Scenario: Poll returns nil once the condition holds, its last error at the timeout, and at once on ErrGiveUp.
	n := 0
	if err := Poll(time.Second, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("Poll = %v after %d calls, want nil after 3", err, n)
	}
	if err := Poll(100*time.Millisecond, func() error { return errors.New("never") }); err == nil || err.Error() != "never" {
		t.Errorf("Poll of a condition that never holds = %v, want its last error", err)
	}
	start := time.Now()
	err := Poll(time.Minute, func() error { return fmt.Errorf("%w: gone", ErrGiveUp) })
	if !errors.Is(err, ErrGiveUp) || time.Since(start) > 5*time.Second {
		t.Errorf("Poll of a given-up condition = %v after %s, want ErrGiveUp at once", err, time.Since(start))
	}
}

func TestLatestTotals(t *testing.T) {
	// Scenario: the latest value of each key wins, a null value deletes the key, and a value that is not 8 bytes is an error.
	v := func(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }
	got, err := LatestTotals([]*kgo.Record{
		{Key: []byte("a"), Value: v(1)}, {Key: []byte("b"), Value: v(2)}, {Key: []byte("a"), Value: v(-3)}, {Key: []byte("b")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := DiffTotals("totals", got, map[string]int64{"a": -3}); err != nil {
		t.Error(err)
	}
	if _, err := LatestTotals([]*kgo.Record{{Key: []byte("a"), Value: []byte("x")}}); err == nil {
		t.Error("a 1-byte value: no error")
	}
}

func TestDiffTotals(t *testing.T) {
	// Scenario: DiffTotals names missing, wrong and unexpected products, and lists at most 5.
	err := DiffTotals("w", map[string]int64{"a": 1, "b": 3, "x": 9}, map[string]int64{"a": 1, "b": 2, "c": 4})
	if err == nil || err.Error() != "w: 3 differences: b: got 3 want 2; c: missing; x: unexpected (9)" {
		t.Errorf("DiffTotals = %v", err)
	}
	want := map[string]int64{}
	for i := range 7 {
		want[fmt.Sprint(i)] = 1
	}
	if err := DiffTotals("w", nil, want); err == nil || !strings.HasSuffix(err.Error(), "(and 2 more)") {
		t.Errorf("DiffTotals of 7 differences = %v, want 5 and 2 more", err)
	}
}

func TestProc(t *testing.T) {
	// Scenario: a process's stdout and JSON stderr lines are kept, its exit is described, and SIGTERM stops one that runs.
	p := Start(t, Spec{Name: "sh", Path: "/bin/sh", Args: []string{"-c", `echo out; echo '{"msg":"hello","n":3}' >&2; echo plain >&2; exit 3`}})
	if !p.WaitExit(10 * time.Second) {
		t.Fatal("sh did not exit")
	}
	if got := p.StdoutLines(); len(got) != 1 || got[0] != "out" {
		t.Errorf("stdout %q", got)
	}
	es := p.LogsWith("hello")
	if n, ok := es[0].Int("n"); len(es) != 1 || !ok || n != 3 {
		t.Errorf("JSON lines with hello: %v", es)
	}
	if p.ExitCode() != 3 || p.DescribeExit() != "exit code 3" || !errors.Is(p.Exited(), ErrGiveUp) {
		t.Errorf("exit: code %d, %q, Exited %v", p.ExitCode(), p.DescribeExit(), p.Exited())
	}
	if !strings.Contains(p.Tail(10), "err| plain") {
		t.Errorf("log file tail %q lacks the stderr line", p.Tail(10))
	}

	q := Start(t, Spec{Name: "sleep", Path: "/bin/sleep", Args: []string{"60"}})
	if q.Exited() != nil {
		t.Fatal("sleep exited at once")
	}
	if _, killed := q.Stop(10 * time.Second); killed || !q.KilledBy(syscall.SIGTERM) {
		t.Errorf("sleep after Stop: %s", q.DescribeExit())
	}
}
