// Package port finds free loopback TCP ports for the processes tests start.
//
// A port taken with Listen("127.0.0.1:0") and closed again comes from the
// kernel's ephemeral range, where the outgoing connections of every client
// on the machine take their local ports too: by the time the test's process
// binds it, one of those may hold it ("address already in use"). Free picks
// below that range instead, where only listeners bind.
package port

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the lowest port Free picks.
const lowest = 10_000

// Free returns a free 127.0.0.1:PORT below the ephemeral port range, or one
// the kernel picks when that range leaves no room below it.
func Free() (string, error) {
	top := ephemeralLow()
	for range 100 {
		if top <= lowest+100 {
			break
		}
		p := lowest + rand.IntN(top-lowest)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // taken: try another
		}
		addr := ln.Addr().String()
		if err := ln.Close(); err != nil {
			return "", err
		}
		return addr, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ephemeralLow returns the low end of the kernel's ephemeral port range
// (32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
