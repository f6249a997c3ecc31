package state

import (
	"slices"
	"testing"
)

// Scenario: offered more totals than its bound, a TopTotals keeps the
// largest, equal totals by product name, and hands them largest first.
func TestTopTotalsKeepsTheLargest(t *testing.T) {
	var h TopTotals
	for _, e := range []Total{{"a", 5}, {"b", 9}, {"c", 1}, {"d", 9}, {"e", 7}, {"f", 5}, {"g", 8}} {
		h.Offer(e, 4)
	}
	want := []Total{{"b", 9}, {"d", 9}, {"g", 8}, {"e", 7}}
	if got := h.Sorted(); !slices.Equal(got, want) {
		t.Fatalf("Sorted() = %v, want %v", got, want)
	}
	var ties TopTotals
	for _, e := range []Total{{"z", 3}, {"m", 3}, {"a", 3}} {
		ties.Offer(e, 2)
	}
	if got, want := ties.Sorted(), []Total{{"a", 3}, {"m", 3}}; !slices.Equal(got, want) {
		t.Fatalf("ties: Sorted() = %v, want %v", got, want)
	}
	var none TopTotals
	none.Offer(Total{"a", 1}, 0)
	if none.Len() != 0 {
		t.Fatalf("a bound of 0 kept %v", none)
	}
}
