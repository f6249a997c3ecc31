package stream

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// reachWarnEvery is how often a broker that stays unreachable is logged
// again.
const reachWarnEvery = 30 * time.Second

// reachability is what the process knows of its connections to the
// brokers, from the connect hook of every client it makes: which brokers
// it cannot reach, since when and why. It logs one warning per broker per
// reachWarnEvery (franz-go's own per-retry lines are dropped, see
// quietDials) and a line when a broker answers again.
type reachability struct {
	log *zap.Logger
	now func() time.Time

	mu sync.Mutex // guards brokers and the brokerReach values in it
	// brokers holds the latest connect outcome per broker address; guarded
	// by mu, and so is each *brokerReach it points to.
	brokers map[string]*brokerReach
}

// brokerReach is one broker's latest connect outcome; its fields are
// guarded by the reachability's mu.
type brokerReach struct {
	ok bool
	// since is when the broker's current run of failures began.
	since time.Time
	err   error
	// warned is when the run was last logged; suppressed counts the
	// failures since then.
	warned     time.Time
	suppressed int
}

func newReachability(log *zap.Logger) *reachability {
	return &reachability{log: log, now: time.Now, brokers: map[string]*brokerReach{}}
}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (r *reachability) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	r.connected(net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))), err)
}

// connected records one connect outcome for the broker at addr.
func (r *reachability) connected(addr string, err error) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.brokers[addr]
	if b == nil {
		b = &brokerReach{ok: true}
		r.brokers[addr] = b
	}
	if err == nil {
		if !b.ok {
			r.log.Info("Kafka broker reachable again", zap.String("broker", addr),
				zap.Duration("unreachable_for", now.Sub(b.since).Round(time.Millisecond)))
		}
		*b = brokerReach{ok: true}
		return
	}
	if b.ok {
		*b = brokerReach{since: now}
	}
	b.err = err
	if !b.warned.IsZero() && now.Sub(b.warned) < reachWarnEvery {
		b.suppressed++
		return
	}
	r.log.Warn(fmt.Sprintf("Cannot connect to Kafka broker %s: %s", addr, describeDial(err)),
		zap.String("broker", addr), zap.Time("since", b.since), zap.Int("suppressed", b.suppressed), zap.Error(err))
	b.warned, b.suppressed = now, 0
}

// unreachable reports whether no broker the process tried answers: every
// broker's latest connect failed. since is when the earliest current run
// of failures began, and err the latest error.
func (r *reachability) unreachable() (since time.Time, err error, down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.brokers) == 0 {
		return time.Time{}, nil, false
	}
	var latest time.Time
	for _, b := range r.brokers {
		if b.ok {
			return time.Time{}, nil, false
		}
		if since.IsZero() || b.since.Before(since) {
			since = b.since
		}
		if b.since.After(latest) || err == nil {
			latest, err = b.since, b.err
		}
	}
	return since, err, true
}

// describeDial says in a few words why a connection failed, the way an
// operator reads it: "connection refused", "no such host", a TLS hint.
func describeDial(err error) string {
	var dns *net.DNSError
	switch {
	case errors.As(err, &dns) && dns.IsNotFound:
		return "no such host"
	case errors.Is(err, io.EOF):
		return "the connection was closed at once (is TLS expected, or not expected, by the broker?)"
	case strings.Contains(err.Error(), "connection refused"):
		return "connection refused"
	case strings.Contains(err.Error(), "i/o timeout"):
		return "timed out"
	}
	return err.Error()
}

// quietDials is a kgo.Logger that drops franz-go's own per-retry lines
// about failed connections (reachability logs those once per broker per
// interval instead), and lets each of its other warnings and errors through
// once per kafkaLogRepeatEvery, with how many were suppressed meanwhile: a
// broker failing over makes the client retry, and say so, many times a
// second.
type quietDials struct {
	kgo.Logger
	repeats *logRepeats
}

func (q quietDials) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if strings.HasPrefix(msg, "unable to open connection to broker") {
		return
	}
	if level <= kgo.LogLevelWarn && q.repeats != nil {
		ok, suppressed := q.repeats.allow(msg, time.Now())
		if !ok {
			return
		}
		if suppressed > 0 {
			keyvals = append(keyvals, "suppressed_since_last", suppressed)
		}
	}
	q.Logger.Log(level, msg, keyvals...)
}

// kafkaLogRepeatEvery is how often one franz-go warning is let through.
const kafkaLogRepeatEvery = 30 * time.Second

// logRepeats limits each message to one line per kafkaLogRepeatEvery.
type logRepeats struct {
	mu sync.Mutex // guards last and suppressed
	// last is when each message was last let through; suppressed counts
	// its lines dropped since. Guarded by mu.
	last       map[string]time.Time
	suppressed map[string]int
}

func newLogRepeats() *logRepeats {
	return &logRepeats{last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// allow reports whether msg is let through at now, and how many of its
// lines were dropped since the last one.
func (r *logRepeats) allow(msg string, now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if last, ok := r.last[msg]; ok && now.Sub(last) < kafkaLogRepeatEvery {
		r.suppressed[msg]++
		return false, 0
	}
	n := r.suppressed[msg]
	r.last[msg], r.suppressed[msg] = now, 0
	return true, n
}
