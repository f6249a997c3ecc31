package harness

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// echoServer is a TCP server on loopback that writes back what it reads,
// closed when the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// newProxy starts a FaultProxy on a free loopback port in front of target,
// closed when the test ends.
func newProxy(t *testing.T, target string) *FaultProxy {
	t.Helper()
	p, err := NewFaultProxy("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readN reads exactly n bytes within 5 s.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return b
}

// nothingArrives fails the test if c yields a byte within d.
func nothingArrives(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	b := make([]byte, 1)
	n, err := c.Read(b)
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %d bytes (%q), err %v; want nothing until the deadline", n, b[:n], err)
	}
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

func TestFaultProxyPass(t *testing.T) {
	// Scenario: in Pass mode bytes go both ways, and the proxy counts the connection and the bytes.
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	write(t, c, "hello")
	if got := readN(t, c, 5); string(got) != "hello" {
		t.Fatalf("echo through the proxy = %q, want hello", got)
	}
	if n := p.Conns(); n != 1 {
		t.Errorf("Conns() = %d, want 1", n)
	}
	// The proxy counts a write once it returned, which can be after the
	// client read it.
	WaitFor(t, 5*time.Second, "the proxy to count 5 bytes each way", Holds(func() bool {
		up, down := p.Forwarded()
		return up == 5 && down == 5
	}))
	if up, down := p.Forwarded(); up != 5 || down != 5 {
		t.Errorf("Forwarded() = %d, %d, want 5, 5", up, down)
	}
	// A half-close reaches the server, and the server's close the client.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read after CloseWrite = %d, %v; want EOF", n, err)
	}
	WaitFor(t, 5*time.Second, "the proxy to forget the closed connection", Holds(func() bool { return p.Conns() == 0 }))
}

func TestFaultProxyBlackholeThenPass(t *testing.T) {
	// Scenario: while blackholed nothing moves, on an open connection or a new one; Pass delivers the held bytes, in order.
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	write(t, c, "warm")
	readN(t, c, 4)

	p.Blackhole()
	if m := p.Mode(); m != "blackhole" {
		t.Fatalf("Mode() = %q, want blackhole", m)
	}
	write(t, c, "one,")
	write(t, c, "two,")
	write(t, c, "three")
	nothingArrives(t, c, 300*time.Millisecond)
	c2 := dial(t, p.Addr()) // accepted, and stalled too
	write(t, c2, "new")
	nothingArrives(t, c2, 100*time.Millisecond)
	if up, down := p.Forwarded(); up != 4 || down != 4 {
		t.Errorf("Forwarded() while blackholed = %d, %d, want 4, 4 (the warm-up only)", up, down)
	}
	if n := p.Conns(); n != 2 {
		t.Errorf("Conns() while blackholed = %d, want 2", n)
	}

	p.Pass()
	if got := readN(t, c, len("one,two,three")); string(got) != "one,two,three" {
		t.Fatalf("after Pass the first connection got %q, want one,two,three", got)
	}
	if got := readN(t, c2, 3); string(got) != "new" {
		t.Fatalf("after Pass the second connection got %q, want new", got)
	}
}

func TestFaultProxyBlackholeLosesWhatAResetSenderHeld(t *testing.T) {
	// Scenario: bytes sent into a partition are held, as the sender's kernel holds them
	// unacknowledged. A sender that closes its connection (FIN) has them delivered once the
	// partition heals, as TCP retransmits them; one that resets it (RST) loses them, as a reset
	// discards them: they never reach the target.
	for _, tc := range []struct {
		name  string
		close func(*net.TCPConn)
		want  int64 // bytes the target gets in all
	}{
		{"closed", func(c *net.TCPConn) { _ = c.Close() }, 4 + 5},
		{"reset", func(c *net.TCPConn) { _ = c.SetLinger(0); _ = c.Close() }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProxy(t, echoServer(t))
			c := dial(t, p.Addr())
			write(t, c, "warm")
			readN(t, c, 4)
			p.Blackhole()
			write(t, c, "stale")
			WaitFor(t, 5*time.Second, "the proxy to hold the 5 bytes", Holds(func() bool { up, _ := p.Held(); return up == 5 }))
			tc.close(c.(*net.TCPConn))
			if tc.name == "reset" {
				WaitFor(t, 5*time.Second, "the proxy to see the reset", Holds(func() bool { return p.Conns() == 0 }))
			}
			p.Pass()
			WaitFor(t, 5*time.Second, "the connection to end", Holds(func() bool { return p.Conns() == 0 }))
			if up, _ := p.Forwarded(); up != tc.want {
				t.Fatalf("the target got %d bytes, want %d", up, tc.want)
			}
		})
	}
}

func TestFaultProxyBlackholeStallsSender(t *testing.T) {
	// Scenario: a blackholed proxy reads nothing, so a client sending much more than the socket buffers hold blocks; Pass lets it finish, every byte echoed in order.
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	p.Blackhole()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		sent <- err
	}()
	select {
	case err := <-sent:
		t.Fatalf("a 16 MiB write through a blackholed proxy returned (%v), want it blocked", err)
	case <-time.After(300 * time.Millisecond):
	}
	p.Pass()
	got := make([]byte, len(payload))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("the echoed payload differs from what was sent")
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

func TestFaultProxyDrop(t *testing.T) {
	// Scenario: Drop resets open connections at once and new ones as they come; Pass accepts again.
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	write(t, c, "x")
	readN(t, c, 1)

	p.Drop()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
		t.Fatalf("read on a dropped connection = %d, %v; want a reset (or EOF) at once", n, err)
	}
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() after Drop = %d, want 0", n)
	}
	before := p.Accepted()
	c2, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err == nil {
		defer c2.Close()
		_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = c2.Write([]byte("y"))
		if n, err := c2.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
			t.Fatalf("read on a connection made while dropping = %d, %v; want it closed at once", n, err)
		}
	}
	WaitFor(t, 5*time.Second, "the proxy to accept (and reset) the new connection", Holds(func() bool { return p.Accepted() > before }))

	p.Pass()
	c3 := dial(t, p.Addr())
	write(t, c3, "z")
	if got := readN(t, c3, 1); string(got) != "z" {
		t.Fatalf("after Pass the echo = %q, want z", got)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

func TestFaultProxyDelay(t *testing.T) {
	// Scenario: with Delay(d) each direction forwards every chunk d late (an echo comes back after 2d at least), in order.
	const d = 150 * time.Millisecond
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	p.Delay(d)
	start := time.Now()
	write(t, c, "a")
	write(t, c, "b")
	write(t, c, "c")
	got := readN(t, c, 3)
	if took := time.Since(start); took < 2*d {
		t.Errorf("the echo came back after %s, want at least %s (%s each way)", took, 2*d, d)
	}
	if string(got) != "abc" {
		t.Fatalf("delayed echo = %q, want abc", got)
	}
	p.Pass()
	start = time.Now()
	write(t, c, "d")
	readN(t, c, 1)
	t.Logf("delayed echo ok; undelayed echo took %s", time.Since(start))
}

func TestFaultProxyCloseEndsEverything(t *testing.T) {
	// Scenario: Close closes the connections (a blackholed one too) and the listener, and ends every goroutine of the proxy.
	target := echoServer(t)
	before := runtime.NumGoroutine()
	p, err := NewFaultProxy("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	write(t, c, "x")
	readN(t, c, 1)
	p.Blackhole()
	write(t, c, "held")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
		t.Fatalf("read after Close = %d, %v; want the connection closed", n, err)
	}
	if c2, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c2.Close()
		t.Fatal("the closed proxy still accepts connections")
	}
	// The echo server's goroutine for the connection ends once it sees the close.
	WaitFor(t, 5*time.Second, "the goroutines to end", func() error {
		if n := runtime.NumGoroutine(); n > before {
			return errors.New("more goroutines than before the proxy")
		}
		return nil
	})
	if err := p.Close(); err != nil {
		t.Errorf("a second Close = %v, want nil", err)
	}
}

func TestFaultProxyLoopbackOnly(t *testing.T) {
	// Scenario: a proxy listens on and forwards to loopback addresses only.
	for _, tc := range [][2]string{{"0.0.0.0:0", "127.0.0.1:9"}, {"127.0.0.1:0", "192.0.2.1:9092"}, {"127.0.0.1", "127.0.0.1:9"}} {
		if p, err := NewFaultProxy(tc[0], tc[1]); err == nil {
			p.Close()
			t.Errorf("NewFaultProxy(%q, %q) = nil error, want one", tc[0], tc[1])
		}
	}
}
