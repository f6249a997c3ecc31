package state

import (
	"container/heap"
	"slices"
	"strings"
)

// TopTotals keeps the largest totals offered to it, at most a bound of them:
// a min-heap with the smallest kept on top (on equal totals, the larger
// product name, so that ties keep the products first by name). The zero
// value is empty; a TopTotals is used by one goroutine at a time.
type TopTotals []Total

func (h TopTotals) Len() int { return len(h) }
func (h TopTotals) Less(i, j int) bool {
	if h[i].Total != h[j].Total {
		return h[i].Total < h[j].Total
	}
	return h[i].Product > h[j].Product
}
func (h TopTotals) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

// Push and Pop are container/heap's; use Offer.
func (h *TopTotals) Push(x any) { *h = append(*h, x.(Total)) }
func (h *TopTotals) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Offer keeps e when it is among the k largest offered.
func (h *TopTotals) Offer(e Total, k int) {
	if h.Len() < k {
		heap.Push(h, e)
		return
	}
	if k == 0 {
		return
	}
	top := (*h)[0]
	if e.Total > top.Total || (e.Total == top.Total && e.Product < top.Product) {
		(*h)[0] = e
		heap.Fix(h, 0)
	}
}

// Sorted returns the totals kept, largest first (equal totals by product).
func (h TopTotals) Sorted() []Total {
	out := slices.Clone([]Total(h))
	SortByTotal(out)
	return out
}

// SortByTotal sorts totals largest first, equal totals by product.
func SortByTotal(ts []Total) {
	slices.SortFunc(ts, func(a, b Total) int {
		switch {
		case a.Total > b.Total:
			return -1
		case a.Total < b.Total:
			return 1
		}
		return strings.Compare(a.Product, b.Product)
	})
}
