package stream_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/config"
)

func TestProducerIDLostToABrokerFailureStartsANewSession(t *testing.T) {
	// Scenario: exactly-once, the broker fails while the instance asks for its producer id: the
	// connection carrying InitProducerID closes, and the next connections close during their
	// API versions negotiation (a transaction coordinator killed at that moment). The client
	// keeps that failure, and the first Begin reports it. The instance must not exit: it starts
	// a new session with a new producer, becomes ready and folds every event exactly.
	h := newHarness(t)
	h.createInput(3)
	h.cfg.ProcessingGuarantee = config.ExactlyOnceV2
	var mu sync.Mutex
	initFails, versionFails := 1, 0
	h.cluster.ControlKey(kmsg.InitProducerID.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if initFails > 0 {
			initFails--
			versionFails = 5
			return nil, errors.New("broker failing"), true
		}
		return nil, nil, false
	})
	h.cluster.ControlKey(kmsg.ApiVersions.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		h.cluster.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if versionFails > 0 {
			versionFails--
			return nil, errors.New("broker failing"), true
		}
		return nil, nil, false
	})
	in := h.start(h.cfg)
	in.waitReady()
	h.produce(sampleEvents(t)...)
	in.waitTotals(sampleTotals)
	mu.Lock()
	defer mu.Unlock()
	if initFails != 0 {
		t.Fatal("InitProducerID never failed: the test tested nothing")
	}
	select {
	case err := <-in.done:
		t.Fatalf("the runtime ended: %v", err)
	default:
	}
	t.Logf("new sessions: %d", len(in.logs.FilterMessageSnippet("could not get its producer id").All()))
}
