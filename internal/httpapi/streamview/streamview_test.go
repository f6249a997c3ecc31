package streamview

import (
	"errors"
	"fmt"
	"testing"

	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/stream"
)

func TestQueryErrorsAreAnsweredAsTheRuntimeMeansThem(t *testing.T) {
	// Scenario: the runtime's not-hosted error names the same task and owner to httpapi, its
	// not-ready and not-hosted sentinels are marked unavailable (503), any other error is left as
	// it is; the text the answer serves is the runtime's, and the runtime's error stays in the chain.
	nh := &stream.NotHostedError{Task: "0_1", Partition: 1, Owner: "salesagg-2", Server: "127.0.0.3:8080", Unroutable: "advertises nothing usable"}
	err := queryError(fmt.Errorf("querying: %w", nh))
	var got *httpapi.NotHostedError
	if !errors.As(err, &got) {
		t.Fatalf("%v (%T) is not an httpapi.NotHostedError", err, err)
	}
	want := httpapi.NotHostedError{Task: "0_1", Partition: 1, Owner: "salesagg-2", Server: "127.0.0.3:8080", Unroutable: "advertises nothing usable"}
	if g := *got; g.Task != want.Task || g.Partition != want.Partition || g.Owner != want.Owner || g.Server != want.Server || g.Unroutable != want.Unroutable {
		t.Errorf("not hosted: got %+v, want %+v", g, want)
	}
	if err.Error() != "querying: "+nh.Error() || !errors.Is(err, stream.ErrNotHosted) {
		t.Errorf("not hosted: text %q, or the runtime's error lost", err)
	}

	for _, e := range []error{stream.ErrNotReady, fmt.Errorf("%w: task 0_1 is restoring", stream.ErrNotReady), stream.ErrNotHosted} {
		got := queryError(e)
		if !errors.Is(got, httpapi.ErrUnavailable) || !errors.Is(got, e) || got.Error() != e.Error() {
			t.Errorf("%q: got %q, unavailable %v", e, got, errors.Is(got, httpapi.ErrUnavailable))
		}
	}
	other := errors.New("pebble: closed")
	if got := queryError(other); got != other {
		t.Errorf("other error became %q (%T)", got, got)
	}
	if queryError(nil) != nil {
		t.Error("no error became one")
	}
}
