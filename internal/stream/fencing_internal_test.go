package stream

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestFencingsTellTheBrokersTimeoutFromAnotherProducer(t *testing.T) {
	// Scenario: the age a fencing carries decides whether it was the broker's transaction
	// timeout (this process's own, never counted) or another producer taking the transactional
	// id. Moves: a cycle opens a transaction; End fails or succeeds; the client reports the
	// fencing at End, or only at the next Begin after an abort it took as done (seen in the
	// cluster torture: an abort after Kafka was unreachable 28 s "succeeded", and Begin then
	// said PRODUCER_FENCED).
	const timeout = 10 * time.Second
	opened := func(e *exactlyOnce, ago time.Duration) {
		at := time.Now().Add(-ago)
		e.openSince.Store(&at)
	}
	age := func(t *testing.T, err error) *fencing {
		t.Helper()
		var f *fencing
		if !errors.As(err, &f) || !errors.Is(err, errSessionFenced) || !errors.Is(err, kerr.ProducerFenced) {
			t.Fatalf("%v is not a fencing of the session", err)
		}
		return f
	}
	for _, c := range []struct {
		name     string
		run      func(e *exactlyOnce) error
		timedOut bool
		ends     bool // the case ends its transaction
	}{
		{"fenced at End, the transaction open past the timeout", func(e *exactlyOnce) error {
			opened(e, 12*time.Second)
			return e.fenced(kerr.ProducerFenced)
		}, true, false},
		{"fenced at End within a commit interval", func(e *exactlyOnce) error {
			opened(e, 300*time.Millisecond)
			return e.fenced(kerr.ProducerFenced)
		}, false, false},
		{"fenced at Begin after an abort of a long transaction", func(e *exactlyOnce) error {
			opened(e, 28*time.Second)
			e.ended()
			return e.beginFailed(kerr.ProducerFenced)
		}, true, true},
		{"fenced at Begin after a short transaction", func(e *exactlyOnce) error {
			opened(e, 200*time.Millisecond)
			e.ended()
			return e.beginFailed(kerr.ProducerFenced)
		}, false, true},
		{"fenced at the session's first Begin", func(e *exactlyOnce) error {
			return e.beginFailed(kerr.ProducerFenced)
		}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := &exactlyOnce{}
			f := age(t, c.run(e))
			if got := f.timedOut(timeout); got != c.timedOut {
				t.Fatalf("open %s: timed out %v, want %v", f.open, got, c.timedOut)
			}
			if c.ends && e.openSince.Load() != nil {
				t.Fatal("an ended transaction is still taken as open")
			}
		})
	}
	if err := (&exactlyOnce{}).fenced(errors.New("dial failed")); errors.Is(err, errSessionFenced) {
		t.Fatal("a dial failure taken for a fencing")
	}
}
