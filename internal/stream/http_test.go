package stream_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRestoringTaskIsNotReadyAndOthersServe(t *testing.T) {
	// Scenario: while one task restores, /readyz is 503 naming it and its products answer 503,
	// while the other tasks already process and answer (invariant 4).
	h := newHarness(t)
	h.createInput(3)
	// Two products owned by different partitions.
	var held, free string
	for i := 0; held == "" || free == ""; i++ {
		p := "item" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		switch sales.Partition([]byte(p), 3) {
		case 1:
			held = p
		case 2:
			free = p
		}
	}
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	in := h.startWith(h.cfg, stream.Knobs{BeforeRestore: func(ctx context.Context, p int32) {
		if p == 1 {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
	}})
	t.Cleanup(release) // runs before the instance stops, even if an assertion fails
	h.produce(event(held, held, 5), event(free, free, 7))
	th.WaitFor(t, 30*time.Second, "the free task to serve", th.Holds(func() bool {
		total, _ := in.total(free)
		return total == 7
	}))
	// Once the other tasks run, the restoring one is what keeps the process not ready.
	th.WaitFor(t, 30*time.Second, "/readyz to name the restoring task", th.Holds(func() bool {
		code, body := get(t, in.http.URL+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "task 0_1 is restoring")
	}))
	if code, body := get(t, in.http.URL+"/v1/products/"+held); code != http.StatusServiceUnavailable {
		t.Fatalf("product of the restoring task = %d %s", code, body)
	}
	if code, body := get(t, in.http.URL+"/v1/products"); code != http.StatusOK || !strings.Contains(body, `"unavailable_tasks":["0_1"]`) || !strings.Contains(body, free) {
		t.Fatalf("/v1/products while 0_1 restores = %d %s", code, body)
	}
	if code, body := get(t, in.http.URL+"/v1/tasks"); code != http.StatusOK || !strings.Contains(body, `"task":"0_1","partition":1,"role":"active","state":"restoring"`) {
		t.Fatalf("/v1/tasks = %d %s", code, body)
	}
	release()
	in.waitReady()
	in.waitTotals(map[string]int64{held: 5, free: 7})

	if code, _ := get(t, in.http.URL+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	if code, _ := get(t, in.http.URL+"/v1/products?limit=0"); code != http.StatusBadRequest {
		t.Fatalf("limit=0 = %d, want 400", code)
	}
	// A parameter a route does not take is refused and named, never ignored.
	for path, want := range map[string]string{
		"/v1/products?sort=total&limit=2&order=desc": "unknown query parameter(s) order: /v1/products takes only limit, after, sort, standby",
		"/v1/products?sort=name":                     `sort must be product (the default) or total, not \"name\"`,
		"/v1/products?sort=total&after=" + held:      "after pages by product; with sort=total ask for up to limit=1000 instead",
		"/v1/products/" + held + "?window=1h":        "unknown query parameter(s) window: /v1/products/" + held + " takes only local, stale",
		"/v1/tasks?verbose=1&all=1":                  "unknown query parameter(s) all, verbose: /v1/tasks takes no query parameters",
		"/v1/products?standby=x":                     `standby must name a task (0_ and its partition, such as 0_2), not \"x\"`,
	} {
		if code, body := get(t, in.http.URL+path); code != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("GET %s = %d %s, want 400 with %q", path, code, body, want)
		}
	}
	if code, body := get(t, in.http.URL+"/v1/products?sort=total&limit=1"); code != http.StatusOK ||
		body != fmt.Sprintf(`{"products":[{"product":%q,"total":7}],"sort":"total"}`, free)+"\n" {
		t.Errorf("/v1/products?sort=total&limit=1 = %d %q", code, body)
	}
	code, body := get(t, in.http.URL+"/metrics")
	for _, want := range []string{"salesagg_ready 1", `salesagg_events_processed_total{task="0_1"} 1`, "# TYPE salesagg_input_lag_records gauge",
		"# TYPE go_goroutines gauge", "process_resident_memory_bytes"} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, body)
		}
	}
}
