package stream

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// At-least-once has no fencing: the broker appends whatever a producer
// sends, whenever it arrives. A member that drops its tasks without
// committing (its lease lapsed, or the group says they are lost) may have
// records of theirs in flight, held in a network partition: the sender's
// kernel keeps retransmitting them, and franz-go retries them on a new
// connection, so they can land once the partition heals, after the tasks'
// next owner wrote newer totals. A product's changelog value then goes down,
// and if that stale record is the product's last, compaction keeps it and
// every store rebuilt from the changelog is wrong. Exactly-once needs none
// of this: the late records belong to a transaction that never commits.
//
// So under at-least-once a drop cuts the tasks off first (cutOff): every
// record the client holds fails at once, the dropped tasks produce nothing
// more, and every connection of the group client is reset (a RST discards
// the bytes the kernel still holds unacknowledged). What is in flight then
// never lands; the tasks' next owner folds those events again from the
// committed offsets.

// errCutOff fails a record a task produces after it was cut off.
var errCutOff = errors.New("stream: the task was dropped without committing; nothing more of it is produced")

// brokerConns tracks the open broker connections of the group client, from
// franz-go's connect and disconnect hooks, so that a drop can reset them.
type brokerConns struct {
	mu   sync.Mutex
	open map[net.Conn]struct{} // guarded by mu
}

var (
	_ kgo.HookBrokerConnect    = (*brokerConns)(nil)
	_ kgo.HookBrokerDisconnect = (*brokerConns)(nil)
)

func (b *brokerConns) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, c net.Conn, err error) {
	if err != nil || c == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open == nil {
		b.open = map[net.Conn]struct{}{}
	}
	b.open[c] = struct{}{}
}

func (b *brokerConns) OnBrokerDisconnect(_ kgo.BrokerMetadata, c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.open, c)
}

// resetAll closes every open connection with a TCP RST, and returns how
// many it reset. franz-go sees them fail and dials again when it next
// needs a broker.
func (b *brokerConns) resetAll() int {
	b.mu.Lock()
	conns := make([]net.Conn, 0, len(b.open))
	for c := range b.open {
		conns = append(conns, c)
	}
	clear(b.open)
	b.mu.Unlock()
	for _, c := range conns {
		raw := c
		if tc, ok := c.(*tls.Conn); ok {
			raw = tc.NetConn()
		}
		if tcp, ok := raw.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0)
		}
		_ = raw.Close()
	}
	return len(conns)
}

// cutOff makes sure that nothing the tasks of ps produced lands after this
// call returns (at-least-once; see above). It runs before they are stopped,
// whose wait for their records would otherwise last until the partition
// heals. Every record the client holds fails, also those of tasks not in
// ps: their cycle fails and is folded again from the committed offsets.
func (s *session) cutOff(ps []int32) {
	cl := s.kc()
	if s.env.eos || cl == nil || len(ps) == 0 {
		return
	}
	// A task may be blocked in Produce on a full buffer while it holds its
	// produce lock: failing the buffered records lets it return.
	cl.UnsafeAbortBufferedRecords()
	for _, p := range ps {
		if t := s.reg.task(p); t != nil {
			t.cutOff()
		}
	}
	// What a task produced between the first abort and its cut.
	cl.UnsafeAbortBufferedRecords()
	n := s.conns.resetAll()
	s.env.log.Info("Cut the dropped tasks off: their records in flight failed, the broker connections reset so that none of them lands later",
		zap.Strings("tasks", taskNames(ps)), zap.Int("connections_reset", n))
}

// cutOff makes every record the task produces from now on fail with
// errCutOff; a produce in progress ends first.
func (t *task) cutOff() {
	t.out.cutMu.Lock()
	defer t.out.cutMu.Unlock()
	t.out.cut = true
}
