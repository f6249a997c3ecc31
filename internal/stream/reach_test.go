package stream_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap/zapcore"

	th "github.com/salesagg/salesagg/test/harness"
)

func TestUnreachableKafkaIsNamedAtOnce(t *testing.T) {
	// Scenario: the service starts while nothing listens at its bootstrap address. Within a few
	// seconds it logs one warning naming the broker and "connection refused" (one, although its
	// clients retry many times meanwhile), and /readyz answers 503 "Kafka unreachable since T".
	// Once a broker listens there, the service logs that the broker is reachable again and turns
	// ready.
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	h := harnessOn(t, nil, addr)
	in := h.start(h.cfg)
	warnings := func() int {
		return in.logs.FilterMessageSnippet("Cannot connect to Kafka broker " + addr + ": connection refused").Len()
	}
	th.WaitFor(t, 10*time.Second, "a warning naming the broker", th.Holds(func() bool { return warnings() > 0 }))
	var reason string
	th.WaitFor(t, 10*time.Second, "/readyz to say Kafka is unreachable", th.Holds(func() bool {
		resp, err := http.Get(in.http.URL + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		reason = string(b)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(reason, "Kafka unreachable since ")
	}))
	if !strings.Contains(reason, "connection refused") {
		t.Errorf("/readyz says %q, want the cause too", reason)
	}
	// The clients keep retrying; the warning is not repeated within its interval.
	retried := time.Now()
	th.WaitFor(t, 10*time.Second, "three seconds of retries", th.Holds(func() bool { return time.Since(retried) > 3*time.Second }))
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings for one unreachable broker within seconds, want 1", n)
	}
	if n := in.logs.FilterMessageSnippet("unable to open connection").Len(); n != 0 {
		t.Fatalf("franz-go's per-retry line was logged %d times", n)
	}

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h.createInput(3)
	in.waitReady()
	if in.logs.FilterMessageSnippet("Kafka broker reachable again").Len() == 0 {
		t.Fatal("no line saying the broker is reachable again")
	}
}

func TestFirstStartLogsNoWarning(t *testing.T) {
	// Scenario: a first start on a fresh broker (topics created by the service, an empty state
	// dir), under each guarantee, folds events and logs nothing at WARN or above: nothing is
	// wrong, so an operator tailing the log sees no warning.
	eachGuarantee(t, func(t *testing.T, h *harness) {
		in := h.start(h.cfg)
		in.waitReady()
		in.waitTotals(spread(h, "f", 6, 2))
		for _, e := range in.logs.All() {
			if e.Level >= zapcore.WarnLevel {
				t.Errorf("first start logged %s %q %v", e.Level, e.Message, e.ContextMap())
			}
		}
	})
}
