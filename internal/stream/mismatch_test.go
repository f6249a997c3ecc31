package stream_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	th "github.com/salesagg/salesagg/test/harness"
)

func TestKeyProductMismatchFoldsUnderTheKeyCountedAndLogged(t *testing.T) {
	// Scenario: events whose record key and "product" field disagree are folded under the key
	// (as Kafka Streams' groupByKey does), and each is counted once, on the task that folds it,
	// in salesagg_events_folded_with_warning_total{reason="key_product_mismatch"} (0 before the
	// first one), with a rate-limited warning naming the key and the value. One arrives on its
	// key's partition, one on another partition and is forwarded to its owner first.
	h := newHarness(t)
	h.createInput(3)
	in := h.start(h.cfg)
	in.waitReady()
	mfs := in.scrape(t)
	for _, task := range []string{"0_0", "0_1", "0_2"} {
		if v, ok := seriesValue(mfs, "salesagg_events_folded_with_warning_total", map[string]string{"task": task, "reason": "key_product_mismatch"}); !ok || v != 0 {
			t.Errorf("before any event, salesagg_events_folded_with_warning_total{task=%q,reason=\"key_product_mismatch\"} = %v (present %v), want 0", task, v, ok)
		}
	}
	owner := sales.Partition([]byte("keyA"), 3)
	other := (owner + 1) % 3
	h.produce(event("keyA", "productA", 5), eventTo(other, "keyA", "productB", 7), event("same", "same", 1))
	in.waitTotals(map[string]int64{"keyA": 12, "same": 1})
	if got, code := in.total("productA"); code != http.StatusNotFound {
		t.Fatalf("productA = %d (http %d): the product field won over the key", got, code)
	}
	want := map[string]float64{}
	for _, task := range []string{"0_0", "0_1", "0_2"} {
		want[task] = 0
	}
	want[fmt.Sprintf("0_%d", owner)] = 2
	th.WaitFor(t, 30*time.Second, "the two mismatches counted on the owner's task", func() error {
		mfs := in.scrape(t)
		for task, w := range want {
			v, ok := seriesValue(mfs, "salesagg_events_folded_with_warning_total", map[string]string{"task": task, "reason": "key_product_mismatch"})
			if !ok || v != w {
				return fmt.Errorf("salesagg_events_folded_with_warning_total{task=%q,reason=\"key_product_mismatch\"} = %v (present %v), want %v", task, v, ok, w)
			}
		}
		return nil
	})
	lines := in.logs.FilterMessageSnippet("differs from its product field").All()
	if len(lines) != 2 {
		t.Fatalf("%d mismatch warnings, want 2: %v", len(lines), lines)
	}
	for _, l := range lines {
		f := l.ContextMap()
		if l.Level.String() != "warn" || f["key"] != `"keyA"` || !strings.Contains(f["value"].(string), "product") || f["reason"] != "key_product_mismatch" {
			t.Fatalf("mismatch warning = %s %q %v", l.Level, l.Message, f)
		}
	}
}
