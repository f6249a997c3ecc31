package ownership

import (
	"fmt"
	"strings"
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

func TestCheckServed(t *testing.T) {
	// Scenario: every instance answers a product 200 with its total from the one running its task
	// (nothing to report); a 503, a wrong total, two runners or two different servers are reported.
	ok := func(total int, served string) func(string) Answer {
		return func(string) Answer {
			return Answer{Code: 200, Body: []byte(fmt.Sprintf(`{"total":%d}`, total)), ServedBy: served}
		}
	}
	taskOf := func(string) string { return "0_1" }
	want := map[string]int64{"p": 5}
	runsIt := map[string]bool{"0_1": true}
	for _, tc := range []struct {
		name    string
		ms      []Queried
		wantBad string
	}{
		{"all served by the owner", []Queried{{"A", runsIt, ok(5, "a; task=0_1")}, {"B", nil, ok(5, "a; task=0_1")}}, ""},
		{"a 503", []Queried{{"A", runsIt, ok(5, "a; task=0_1")}, {"B", nil, func(string) Answer { return Answer{Code: 503, Body: []byte(`{}`)} }}}, "B answered 503"},
		{"wrong total", []Queried{{"A", runsIt, ok(4, "a; task=0_1")}}, "A answered total 4, want 5"},
		{"two runners", []Queried{{"A", runsIt, ok(5, "a; task=0_1")}, {"B", runsIt, ok(5, "a; task=0_1")}}, "runs on [A B]"},
		{"two servers", []Queried{{"A", runsIt, ok(5, "a; task=0_1")}, {"B", nil, ok(5, "b; task=0_1")}}, "served by 2 different instances"},
		{"another task named", []Queried{{"A", runsIt, ok(5, "a; task=0_2")}}, "want it to name task 0_1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckServed(tc.ms, want, taskOf)
			if tc.wantBad == "" && got != "" || tc.wantBad != "" && !strings.Contains(got, tc.wantBad) {
				t.Fatalf("CheckServed = %q, want %q", got, tc.wantBad)
			}
		})
	}
}
