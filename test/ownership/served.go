package ownership

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// Answer is one instance's answer to GET /v1/products/{product}.
type Answer struct {
	Code     int
	Body     []byte
	ServedBy string // the X-Served-By header
	Err      error
}

// Queried is one live instance, as CheckServed reads it.
type Queried struct {
	Name    string
	Running map[string]bool // tasks in state "running"
	Ask     func(product string) Answer
}

// CheckServed returns "" when every product of want is answered 200 with its
// exact total by every instance, each answer served by the instance running
// the product's task (taskOf names it): exactly one instance runs it, and
// every answer carries the same X-Served-By naming that task (one forwarding
// hop). Otherwise it describes (up to 8 of) the wrong products.
func CheckServed(ms []Queried, want map[string]int64, taskOf func(string) string) string {
	products := make([]string, 0, len(want))
	for p := range want {
		products = append(products, p)
	}
	sort.Strings(products)
	var bad []string
	for _, product := range products {
		owner := taskOf(product)
		var runners, problems []string
		for _, m := range ms {
			if m.Running[owner] {
				runners = append(runners, m.Name)
			}
		}
		if len(runners) != 1 {
			problems = append(problems, fmt.Sprintf("task %s runs on %v, want exactly one instance", owner, runners))
		}
		servedBy := map[string]bool{}
		for _, m := range ms {
			a := m.Ask(product)
			var ans struct {
				Total int64 `json:"total"`
			}
			_ = json.Unmarshal(a.Body, &ans)
			switch {
			case a.Err != nil:
				problems = append(problems, fmt.Sprintf("%s: %v", m.Name, a.Err))
			case a.Code != http.StatusOK:
				problems = append(problems, fmt.Sprintf("%s answered %d %s", m.Name, a.Code, strings.TrimSpace(string(a.Body))))
			case ans.Total != want[product]:
				problems = append(problems, fmt.Sprintf("%s answered total %d, want %d", m.Name, ans.Total, want[product]))
			case !strings.HasSuffix(a.ServedBy, "; task="+owner):
				problems = append(problems, fmt.Sprintf("%s answered with X-Served-By %q, want it to name task %s", m.Name, a.ServedBy, owner))
			default:
				servedBy[a.ServedBy] = true
			}
		}
		if len(servedBy) > 1 {
			problems = append(problems, fmt.Sprintf("served by %d different instances %v, want the one running %s", len(servedBy), servedBy, owner))
		}
		if len(problems) > 0 {
			bad = append(bad, fmt.Sprintf("%s (task %s): %s", product, owner, strings.Join(problems, "; ")))
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d products wrong, e.g.:\n  %s", len(bad), len(want), strings.Join(bad[:min(8, len(bad))], "\n  "))
}
