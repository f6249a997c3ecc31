// Package config loads salesagg's configuration from a YAML file,
// SALESAGG_<KEY> environment variables and command-line flags, in rising
// precedence, into a typed Config, and validates it. It is the only package
// that knows about viper.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
)

// Guarantees accepted by processing.guarantee.
const (
	AtLeastOnce   = "at_least_once"
	ExactlyOnceV2 = "exactly_once_v2"
)

// Group protocols accepted by group.protocol.
const (
	GroupProtocolClassic = "classic"
	GroupProtocolStreams = "streams"
)

// Config is salesagg's configuration. The zero value is not valid; use Load
// or Default.
type Config struct {
	ApplicationID         string
	BootstrapServers      []string
	StateDir              string
	InputTopic            string
	NotificationTopic     string
	StoreName             string
	NotificationThreshold int64
	ProcessingGuarantee   string
	GroupProtocol         string
	// RepartitionPurgeInterval is how often a streams group member deletes
	// the committed records of its tasks' repartition partitions
	// (repartition.purge.interval.ms).
	RepartitionPurgeInterval time.Duration
	AutoOffsetReset          string
	CommitInterval           time.Duration
	// CommitIdle is how long a task that has read all its input waits for
	// more before it commits without waiting for the interval
	// (commit.idle.ms; 0: only on the interval).
	CommitIdle   time.Duration
	TopicsCreate bool
	// TopicsCreateInput creates a missing input topic; without it a
	// missing input topic stops the start.
	TopicsCreateInput bool
	TopicsPartitions  int32
	ReplicationFactor int16
	HTTPAddr          string
	// HTTPPprof serves Go's profiles (net/http/pprof) under /debug/pprof/
	// on the HTTP server.
	HTTPPprof bool
	// ApplicationServer is the host:port other instances reach this one's
	// HTTP server at; empty means derived (AdvertisedServer).
	ApplicationServer string
	// HTTP is the HTTP server's TLS, authentication and limits.
	HTTP HTTPSecurity
	// DLQTopic, when set, receives every bad event as it was read, with
	// headers naming its source and the error. Empty: bad events are
	// skipped (and counted).
	DLQTopic string
	// DLQMaxRecordBytes bounds a dead-letter record (key, value and
	// headers): a bigger bad event is cut to fit and marked so.
	DLQMaxRecordBytes int64
	// TaskTimeout is how long a task may keep failing (a restore that
	// errors, a cycle whose records cannot be produced) while it retries
	// before the process reports itself unhealthy; it retries on.
	TaskTimeout time.Duration
	// Security of the Kafka connections.
	Security Security
	// Windows are the windowed totals (off without sizes).
	Windows Windows

	// GroupInstanceID is this process's static group membership id
	// (KIP-345): a restart within the session timeout gets its partitions
	// back without a rebalance. Empty means derive it: the runtime uses the
	// process id kept in the state dir, so it follows the volume and no two
	// processes share it.
	GroupInstanceID string
	SessionTimeout  time.Duration
	// LeaveGroupOnClose makes a clean shutdown leave the group at once
	// (LeaveGroup with the group instance id), so the member's tasks move
	// without waiting for the session timeout. False keeps its tasks
	// assigned until it returns, for a rolling restart.
	LeaveGroupOnClose bool

	// NumStandbyReplicas is how many standby copies of each task other
	// members keep: they tail the task's changelog into a local store, so a
	// failover restores only what they lack.
	NumStandbyReplicas int
	// AcceptableRecoveryLag is how far (changelog records) a member's store
	// may be behind the changelog end and still count as caught up: the
	// balancer gives an active task only to a caught-up member when one
	// exists.
	AcceptableRecoveryLag int64
	// MaxWarmupReplicas bounds the warm-up copies built at once: a task
	// whose balanced place is a cold member stays on a caught-up one while
	// a warm-up copy catches up on the cold one.
	MaxWarmupReplicas int
	// ProbingRebalanceInterval is how often a member with warm-up copies
	// rejoins to let the balancer move tasks to warm-ups that caught up
	// (a warm-up that catches up rejoins at once).
	ProbingRebalanceInterval time.Duration

	// TransactionTimeoutSet is transaction.timeout.ms when set (0: derived,
	// see TransactionTimeout).
	TransactionTimeoutSet time.Duration
	// CompressionType is the compression of the records produced (changelog,
	// notifications, repartition): none, gzip, snappy, lz4 or zstd.
	CompressionType string
	// CacheMaxBytes bounds the entries kept in memory in front of the
	// stores, over all tasks (0: no cache).
	CacheMaxBytes int64
	// StoreCacheBytes is the size of Pebble's block cache, shared by every
	// local store of the process (active tasks and standby copies).
	StoreCacheBytes int64
	// MemoryLimitSet is memory.limit.bytes when set (-1: derived, see
	// MemoryLimit; 0: none).
	MemoryLimitSet int64

	LogLevel string
	// LogFormat is json or console; empty chooses console when standard
	// error is a terminal, json otherwise.
	LogFormat string
	// LogSummaryInterval is how often the runtime logs what it processed
	// since the last summary (log.summary.interval.ms).
	LogSummaryInterval time.Duration

	// Warnings are problems of the configuration that do not stop the
	// start (a password given where other users can read it), for the
	// start-up log.
	Warnings []string
	// Notes are what loading did that an operator may wonder about but
	// that is not a problem (Kubernetes service-link variables ignored),
	// for the start-up log at info level.
	Notes []string
}

// HTTPSecurity is how the HTTP server is protected. The zero value serves
// plain HTTP to anyone.
type HTTPSecurity struct {
	// CertFile and KeyFile (PEM) make the server speak HTTPS; they are
	// read again when they change on disk.
	CertFile, KeyFile string
	// ClientCAFile, when set, requires client certificates signed by it
	// (the probes /healthz and /readyz excepted).
	ClientCAFile string
	// PeerCertFile and PeerKeyFile are what this instance presents when it
	// forwards a query to another; PeerCAFile what it trusts of them
	// (default: the system roots).
	PeerCertFile, PeerKeyFile, PeerCAFile string
	// TokensFile, when set, holds the bearer tokens (one per line) a
	// request needs; re-read when it changes.
	TokensFile string
	// AuthMetrics: /metrics needs a token too (when tokens are set).
	AuthMetrics bool
	// MaxConnections bounds the open HTTP connections.
	MaxConnections int
}

// TLS reports whether the HTTP server speaks HTTPS.
func (h HTTPSecurity) TLS() bool { return h.CertFile != "" }

// Scheme is "https" with TLS on, else "http".
func (h HTTPSecurity) Scheme() string {
	if h.TLS() {
		return "https"
	}
	return "http"
}

// Security protocols accepted by security.protocol.
const (
	ProtocolPlaintext     = "PLAINTEXT"
	ProtocolSSL           = "SSL"
	ProtocolSASLPlaintext = "SASL_PLAINTEXT"
	ProtocolSASLSSL       = "SASL_SSL"
)

// Security is how salesagg connects to Kafka: TLS and SASL.
type Security struct {
	Protocol      string // PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
	SASLMechanism string // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	SASLUsername  string
	// SASLPassword is the password, from sasl.password or read from
	// sasl.password.file at start. Never logged.
	SASLPassword     string
	SASLPasswordFile string
	CAFile           string // PEM bundle to verify the brokers; empty: the system's roots
	CertFile         string // client certificate (PEM), for mutual TLS
	KeyFile          string // its key (PEM)
}

// TLS reports whether connections use TLS.
func (s Security) TLS() bool { return s.Protocol == ProtocolSSL || s.Protocol == ProtocolSASLSSL }

// SASL reports whether connections authenticate with SASL.
func (s Security) SASL() bool {
	return s.Protocol == ProtocolSASLPlaintext || s.Protocol == ProtocolSASLSSL
}

// BaseMemory is what the service needs besides its caches, the default
// memory.limit.bytes without cache.max.bytes.
const BaseMemory = 256 << 20

// MemtablesInHeap is what the default memory limit counts for Pebble's
// memtables when they are Go heap (StoreCachesInHeap): three stores (one
// instance running every task of three partitions), each with a 16 MiB
// memtable and one more while it is flushed.
const MemtablesInHeap = 3 * 2 * 16 << 20

// MemoryLimit is the Go heap's soft limit: memory.limit.bytes, by default
// BaseMemory plus cache.max.bytes (the entry cache lives in the Go heap),
// plus store.cache.bytes and MemtablesInHeap in a build without cgo, where
// Pebble's block cache and memtables are Go heap too. 0 means none.
func (c Config) MemoryLimit() int64 {
	if c.MemoryLimitSet >= 0 {
		return c.MemoryLimitSet
	}
	if StoreCachesInHeap {
		return BaseMemory + c.CacheMaxBytes + c.StoreCacheBytes + MemtablesInHeap
	}
	return BaseMemory + c.CacheMaxBytes
}

// MaxTransactionTimeout is the broker's default transaction.max.timeout.ms
// (15 min): a producer asking for a longer transaction timeout is refused.
const MaxTransactionTimeout = 15 * time.Minute

// TransactionTimeout returns the timeout of the transactions under
// exactly_once_v2: transaction.timeout.ms, or by default 10 × commit.interval.ms
// and at least 10 s (Kafka Streams' default). It bounds how long the
// transaction of a killed process holds up the new owner of its tasks (the
// committed offsets are not stable until the broker aborts it), and how
// long Kafka may be unreachable before the broker aborts the open
// transaction (the process then starts a new producer session).
func (c Config) TransactionTimeout() time.Duration {
	if c.TransactionTimeoutSet > 0 {
		return c.TransactionTimeoutSet
	}
	return max(10*time.Second, 10*c.CommitInterval)
}

// Windows configures the windowed totals: tumbling windows by event time.
type Windows struct {
	// Sizes are the window sizes as given (Go durations); WindowSizes
	// parses them. Empty: no windows.
	Sizes []string
	// Grace is how long after a window's end late events still count.
	Grace time.Duration
	// Retention, when set, is how long after a window's end it is kept
	// (see WindowRetention).
	Retention time.Duration
	// TimeField names the JSON field holding an event's time; empty: the
	// record timestamp.
	TimeField string
	// Notify is when windowed notifications are written: at each update
	// (WindowNotifyUpdates) or once at the close (WindowNotifyFinal).
	Notify string
}

// The values of windows.notify.
const (
	WindowNotifyUpdates = "updates"
	WindowNotifyFinal   = "final"
)

// MaxWindowSizes bounds windows.sizes: each size costs a store key space,
// a changelog and a write per event.
const MaxWindowSizes = 8

// parseWindowSize reads one entry of windows.sizes.
func parseWindowSize(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, err
	case d < time.Second || d%time.Millisecond != 0:
		return 0, fmt.Errorf("%s is not a whole number of milliseconds of at least 1s", s)
	case d > 366*24*time.Hour:
		return 0, fmt.Errorf("%s is longer than 366 days", s)
	}
	return d, nil
}

// WindowSizes returns the window sizes in the order given (validated at
// start: entries that do not parse are left out).
func (c Config) WindowSizes() []time.Duration {
	var out []time.Duration
	for _, s := range c.Windows.Sizes {
		if d, err := parseWindowSize(s); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// WindowRetention returns how long after its end a window of size is
// kept: windows.retention.ms, or by default 24 h, or size + grace when that
// is longer (a window is kept at least until it closes).
func (c Config) WindowRetention(size time.Duration) time.Duration {
	if c.Windows.Retention > 0 {
		return c.Windows.Retention
	}
	return max(24*time.Hour, size+c.Windows.Grace)
}

// WindowChangelogTopic returns the changelog topic of the windows of size:
// <application.id>-<store.name>-<size>-changelog (see
// sales.WindowStoreName).
func (c Config) WindowChangelogTopic(size time.Duration) string {
	return sales.ChangelogTopic(c.ApplicationID, sales.WindowStoreName(c.StoreName, size))
}

// ChangelogTopic returns <application.id>-<store.name>-changelog.
func (c Config) ChangelogTopic() string {
	return sales.ChangelogTopic(c.ApplicationID, c.StoreName)
}

// RepartitionTopic returns the topic events travel through when they arrive
// on another partition than the one owning their product. Under
// group.protocol classic it is <application.id>-<store.name>-repartition and
// carries each event as read; under streams it is Kafka Streams'
// <application.id>-EMPTY_KEY_BY_PRODUCT-repartition and carries the product
// and the amount (ForwardsAmounts), so that Kafka Streams instances in the
// same streams group read what salesagg forwards and the reverse.
func (c Config) RepartitionTopic() string {
	if c.ForwardsAmounts() {
		return c.ApplicationID + "-" + sales.RepartitionName + "-repartition"
	}
	return c.ApplicationID + "-" + c.StoreName + "-repartition"
}

// ForwardsAmounts reports whether forwarded events are written in Kafka
// Streams' repartition format (key the product, value the amount as a
// LongSerializer value; sales.DecodeAmount) rather than as read: under
// group.protocol streams, whose topology is Kafka Streams'.
func (c Config) ForwardsAmounts() bool { return c.GroupProtocol == GroupProtocolStreams }

// AdvertisedServer returns application.server, or when it is empty the host
// of http.addr (the host name when http.addr names a wildcard) with the port
// of bound, the address the HTTP server is bound to (http.addr's own port
// when bound is empty).
func (c Config) AdvertisedServer(bound string) string {
	if c.ApplicationServer != "" {
		return c.ApplicationServer
	}
	host, port, err := net.SplitHostPort(c.HTTPAddr)
	if err != nil {
		return c.HTTPAddr
	}
	if _, bp, err := net.SplitHostPort(bound); err == nil && bp != "" {
		port = bp
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "localhost"
		}
	}
	return net.JoinHostPort(host, port)
}

// CheckServer checks that s is an address to reach another instance at,
// host:port and nothing else: a DNS name or an IP address (IPv6 in
// brackets), and a decimal port from 1 to 65535. It is the check of
// application.server, made again on every member's advertised address
// before a query is forwarded to it.
func CheckServer(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("not host:port: %w", err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	if host == "" {
		return errors.New("the host is empty")
	}
	if ip := net.ParseIP(host); ip != nil {
		if strings.Contains(host, ":") && !strings.HasPrefix(s, "[") {
			return errors.New("an IPv6 host must be in brackets")
		}
		return nil
	}
	if len(host) > 253 {
		return errors.New("the host name is longer than 253 characters")
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if !hostLabel.MatchString(label) {
			return fmt.Errorf("%q is not a host name (letters, digits and '-' in dot-separated labels of up to 63)", host)
		}
	}
	return nil
}

var hostLabel = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)

// StateDirUnderTemp reports whether the state dir lies under the OS temp dir,
// where it may not survive a reboot or a container restart.
func (c Config) StateDirUnderTemp() bool {
	tmp := os.TempDir()
	return c.StateDir == tmp || strings.HasPrefix(c.StateDir, strings.TrimSuffix(tmp, "/")+"/")
}

// DerivedInstanceID is the group.instance.id of a process whose config
// sets none, from the process id in its state dir: <application.id>-<id>,
// cut to Kafka's 249 characters from the left. It follows the volume (a
// restart on it replaces the dead member at once) and no two processes
// share it (one process per state dir). The runtime applies it at start,
// and config print shows it without starting.
func (c Config) DerivedInstanceID(processID string) string {
	id := c.ApplicationID + "-" + processID
	if len(id) > 249 {
		id = id[len(id)-249:]
	}
	return id
}
