package ownership

import (
	"testing"
	"time"
)

func TestCheckBracketsTheOtherRead(t *testing.T) {
	// Scenario: X is read, then Y, then X again; a task is a violation only when X runs it in both
	// its reads and Y runs it in the read between them, and the pair is named in name order.
	set := func(tasks ...string) map[string]bool {
		out := map[string]bool{}
		for _, task := range tasks {
			out[task] = true
		}
		return out
	}
	cases := []struct {
		name       string
		x, y       string
		x1, y1, x2 map[string]bool
		want       []violation
	}{
		{"X runs t in both its reads and Y in between", "A", "B", set("0_1"), set("0_1"), set("0_1"),
			[]violation{{"0_1", "A", "B"}}},
		{"the pair is named in name order", "B", "A", set("0_0", "0_2"), set("0_2"), set("0_0", "0_2"),
			[]violation{{"0_2", "A", "B"}}},
		{"X's second read lacks t: it handed t over", "A", "B", set("0_1"), set("0_1"), set(), nil},
		{"X's first read lacks t: it took t over", "A", "B", set(), set("0_1"), set("0_1"), nil},
		{"Y's read lacks t", "A", "B", set("0_1"), set("0_0"), set("0_1"), nil},
		{"X's second read failed", "A", "B", set("0_1"), set("0_1"), nil, nil},
	}
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &Sampler{violations: map[violation]*violationSpan{}}
			s.check(at, Instance{Name: c.x}, Instance{Name: c.y}, c.x1, c.y1, c.x2)
			if len(s.violations) != len(c.want) {
				t.Fatalf("violations %v, want %v", s.violations, c.want)
			}
			for _, v := range c.want {
				span := s.violations[v]
				if span == nil {
					t.Fatalf("violations %v, want %v", s.violations, c.want)
				}
				if span.samples != 1 || !span.from.Equal(at) || !span.until.Equal(at) {
					t.Errorf("%v: span %+v, want 1 sample at %s", v, *span, at)
				}
			}
		})
	}
}
