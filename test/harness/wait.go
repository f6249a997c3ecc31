package harness

import (
	"errors"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/port"
)

// ErrGiveUp, wrapped in the error a condition returns, ends a wait at once:
// the condition can no longer come true (the process it asks has exited).
var ErrGiveUp = errors.New("harness: giving up")

// Poll calls cond until it returns nil. It returns nil then, or cond's last
// error once timeout has passed, or at once when that error wraps ErrGiveUp.
//
// It polls every 50 ms at first, slowing to every 250 ms: a condition that
// holds soon is seen soon, and a long wait (a condition that reads a topic or
// runs a command) does not load the machine.
func Poll(timeout time.Duration, cond func() error) error {
	_, err := poll(timeout, cond)
	return err
}

// WaitFor waits, as Poll, for cond and fails the test naming what and cond's
// last error when it does not hold in time. It returns how long it waited.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	took, err := poll(timeout, cond)
	switch {
	case errors.Is(err, ErrGiveUp):
		t.Fatalf("waiting for %s: %v", what, err)
	case err != nil:
		t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
	}
	return took
}

// Expect is WaitFor reporting a timeout with t.Errorf, so that the scenario
// goes on and one run shows every property that fails. It reports whether
// cond held in time.
func Expect(t testing.TB, timeout time.Duration, what string, cond func() error) bool {
	t.Helper()
	if _, err := poll(timeout, cond); err != nil {
		t.Errorf("timed out after %s waiting for %s: %v", timeout, what, err)
		return false
	}
	return true
}

func poll(timeout time.Duration, cond func() error) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	every := 50 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return time.Since(start), nil
		}
		if errors.Is(err, ErrGiveUp) || time.Now().After(deadline) {
			return time.Since(start), err
		}
		time.Sleep(every)
		every = min(every*3/2, 250*time.Millisecond)
	}
}

// FreeAddr returns a free 127.0.0.1:PORT for a process the test starts, from
// test/port (below the kernel's ephemeral range, where no client's outgoing
// connection takes it first).
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := port.Free()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// errNotYet is the error Holds gives while its condition does not hold.
var errNotYet = errors.New("the condition does not hold yet")

// Holds turns a yes-or-no condition into one for WaitFor, Expect and Poll.
func Holds(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}
}
