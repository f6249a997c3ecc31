package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxyMode is what a FaultProxy does with the bytes of its connections.
type proxyMode int

const (
	// modePass forwards (after the proxy's delay, if any).
	modePass proxyMode = iota
	// modeBlackhole delivers no byte: the connections stay open, and what
	// they send is held (see FaultProxy).
	modeBlackhole
	// modeDrop resets every connection and each new one.
	modeDrop
)

func (m proxyMode) String() string {
	return [...]string{"pass", "blackhole", "drop"}[m]
}

// proxyChunk is the size of the buffer each direction of a connection reads
// into.
const proxyChunk = 32 << 10

// proxyQueue is how many chunks a direction holds read but not yet written
// (while it delays or blackholes them).
const proxyQueue = 1024

// proxyHold is how many bytes a blackholed direction reads and holds before
// it stops reading, about what a sender's socket buffer holds
// unacknowledged; past it TCP flow control stalls the sender.
const proxyHold = 1 << 20

// FaultProxy is a TCP proxy on loopback that forwards each connection it
// accepts to one target address, and injects faults on demand: Blackhole (a
// network partition), Drop (connections reset) and Delay. It starts in Pass
// mode. Its methods are safe for concurrent use.
//
// Each connection has two directions, client to target and target to
// client; each direction has a reader (socket to queue) and a writer (queue
// to socket) goroutine. Writers wait at the proxy's gate, which is open
// while the mode lets bytes move. A blackholed direction holds what it
// reads, as a partitioned sender's kernel holds its unacknowledged bytes: up
// to proxyHold bytes, past which it stops reading (so TCP flow control
// stalls the sender). Pass delivers what is held, late, as TCP does once a
// partition heals, and a FIN sent meanwhile after it. A sender that resets
// its connection meanwhile (a RST) loses what is held, as a reset discards
// the sender's unacknowledged bytes: nothing of it reaches the other side.
type FaultProxy struct {
	ln     net.Listener
	target string
	// ctx is canceled by Close (it ends dials to the target).
	ctx  context.Context
	stop context.CancelFunc
	// wg counts every goroutine of the proxy; Close waits for them.
	wg sync.WaitGroup

	toTarget, toClient atomic.Int64 // bytes written to the target, to clients

	mu       sync.Mutex
	mode     proxyMode               // guarded by mu
	delay    time.Duration           // guarded by mu; while in modePass
	gate     chan struct{}           // guarded by mu; closed while bytes may move
	conns    map[*proxyConn]struct{} // guarded by mu; the open connections
	isClosed bool                    // guarded by mu
	accepted int                     // guarded by mu; connections accepted in all
}

// chunk is bytes a direction read, and when they are due to be written.
type chunk struct {
	b  []byte
	at time.Time
}

// proxyConn is one proxied connection: the client's and the one the proxy
// dialed to the target.
type proxyConn struct {
	client, server *net.TCPConn
	// up is client to target, down target to client.
	up, down *direction
	// done is closed when the connection is torn down (once, by teardown).
	done chan struct{}
	once sync.Once
	// finished counts the directions that are done (reached EOF and
	// half-closed their destination); the second tears the connection down.
	finished atomic.Int32
}

// NewFaultProxy listens on listenAddr (127.0.0.1:PORT; port 0 picks one)
// and forwards each connection to targetAddr. Both must be loopback
// addresses.
func NewFaultProxy(listenAddr, targetAddr string) (*FaultProxy, error) {
	for _, a := range []string{listenAddr, targetAddr} {
		if err := checkLoopback(a); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	p := &FaultProxy{
		ln: ln, target: targetAddr,
		gate: make(chan struct{}), conns: map[*proxyConn]struct{}{},
	}
	p.ctx, p.stop = context.WithCancel(context.Background())
	close(p.gate) // Pass
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// checkLoopback returns an error unless addr is host:port with a loopback
// host.
func checkLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("fault proxy: address %q: %w", addr, err)
	}
	if _, err := strconv.Atoi(port); err != nil {
		return fmt.Errorf("fault proxy: address %q: port %q is not a number", addr, port)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("fault proxy: address %q is not on loopback", addr)
	}
	return nil
}

// Addr is the address the proxy listens on.
func (p *FaultProxy) Addr() string { return p.ln.Addr().String() }

// Target is the address it forwards to.
func (p *FaultProxy) Target() string { return p.target }

// Pass forwards both ways, at once: the default. Connections a Blackhole
// stalled resume where they were.
func (p *FaultProxy) Pass() { p.setMode(modePass, 0) }

// Delay forwards both ways, each chunk read written d later (in order per
// direction). Chunks already read keep the delay they were read with.
func (p *FaultProxy) Delay(d time.Duration) { p.setMode(modePass, d) }

// Blackhole partitions the connections from the target: they stay open,
// but no byte moves either way (what is sent is held, and senders stall
// once proxyHold and TCP's buffers fill). New connections are accepted,
// dialed to the target, and stall too. Pass afterwards delivers the bytes
// held, late; a connection its sender resets meanwhile delivers none.
func (p *FaultProxy) Blackhole() { p.setMode(modeBlackhole, 0) }

// Drop resets every connection at once (both sides see a TCP RST) and
// resets each new one as soon as it is accepted, until Pass or Delay.
func (p *FaultProxy) Drop() {
	p.setMode(modeDrop, 0)
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		p.teardown(c, true)
	}
}

// Mode names the mode: "pass", "blackhole" or "drop".
func (p *FaultProxy) Mode() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode.String()
}

func (p *FaultProxy) setMode(m proxyMode, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	open := m != modeBlackhole
	select {
	case <-p.gate: // open now
		if !open {
			p.gate = make(chan struct{})
		}
	default:
		if open {
			close(p.gate)
		}
	}
	p.mode, p.delay = m, d
}

// Conns is the number of open proxied connections.
func (p *FaultProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted is the number of connections accepted since the start,
// including those Drop reset at once.
func (p *FaultProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Held returns the bytes the open connections have read and not yet
// written, to the target and to the clients.
func (p *FaultProxy) Held() (toTarget, toClient int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		toTarget += c.up.held.Load()
		toClient += c.down.held.Load()
	}
	return toTarget, toClient
}

// Forwarded returns the bytes written so far to the target and to the
// clients.
func (p *FaultProxy) Forwarded() (toTarget, toClient int64) {
	return p.toTarget.Load(), p.toClient.Load()
}

// Close stops listening, closes every connection and returns once every
// goroutine of the proxy has ended. It is safe to call more than once.
func (p *FaultProxy) Close() error {
	p.mu.Lock()
	if p.isClosed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.isClosed = true
	p.stop()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		p.teardown(c, false)
	}
	p.wg.Wait()
	return err
}

func (p *FaultProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient error (e.g. too many open files): try again soon.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		tc := c.(*net.TCPConn)
		p.mu.Lock()
		p.accepted++
		closed, mode := p.isClosed, p.mode
		if !closed && mode != modeDrop {
			p.wg.Add(1)
		}
		p.mu.Unlock()
		switch {
		case closed:
			tc.Close()
			return
		case mode == modeDrop:
			reset(tc)
		default:
			go p.serve(tc)
		}
	}
}

// reset closes c with a TCP RST rather than a FIN.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// serve dials the target for client and starts the connection's four
// goroutines.
func (p *FaultProxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	var d net.Dialer
	sc, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		// The client sees what it would see of a target that is down.
		reset(client)
		return
	}
	server := sc.(*net.TCPConn)
	c := &proxyConn{client: client, server: server, done: make(chan struct{}),
		up: &direction{q: make(chan chunk, proxyQueue)}, down: &direction{q: make(chan chunk, proxyQueue)}}
	p.mu.Lock()
	if p.isClosed || p.mode == modeDrop {
		p.mu.Unlock()
		reset(client)
		reset(server)
		return
	}
	p.conns[c] = struct{}{}
	p.wg.Add(4)
	p.mu.Unlock()
	go p.read(c, client, c.up)
	go p.write(c, server, c.up, &p.toTarget)
	go p.read(c, server, c.down)
	go p.write(c, client, c.down, &p.toClient)
}

// direction is one way of a connection: its queue, and the bytes read into
// it not yet written.
type direction struct {
	q    chan chunk
	held atomic.Int64
}

// gateOpen reports whether bytes may move now.
func (p *FaultProxy) gateOpen() bool {
	p.mu.Lock()
	g := p.gate
	p.mu.Unlock()
	select {
	case <-g:
		return true
	default:
		return false
	}
}

// waitGate blocks until bytes may move, and reports false when the
// connection is torn down first.
func (p *FaultProxy) waitGate(c *proxyConn) bool {
	p.mu.Lock()
	g := p.gate
	p.mu.Unlock()
	select {
	case <-g:
		return true
	case <-c.done:
		return false
	}
}

// read moves what src sends to the direction's queue, each chunk with the
// time it is due; while the gate is closed it reads on until proxyHold bytes
// are held. It closes the queue at EOF; on an error (a reset) it tears the
// connection down, and what was held is never written.
func (p *FaultProxy) read(c *proxyConn, src *net.TCPConn, d *direction) {
	defer p.wg.Done()
	defer close(d.q)
	buf := make([]byte, proxyChunk)
	for {
		if d.held.Load() >= proxyHold && !p.gateOpen() && !p.waitGate(c) {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			at := time.Now().Add(p.delay)
			p.mu.Unlock()
			d.held.Add(int64(n))
			select {
			case d.q <- chunk{b: append([]byte(nil), buf[:n]...), at: at}:
			case <-c.done:
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.teardown(c, false)
			}
			return
		}
	}
}

// write writes the chunks of the direction's queue to dst, each once it is
// due and the gate is open, counting the bytes in n. When the queue ends
// (the other side's EOF) it half-closes dst.
func (p *FaultProxy) write(c *proxyConn, dst *net.TCPConn, d *direction, n *atomic.Int64) {
	defer p.wg.Done()
	for {
		var ch chunk
		var ok bool
		select {
		case ch, ok = <-d.q:
		case <-c.done:
			return
		}
		if !ok {
			break
		}
		if wait := time.Until(ch.at); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return
			}
		}
		if !p.waitGate(c) {
			return
		}
		select {
		case <-c.done: // reset while the chunk waited: it is lost
			return
		default:
		}
		w, err := dst.Write(ch.b)
		n.Add(int64(w))
		d.held.Add(-int64(len(ch.b)))
		if err != nil {
			p.teardown(c, false)
			return
		}
	}
	_ = dst.CloseWrite()
	if c.finished.Add(1) == 2 {
		p.teardown(c, false)
	}
}

// teardown closes both sides of c (with a RST when rst) and forgets it.
func (p *FaultProxy) teardown(c *proxyConn, rst bool) {
	c.once.Do(func() {
		close(c.done)
		if rst {
			reset(c.client)
			reset(c.server)
		} else {
			_ = c.client.Close()
			_ = c.server.Close()
		}
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	})
}

// ProxySet is one FaultProxy per node of a KafkaCluster, for one of its
// client listeners (KAFKA_CLIENT_LISTENERS): each listens on the port the
// node advertises for that listener and forwards to the port the node
// listens on. A client that bootstraps through Bootstrap gets metadata that
// names only these proxies, so every connection it makes goes through them,
// and faults on them cut that client off (from one node or all) and no
// other. Its fields are set by NewProxySet and only read after.
type ProxySet struct {
	listener int
	nodes    []int32
	proxies  map[int32]*FaultProxy
}

// NewProxySet starts the proxies of client listener k (1-based) of c.
func NewProxySet(c *KafkaCluster, k int) (*ProxySet, error) {
	ls, err := c.Listener(k)
	if err != nil {
		return nil, err
	}
	s := &ProxySet{listener: k, proxies: map[int32]*FaultProxy{}}
	for _, l := range ls {
		p, err := NewFaultProxy(l.AdvertisedAddr(), l.ListenAddr())
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("proxy of node %d, %s: %w", l.Node, l.Name, err)
		}
		s.nodes = append(s.nodes, l.Node)
		s.proxies[l.Node] = p
	}
	return s, nil
}

// StartProxySet is NewProxySet for a test: it fails the test on an error
// and closes the proxies when the test ends.
func StartProxySet(t testing.TB, c *KafkaCluster, k int) *ProxySet {
	t.Helper()
	s, err := NewProxySet(c, k)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Bootstrap is the comma-separated addresses of the proxies, in node order.
func (s *ProxySet) Bootstrap() string {
	addrs := make([]string, 0, len(s.nodes))
	for _, n := range s.nodes {
		addrs = append(addrs, s.proxies[n].Addr())
	}
	return strings.Join(addrs, ",")
}

// Proxy is the proxy in front of node; it panics for a node not in the
// set.
func (s *ProxySet) Proxy(node int32) *FaultProxy {
	p, ok := s.proxies[node]
	if !ok {
		panic(fmt.Sprintf("harness: no proxy for node %d (listener CLIENT%d has nodes %v)", node, s.listener, s.nodes))
	}
	return p
}

// Blackhole partitions node from the set's clients.
func (s *ProxySet) Blackhole(node int32) { s.Proxy(node).Blackhole() }

// BlackholeAll partitions every node from the set's clients.
func (s *ProxySet) BlackholeAll() {
	for _, n := range s.nodes {
		s.proxies[n].Blackhole()
	}
}

// Drop resets the set's connections to node, and new ones, until Pass.
func (s *ProxySet) Drop(node int32) { s.Proxy(node).Drop() }

// Pass heals node: bytes move again, at once.
func (s *ProxySet) Pass(node int32) { s.Proxy(node).Pass() }

// PassAll heals every node.
func (s *ProxySet) PassAll() {
	for _, n := range s.nodes {
		s.proxies[n].Pass()
	}
}

// Delay delays the set's traffic with node by d each way.
func (s *ProxySet) Delay(node int32, d time.Duration) { s.Proxy(node).Delay(d) }

// Close closes every proxy of the set.
func (s *ProxySet) Close() {
	for _, p := range s.proxies {
		_ = p.Close()
	}
}
