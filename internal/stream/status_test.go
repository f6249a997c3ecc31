package stream_test

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

// startWithRecentLog is startWith with the runtime's logger teed into recent
// and the status page showing it, as the service wires them.
func (h *harness) startWithRecentLog(cfg config.Config, knobs stream.Knobs, recent *httpapi.RecentLog) *instance {
	h.t.Helper()
	return h.launch(cfg, knobs, recent)
}

// taskRow returns the status page's row of an active task.
func taskRow(body, task string) string {
	return regexp.MustCompile(`(?s)<tr data-task="` + task + `" data-role="active".*?</tr>`).FindString(body)
}

func TestStatusPageDuringHeldRestore(t *testing.T) {
	// Scenario: on a real runtime, while task 0_1's restore is held, GET / shows every task with its
	// state, a progress bar in 0_1's row, the readiness reason, this instance in the group, the top
	// products with a hostile product name escaped, the bad event counted and its warning among the
	// last errors; once the restore is released, 0_1 runs, its bar is gone and the instance is ready.
	h := newHarness(t)
	h.createInput(3)
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	recent := httpapi.NewRecentLog(50, zapcore.WarnLevel)
	in := h.startWithRecentLog(h.cfg, stream.Knobs{BeforeRestore: func(ctx context.Context, p int32) {
		if p == 1 {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
	}}, recent)
	t.Cleanup(release)

	hostile := productOn(`<img src=x onerror="alert(1)">&`, 0, 3)
	plain := productOn("plain-", 2, 3)
	held := productOn("held-", 1, 3)
	bad := eventTo(0, "k", "", 0)
	bad.Value = []byte("not json")
	h.produce(event(hostile, hostile, 7000), event(plain, plain, 300), event(held, held, 5), bad)

	var body string
	th.WaitFor(t, 30*time.Second, "the status page to show the held restore and the top products", th.Holds(func() bool {
		code, b := get(t, in.http.URL+"/")
		body = b
		return code == 200 && strings.Contains(taskRow(b, "0_1"), "<progress") &&
			strings.Contains(b, `<td data-label="total" class="n">7,000</td>`) && strings.Contains(b, `<td data-label="total" class="n">300</td>`) &&
			strings.Contains(b, "Skipping bad event") &&
			strings.Contains(taskRow(b, "0_0"), `data-state="running"`) && strings.Contains(taskRow(b, "0_2"), `data-state="running"`)
	}))
	row := taskRow(body, "0_1")
	for _, want := range []string{`data-state="restoring"`, `<progress class="restore" aria-label="restore of 0_1"`, "restoring"} {
		if !strings.Contains(row, want) {
			t.Errorf("0_1 row lacks %q: %s", want, row)
		}
	}
	for _, want := range []string{
		"not ready", "task 0_1 is restoring", in.rt.InstanceID(), in.http.Listener.Addr().String(), "this instance",
		"&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;", // the hostile product, escaped
		`<dd id="bad-events">1</dd>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, "<img") {
		t.Errorf("the hostile product name is not escaped")
	}
	if i, j := strings.Index(body, "onerror"), strings.Index(body, plain); i < 0 || j < 0 || i > j {
		t.Errorf("top products not largest first")
	}

	release()
	in.waitReady()
	th.WaitFor(t, 10*time.Second, "0_1 to show as running", th.Holds(func() bool {
		_, b := get(t, in.http.URL+"/")
		body = b
		return strings.Contains(taskRow(b, "0_1"), `data-state="running"`)
	}))
	if strings.Contains(body, "<progress") || !strings.Contains(body, `<span id="readiness" class="badge ok">ready</span>`) {
		t.Fatalf("after the restore:\n%s", body)
	}
	// The refresh fragment renders the same sections without the page around them.
	if code, part := get(t, in.http.URL+"/?part=main"); code != 200 || strings.Contains(part, "<html") || !strings.Contains(part, `data-task="0_1"`) {
		t.Fatalf("/?part=main = %d\n%.300s", code, part)
	}
}
