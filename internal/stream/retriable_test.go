package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestRetriable(t *testing.T) {
	// Scenario: start-up errors that go away by waiting (Kafka unreachable or not ready) are
	// retried, told apart by their types, not their text; a wrong topic layout is not.
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("describing topic x: %w", kerr.RequestTimedOut), true},
		{fmt.Errorf("describing topic x: %w", kerr.CoordinatorNotAvailable), true},
		{fmt.Errorf("describing topic x: %w", kerr.NotController), true},
		{fmt.Errorf("creating topic x: %w", kerr.LeaderNotAvailable), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{fmt.Errorf("reading: %w", io.EOF), true},
		{fmt.Errorf("attempt: %w", context.DeadlineExceeded), true},
		{&net.DNSError{Err: "no such host", Name: "kafka"}, true},
		{errors.New("topic x has 4 partitions but input topic y has 3: they must match"), false},
		{fmt.Errorf("creating topic x: %w", kerr.TopicAuthorizationFailed), false},
		{fmt.Errorf("creating topic x: %w", kerr.InvalidReplicationFactor), false},
		// Text that merely mentions a dial is not a network error.
		{errors.New("config says: unable to dial the moon"), false},
	} {
		if got := retriable(tc.err); got != tc.want {
			t.Errorf("retriable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
