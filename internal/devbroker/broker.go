// Package devbroker runs the embedded development broker: franz-go's kfake,
// a Kafka-protocol broker in this process, persisting to a data directory so
// that it survives its own restart. It is for laptops and tests, not for
// production.
package devbroker

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"
)

// Options configure Start.
type Options struct {
	// DataDir persists topics, records and group offsets; empty keeps
	// everything in memory.
	DataDir string
	// Listen is host:port; port 0 picks a free one.
	Listen string
	// CompactEvery is the period of log compaction in milliseconds; 0 means
	// ten minutes.
	CompactEvery int64
	Log          *zap.Logger
}

// Broker is a running embedded broker.
type Broker struct {
	c     *kfake.Cluster
	fixes *fixes
}

// Start starts the broker.
func Start(o Options) (*Broker, error) {
	host, portStr, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return nil, fmt.Errorf("parsing listen address %q: %w", o.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("parsing listen address %q: bad port", o.Listen)
	}
	if o.CompactEvery == 0 {
		o.CompactEvery = 600_000
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			// kfake listens on 127.0.0.1; honour the host asked for.
			_, p, _ := net.SplitHostPort(addr)
			return net.Listen(network, net.JoinHostPort(host, p))
		}),
		kfake.WithLogger(logger{o.Log.Sugar()}),
		kfake.BrokerConfigs(map[string]string{
			"log.cleaner.backoff.ms":               strconv.FormatInt(o.CompactEvery, 10),
			"group.consumer.heartbeat.interval.ms": "500",
		}),
	}
	if o.DataDir != "" {
		if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("creating broker data dir %s: %w", o.DataDir, err)
		}
		opts = append(opts, kfake.DataDir(o.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("starting embedded broker on %s: %w", o.Listen, err)
	}
	return &Broker{c: c, fixes: installFixes(c, c.ListenAddrs()[0], o.Log)}, nil
}

// Addr returns the address clients bootstrap from.
func (b *Broker) Addr() string { return b.c.ListenAddrs()[0] }

// Compact compacts every compacted topic now.
func (b *Broker) Compact() { b.c.Compact() }

// Close stops the broker, persisting its state.
func (b *Broker) Close() {
	b.c.Close()
	b.fixes.close()
}

type logger struct{ s *zap.SugaredLogger }

func (l logger) Logf(level kfake.LogLevel, msg string, args ...any) {
	switch level {
	case kfake.LogLevelError:
		l.s.Errorf(msg, args...)
	case kfake.LogLevelWarn:
		l.s.Debugf(msg, args...) // request failures the clients retry
	default:
	}
}
