package stream_test

import (
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
)

func TestFirstStartLogsNoErrorFieldAtInfo(t *testing.T) {
	// Scenario: a first start (no topics, no state) creates the topics, joins, folds the sample
	// events and stops cleanly; no INFO line carries an error field (the changelog being new
	// is expected then, not an error: UNKNOWN_TOPIC_OR_PARTITION while its end offsets are not
	// listed yet is said in words), and a line about the changelog's end offsets says it is new.
	h := newHarness(t)
	in := h.start(h.cfg)
	in.waitReady()
	h.produce(sampleEvents(t)...)
	in.waitTotals(sampleTotals)
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	for _, e := range in.logs.All() {
		f := e.ContextMap()
		if e.Level <= zapcore.InfoLevel {
			if err, ok := f["error"]; ok {
				t.Errorf("an INFO line of a first start has an error field: %q error=%v", e.Message, err)
			}
		}
		if e.Level == zapcore.InfoLevel && strings.Contains(e.Message, "end offsets") && !strings.Contains(e.Message, "is new") {
			t.Errorf("a line about the changelog's end offsets does not say it is new: %s %q %v", e.Level, e.Message, f)
		}
	}
}
