package port

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeIsBelowTheEphemeralRange(t *testing.T) {
	// Scenario: the port returned can be bound, and lies below the range outgoing connections use.
	for range 20 {
		addr, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(p)
		if low := ephemeralLow(); low > lowest+100 && (n < lowest || n >= low) {
			t.Fatalf("port %d outside [%d, %d)", n, lowest, low)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("binding %s: %v", addr, err)
		}
		ln.Close()
	}
}
