// Package config loads salesagg's configuration from a YAML file,
// SALESAGG_<KEY> environment variables and command-line flags, in rising
// precedence, into a typed Config, and validates it. It is the only package
// that knows about viper.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Guarantees accepted by processing.guarantee.
const (
	AtLeastOnce   = "at_least_once"
	ExactlyOnceV2 = "exactly_once_v2"
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
	AutoOffsetReset       string
	CommitInterval        time.Duration
	TopicsCreate          bool
	TopicsPartitions      int32
	ReplicationFactor     int16
	HTTPAddr              string
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

	// Warnings are problems of the configuration that do not stop the
	// start (a password given where other users can read it), for the
	// start-up log.
	Warnings []string
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

// MemoryLimit is the Go heap's soft limit: memory.limit.bytes, by default
// BaseMemory plus cache.max.bytes (the entry cache lives in the Go heap;
// Pebble's block cache and memtables do not). 0 means none.
func (c Config) MemoryLimit() int64 {
	if c.MemoryLimitSet >= 0 {
		return c.MemoryLimitSet
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

// ChangelogTopic returns <application.id>-<store.name>-changelog.
func (c Config) ChangelogTopic() string {
	return c.ApplicationID + "-" + c.StoreName + "-changelog"
}

// RepartitionTopic returns <application.id>-<store.name>-repartition, the
// topic events travel through when they arrive on another partition than the
// one owning their product.
func (c Config) RepartitionTopic() string {
	return c.ApplicationID + "-" + c.StoreName + "-repartition"
}

type kind int

const (
	kindString kind = iota
	kindInt
	kindBool
	kindList
)

type keyDef struct {
	name string
	kind kind
	def  string
	help string
}

// keys lists every configuration key. Their defaults and meanings are the
// documented contract (README.md).
var keys = []keyDef{
	{"application.id", kindString, "sales-aggregator", "consumer group id, prefix of internal topics, state sub-directory"},
	{"bootstrap.servers", kindList, "localhost:9092", "Kafka brokers, comma separated host:port"},
	{"state.dir", kindString, "/tmp/salesagg", "directory holding the local stores (a mounted volume in production)"},
	{"input.topic", kindString, "sales-events-v1", "topic the sales events are read from"},
	{"notification.topic", kindString, "notifications-events-v1", "topic notifications are written to"},
	{"store.name", kindString, "PRODUCT_AGGREGATED_SALES", "name of the store; the changelog is <application.id>-<store.name>-changelog"},
	{"notification.threshold", kindInt, "2000", "a product total at or above this emits a notification"},
	{"processing.guarantee", kindString, ExactlyOnceV2, "exactly_once_v2 or at_least_once"},
	{"auto.offset.reset", kindString, "earliest", "where a new group starts reading the input: earliest or latest"},
	{"commit.interval.ms", kindInt, "", "how often state is flushed, checkpointed and input offsets committed (default 100 exactly-once, 1000 at-least-once)"},
	{"topics.create", kindBool, "true", "create missing input, notification, changelog and repartition topics"},
	{"topics.partitions", kindInt, "3", "partitions of a created input topic"},
	{"replication.factor", kindInt, "1", "replication factor of created topics (-1: the broker's default)"},
	{"http.addr", kindString, ":8080", "address of the HTTP server (queries, tasks, health)"},
	{"http.pprof", kindBool, "false", "serve Go's runtime profiles (CPU, heap, goroutines) under /debug/pprof/ on the HTTP server"},
	{"http.tls.cert.file", kindString, "", "PEM certificate (chain) the HTTP server presents: it serves HTTPS (default: plain HTTP); re-read when the file changes"},
	{"http.tls.key.file", kindString, "", "PEM key of http.tls.cert.file"},
	{"http.tls.client.ca.file", kindString, "", "PEM CA bundle: every request (the probes /healthz and /readyz excepted) must present a client certificate it signed (mutual TLS)"},
	{"http.tls.peer.cert.file", kindString, "", "PEM certificate this instance presents to the others when it forwards a query (mutual TLS between instances)"},
	{"http.tls.peer.key.file", kindString, "", "PEM key of http.tls.peer.cert.file"},
	{"http.tls.peer.ca.file", kindString, "", "PEM CA bundle this instance trusts the others' HTTPS servers with (default: the system roots)"},
	{"http.auth.tokens.file", kindString, "", "file of bearer tokens, one per line: every request (the probes excepted) needs 'Authorization: Bearer <token>'; re-read when it changes; instances forward with its first token"},
	{"http.auth.metrics", kindBool, "true", "with http.auth.tokens.file, GET /metrics needs a token too (false: open, for a scraper without one)"},
	{"http.max.connections", kindInt, "512", "most HTTP connections open at once (more wait to be accepted), so that clients cannot take the file descriptors the stores and Kafka need"},
	{"application.server", kindString, "", "host:port other instances reach this one's HTTP server at, advertised in the group for query routing (default: the host name and the port of http.addr; the pod DNS name on Kubernetes)"},
	{"security.protocol", kindString, ProtocolPlaintext, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"},
	{"sasl.mechanism", kindString, "PLAIN", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},
	{"sasl.username", kindString, "", "SASL user"},
	{"sasl.password", kindString, "", "SASL password (prefer sasl.password.file; never logged)"},
	{"sasl.password.file", kindString, "", "file holding the SASL password (e.g. a mounted secret)"},
	{"ssl.ca.file", kindString, "", "PEM CA bundle to verify the brokers (default: system roots)"},
	{"ssl.cert.file", kindString, "", "PEM client certificate for mutual TLS"},
	{"ssl.key.file", kindString, "", "PEM key of the client certificate"},
	{"dlq.topic", kindString, "", "dead-letter topic for bad events (default: none, bad events are skipped and counted)"},
	{"dlq.max.record.bytes", kindInt, "262144", "largest dead-letter record (key, value and headers); a bigger bad event is cut to fit, with headers giving its original sizes (keep it under the topic's max.message.bytes)"},
	{"task.timeout.ms", kindInt, "300000", "how long a task may keep failing (its restore errors, or its records cannot be produced) while it retries with backoff before GET /healthz reports the process unhealthy; the task keeps retrying"},
	{"group.instance.id", kindString, "", "static group membership id, e.g. the pod name (default: derived from the process id in the state dir, so a restart on the same volume rejoins at once)"},
	{"session.timeout.ms", kindInt, "45000", "consumer group session timeout"},
	{"leave.group.on.close", kindBool, "true", "on a clean shutdown the member leaves the group at once (LeaveGroup with its group.instance.id), so its tasks move without waiting for the session timeout; false keeps its tasks for a rolling restart"},
	{"num.standby.replicas", kindInt, "0", "standby copies of each task kept by other members, tailing its changelog, so a failover restores only what they lack"},
	{"acceptable.recovery.lag", kindInt, "10000", "changelog records a member's store may lag and still count as caught up; active tasks go to caught-up members first"},
	{"max.warmup.replicas", kindInt, "2", "warm-up copies built at once on members that should take a task over but are not caught up"},
	{"probing.rebalance.interval.ms", kindInt, "600000", "how often a member with warm-up copies rejoins to let caught-up warm-ups take their tasks over (one that catches up rejoins at once)"},
	{"transaction.timeout.ms", kindInt, "", "exactly-once transaction timeout (default 10 × commit.interval.ms, at least 10000): how long a killed instance's open transaction holds up the new owner of its tasks, and how long Kafka may be unreachable before the open transaction is aborted and the producer session restarts"},
	{"compression.type", kindString, "none", "compression of produced batches (changelog, notifications, repartition): none, gzip, snappy, lz4 or zstd"},
	{"cache.max.bytes", kindInt, "67108864", "bytes of product totals kept in memory in front of the stores, over all tasks, so hot products read no disk (0: none)"},
	{"memory.limit.bytes", kindInt, "", "soft limit of the Go heap (the runtime's memory limit: the GC works harder near it), default 268435456 + cache.max.bytes; 0: none; the GOMEMLIMIT environment variable, when set, wins"},
	{"store.cache.bytes", kindInt, "67108864", "bytes of Pebble's block cache (index, bloom filter and data blocks), shared by every local store of the process"},
	{"log.level", kindString, "info", "debug, info, warn or error"},
	{"log.format", kindString, "", "json or console (default: console on a terminal, json otherwise)"},
}

// Keys returns the names of all configuration keys, sorted.
func Keys() []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.name
	}
	sort.Strings(out)
	return out
}

// EnvName returns the environment variable of key: SALESAGG_ and the key in
// upper case with dots as underscores.
func EnvName(key string) string {
	return "SALESAGG_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// RegisterFlags adds --config and one flag per key to fs.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String("config", "", "YAML configuration file")
	for _, k := range keys {
		help := k.help
		if k.def != "" {
			help += " (default " + k.def + ")"
		}
		fs.String(k.name, "", help)
	}
}

// Load reads the configuration: defaults, then the YAML file named by
// --config, then the environment (environ, as os.Environ returns it), then
// flags set on fs. It returns every problem found at once.
func Load(fs *pflag.FlagSet, environ []string) (Config, error) {
	v := viper.New()
	for _, k := range keys {
		if k.def != "" {
			v.SetDefault(k.name, k.def)
		}
	}
	var problems []error

	if f := fs.Lookup("config"); f != nil && f.Value.String() != "" {
		file := viper.New()
		file.SetConfigFile(f.Value.String())
		file.SetConfigType("yaml")
		if err := file.ReadInConfig(); err != nil {
			// Reported with the other problems: the environment's and the
			// flags' are still worth knowing.
			problems = append(problems, fmt.Errorf("config: reading %s: %w", f.Value.String(), err))
		}
		for _, name := range file.AllKeys() {
			if !known(name) {
				problems = append(problems, fmt.Errorf("config: unknown key %q in %s (known keys: %s)", name, f.Value.String(), strings.Join(Keys(), ", ")))
				continue
			}
			v.Set(name, file.Get(name))
		}
	}

	env := map[string]string{}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if ok {
			env[name] = val
		}
	}
	for name := range env {
		if rest, ok := strings.CutPrefix(name, "SALESAGG_"); ok && !knownEnv(name) {
			problems = append(problems, fmt.Errorf("config: unknown environment variable %s (no key %q)", name, strings.ToLower(strings.ReplaceAll(rest, "_", "."))))
		}
	}
	if val, ok := env["KAFKA_BOOTSTRAP_SERVERS"]; ok {
		v.Set("bootstrap.servers", val)
	}
	for _, k := range keys {
		if val, ok := env[EnvName(k.name)]; ok {
			v.Set(k.name, val)
		}
	}

	for _, k := range keys {
		if f := fs.Lookup(k.name); f != nil && f.Changed {
			v.Set(k.name, f.Value.String())
		}
	}

	// Decode and validation problems are reported together. A key that did
	// not decode holds its zero value, so validation skips it rather than
	// report it twice.
	c, failed, errs := decode(v)
	problems = append(problems, errs...)
	if f := fs.Lookup("sasl.password"); f != nil && f.Changed {
		c.Warnings = append(c.Warnings, "sasl.password is given as a command-line flag: every user of the machine can read it (ps, /proc/<pid>/cmdline); put it in a file and give sasl.password.file instead")
	} else if _, ok := env[EnvName("sasl.password")]; ok {
		c.Warnings = append(c.Warnings, "sasl.password is given in the environment ("+EnvName("sasl.password")+"): it is visible in the process's environment and to anything that inherits it; put it in a file and give sasl.password.file instead")
	}
	if err := c.validate(failed); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return Config{}, errors.Join(problems...)
	}
	return c, nil
}

// Default returns the configuration with every key at its default.
func Default() Config {
	c, err := Load(pflag.NewFlagSet("default", pflag.ContinueOnError), nil)
	if err != nil {
		panic(err) // the defaults are valid; a test guards it
	}
	return c
}

func known(name string) bool {
	return slices.ContainsFunc(keys, func(k keyDef) bool { return k.name == name })
}

func knownEnv(name string) bool {
	return slices.ContainsFunc(keys, func(k keyDef) bool { return EnvName(k.name) == name })
}

// decode reads every key of v into a Config. It returns the problems found
// and the keys they are of.
func decode(v *viper.Viper) (Config, map[string]bool, []error) {
	var c Config
	var problems []error
	failed := map[string]bool{}
	fail := func(key string, err error) {
		problems = append(problems, err)
		failed[key] = true
	}
	str := func(key string) string { return strings.TrimSpace(fmt.Sprint(v.Get(key))) }
	// str0 is str for a key without default: "" when not set.
	str0 := func(key string) string {
		if !v.IsSet(key) {
			return ""
		}
		return str(key)
	}
	integer := func(key string, min, max int64) int64 {
		raw := v.Get(key)
		var n int64
		switch x := raw.(type) {
		case int:
			n = int64(x)
		case int64:
			n = x
		case uint64:
			if x > math.MaxInt64 {
				fail(key, fmt.Errorf("config: %s = %v: must be an integer from %d to %d", key, raw, min, max))
				return 0
			}
			n = int64(x)
		case float64:
			if x != math.Trunc(x) || x < math.MinInt64 || x > math.MaxInt64 {
				fail(key, fmt.Errorf("config: %s = %v: must be an integer from %d to %d", key, raw, min, max))
				return 0
			}
			n = int64(x)
		default:
			var err error
			n, err = strconv.ParseInt(strings.TrimSpace(fmt.Sprint(raw)), 10, 64)
			if err != nil {
				fail(key, fmt.Errorf("config: %s = %q: must be an integer from %d to %d", key, fmt.Sprint(raw), min, max))
				return 0
			}
		}
		if n < min || n > max {
			fail(key, fmt.Errorf("config: %s = %d: must be from %d to %d", key, n, min, max))
			return 0
		}
		return n
	}
	boolean := func(key string) bool {
		switch x := v.Get(key).(type) {
		case bool:
			return x
		default:
			b, err := strconv.ParseBool(strings.TrimSpace(fmt.Sprint(x)))
			if err != nil {
				fail(key, fmt.Errorf("config: %s = %q: must be true or false", key, fmt.Sprint(x)))
			}
			return b
		}
	}
	list := func(key string) []string {
		var parts []string
		switch x := v.Get(key).(type) {
		case []any:
			for _, e := range x {
				parts = append(parts, fmt.Sprint(e))
			}
		default:
			parts = strings.Split(fmt.Sprint(x), ",")
		}
		var out []string
		for _, p := range parts {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		return out
	}

	c.ApplicationID = str("application.id")
	c.BootstrapServers = list("bootstrap.servers")
	c.StateDir = str("state.dir")
	c.InputTopic = str("input.topic")
	c.NotificationTopic = str("notification.topic")
	c.StoreName = str("store.name")
	c.NotificationThreshold = integer("notification.threshold", math.MinInt64, math.MaxInt64)
	c.ProcessingGuarantee = str("processing.guarantee")
	c.AutoOffsetReset = str("auto.offset.reset")
	if v.IsSet("commit.interval.ms") && str("commit.interval.ms") != "" {
		c.CommitInterval = time.Duration(integer("commit.interval.ms", 1, 3_600_000)) * time.Millisecond
	} else if c.ProcessingGuarantee == ExactlyOnceV2 {
		c.CommitInterval = 100 * time.Millisecond
	} else {
		c.CommitInterval = time.Second
	}
	c.TopicsCreate = boolean("topics.create")
	c.TopicsPartitions = int32(integer("topics.partitions", 1, 10_000))
	c.ReplicationFactor = int16(integer("replication.factor", -1, math.MaxInt16))
	c.HTTPAddr = str("http.addr")
	c.HTTPPprof = boolean("http.pprof")
	c.HTTP = HTTPSecurity{
		CertFile:       str0("http.tls.cert.file"),
		KeyFile:        str0("http.tls.key.file"),
		ClientCAFile:   str0("http.tls.client.ca.file"),
		PeerCertFile:   str0("http.tls.peer.cert.file"),
		PeerKeyFile:    str0("http.tls.peer.key.file"),
		PeerCAFile:     str0("http.tls.peer.ca.file"),
		TokensFile:     str0("http.auth.tokens.file"),
		AuthMetrics:    boolean("http.auth.metrics"),
		MaxConnections: int(integer("http.max.connections", 16, 1_000_000)),
	}
	if v.IsSet("application.server") {
		c.ApplicationServer = str("application.server")
	}
	opt := func(key string) string {
		if v.IsSet(key) {
			return str(key)
		}
		return ""
	}
	c.Security = Security{
		Protocol:         strings.ToUpper(str("security.protocol")),
		SASLMechanism:    strings.ToUpper(str("sasl.mechanism")),
		SASLUsername:     opt("sasl.username"),
		SASLPassword:     opt("sasl.password"),
		SASLPasswordFile: opt("sasl.password.file"),
		CAFile:           opt("ssl.ca.file"),
		CertFile:         opt("ssl.cert.file"),
		KeyFile:          opt("ssl.key.file"),
	}
	if c.Security.SASLPasswordFile != "" {
		b, err := os.ReadFile(c.Security.SASLPasswordFile)
		if err != nil {
			fail("sasl.password.file", fmt.Errorf("config: sasl.password.file = %q: %v", c.Security.SASLPasswordFile, err))
		}
		c.Security.SASLPassword = strings.TrimRight(string(b), "\r\n")
	}
	if v.IsSet("dlq.topic") {
		c.DLQTopic = str("dlq.topic")
	}
	if v.IsSet("group.instance.id") {
		c.GroupInstanceID = str("group.instance.id")
	}
	c.SessionTimeout = time.Duration(integer("session.timeout.ms", 1000, 3_600_000)) * time.Millisecond
	c.LeaveGroupOnClose = boolean("leave.group.on.close")
	c.NumStandbyReplicas = int(integer("num.standby.replicas", 0, 100))
	c.AcceptableRecoveryLag = integer("acceptable.recovery.lag", 0, math.MaxInt64)
	c.MaxWarmupReplicas = int(integer("max.warmup.replicas", 1, 10_000))
	c.CacheMaxBytes = integer("cache.max.bytes", 0, 1<<40)
	c.StoreCacheBytes = integer("store.cache.bytes", 1<<20, 1<<40)
	c.MemoryLimitSet = -1
	if v.IsSet("memory.limit.bytes") {
		c.MemoryLimitSet = integer("memory.limit.bytes", 0, 1<<50)
	}
	c.CompressionType = strings.ToLower(str("compression.type"))
	if v.IsSet("transaction.timeout.ms") {
		c.TransactionTimeoutSet = time.Duration(integer("transaction.timeout.ms", 1000, MaxTransactionTimeout.Milliseconds())) * time.Millisecond
	}
	c.DLQMaxRecordBytes = integer("dlq.max.record.bytes", 1024, 64<<20)
	c.TaskTimeout = time.Duration(integer("task.timeout.ms", 1000, 24*3_600_000)) * time.Millisecond
	c.ProbingRebalanceInterval = time.Duration(integer("probing.rebalance.interval.ms", 1000, 24*3_600_000)) * time.Millisecond
	c.LogLevel = strings.ToLower(str("log.level"))
	c.LogFormat = strings.ToLower(str("log.format"))
	if !v.IsSet("log.format") {
		c.LogFormat = ""
	}
	return c, failed, problems
}

var legalName = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// Validate reports every problem of c at once, each naming the key, the value
// and what is allowed.
func (c Config) Validate() error { return c.validate(nil) }

// validate is Validate, skipping the checks of the keys in skip (those that
// did not decode).
func (c Config) validate(skip map[string]bool) error {
	var problems []error
	bad := func(key string, val any, allowed string) {
		if skip[key] {
			return
		}
		problems = append(problems, fmt.Errorf("config: %s = %q: %s", key, fmt.Sprint(val), allowed))
	}
	for key, val := range map[string]string{
		"application.id":     c.ApplicationID,
		"input.topic":        c.InputTopic,
		"notification.topic": c.NotificationTopic,
		"store.name":         c.StoreName,
	} {
		if !legalName.MatchString(val) || len(val) > 200 {
			bad(key, val, "must be 1 to 200 characters of a-z, A-Z, 0-9, '.', '_' and '-' (it names Kafka topics)")
		} else if (key == "application.id" || key == "store.name") && (val == "." || val == "..") {
			bad(key, val, "must not be '.' or '..' (it names a directory in state.dir)")
		}
	}
	if len(c.BootstrapServers) == 0 {
		bad("bootstrap.servers", "", "must list at least one host:port")
	}
	for _, s := range c.BootstrapServers {
		if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
			bad("bootstrap.servers", s, "each entry must be host:port")
		}
	}
	if c.StateDir == "" {
		bad("state.dir", c.StateDir, "must name a directory")
	}
	sec := c.Security
	switch sec.Protocol {
	case ProtocolPlaintext, ProtocolSSL, ProtocolSASLPlaintext, ProtocolSASLSSL:
	default:
		bad("security.protocol", sec.Protocol, "allowed: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL")
	}
	if sec.SASL() {
		if !slices.Contains([]string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}, sec.SASLMechanism) {
			bad("sasl.mechanism", sec.SASLMechanism, "allowed: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512")
		}
		if sec.SASLUsername == "" {
			bad("sasl.username", "", "required with security.protocol "+sec.Protocol)
		}
		if sec.SASLPassword == "" && sec.SASLPasswordFile == "" {
			problems = append(problems, fmt.Errorf("config: sasl.password or sasl.password.file is required with security.protocol %s", sec.Protocol))
		}
	}
	if (sec.CertFile == "") != (sec.KeyFile == "") {
		problems = append(problems, fmt.Errorf("config: ssl.cert.file and ssl.key.file go together (got cert %q, key %q)", sec.CertFile, sec.KeyFile))
	}
	for key, f := range map[string]string{"ssl.ca.file": sec.CAFile, "ssl.cert.file": sec.CertFile, "ssl.key.file": sec.KeyFile} {
		if f == "" {
			continue
		}
		if !sec.TLS() {
			bad(key, f, "only used with security.protocol SSL or SASL_SSL")
		} else if _, err := os.Stat(f); err != nil {
			bad(key, f, "must be a readable file: "+err.Error())
		}
	}
	if c.DLQTopic != "" && (!legalName.MatchString(c.DLQTopic) || c.DLQTopic == c.InputTopic || c.DLQTopic == c.NotificationTopic) {
		bad("dlq.topic", c.DLQTopic, "must be a topic name of a-z, A-Z, 0-9, '.', '_' and '-', other than input.topic and notification.topic")
	}
	if c.InputTopic != "" && c.InputTopic == c.NotificationTopic {
		bad("notification.topic", c.NotificationTopic, "must differ from input.topic")
	}
	if c.ProcessingGuarantee != AtLeastOnce && c.ProcessingGuarantee != ExactlyOnceV2 {
		bad("processing.guarantee", c.ProcessingGuarantee, "allowed: exactly_once_v2, at_least_once")
	}
	if !slices.Contains([]string{"none", "gzip", "snappy", "lz4", "zstd"}, c.CompressionType) {
		bad("compression.type", c.CompressionType, "allowed: none, gzip, snappy, lz4, zstd")
	}
	if c.AutoOffsetReset != "earliest" && c.AutoOffsetReset != "latest" {
		bad("auto.offset.reset", c.AutoOffsetReset, "allowed: earliest, latest")
	}
	if c.CommitInterval <= 0 {
		bad("commit.interval.ms", c.CommitInterval.Milliseconds(), "must be from 1 to 3600000")
	} else if c.TransactionTimeoutSet > 0 && c.TransactionTimeoutSet < 2*c.CommitInterval {
		bad("transaction.timeout.ms", c.TransactionTimeoutSet.Milliseconds(), fmt.Sprintf(
			"must be at least twice commit.interval.ms (%d), or a transaction would be aborted before its cycle ends", c.CommitInterval.Milliseconds()))
	} else if c.ProcessingGuarantee == ExactlyOnceV2 && c.TransactionTimeoutSet == 0 && c.TransactionTimeout() > MaxTransactionTimeout {
		bad("commit.interval.ms", c.CommitInterval.Milliseconds(), fmt.Sprintf(
			"at most %d with processing.guarantee %s (the transaction timeout, 10 × commit.interval.ms, must stay within the broker's transaction.max.timeout.ms of %s)",
			(MaxTransactionTimeout/10).Milliseconds(), ExactlyOnceV2, fmt.Sprintf("%g min", MaxTransactionTimeout.Minutes())))
	}
	if c.TopicsPartitions < 1 {
		bad("topics.partitions", c.TopicsPartitions, "must be from 1 to 10000")
	}
	if c.ReplicationFactor == 0 || c.ReplicationFactor < -1 {
		bad("replication.factor", c.ReplicationFactor, "must be -1 (broker default) or at least 1")
	}
	if c.GroupInstanceID != "" && (!legalName.MatchString(c.GroupInstanceID) || len(c.GroupInstanceID) > 249) {
		bad("group.instance.id", c.GroupInstanceID, "must be up to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-'")
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		bad("http.addr", c.HTTPAddr, "must be host:port or :port")
	}
	if c.ApplicationServer != "" {
		if err := CheckServer(c.ApplicationServer); err != nil {
			bad("application.server", c.ApplicationServer, "must be host:port, reachable by the other instances: "+err.Error())
		}
	}
	h := c.HTTP
	if (h.CertFile == "") != (h.KeyFile == "") {
		problems = append(problems, fmt.Errorf("config: http.tls.cert.file and http.tls.key.file go together (got cert %q, key %q)", h.CertFile, h.KeyFile))
	}
	if (h.PeerCertFile == "") != (h.PeerKeyFile == "") {
		problems = append(problems, fmt.Errorf("config: http.tls.peer.cert.file and http.tls.peer.key.file go together (got cert %q, key %q)", h.PeerCertFile, h.PeerKeyFile))
	}
	if h.ClientCAFile != "" && !h.TLS() {
		bad("http.tls.client.ca.file", h.ClientCAFile, "needs http.tls.cert.file and http.tls.key.file (client certificates are asked for over HTTPS)")
	}
	for key, f := range map[string]string{"http.tls.cert.file": h.CertFile, "http.tls.key.file": h.KeyFile, "http.tls.client.ca.file": h.ClientCAFile,
		"http.tls.peer.cert.file": h.PeerCertFile, "http.tls.peer.key.file": h.PeerKeyFile, "http.tls.peer.ca.file": h.PeerCAFile, "http.auth.tokens.file": h.TokensFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			bad(key, f, "must be a readable file: "+err.Error())
		}
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		bad("log.level", c.LogLevel, "allowed: debug, info, warn, error")
	}
	if !slices.Contains([]string{"", "json", "console"}, c.LogFormat) {
		bad("log.format", c.LogFormat, "allowed: json, console")
	}
	sort.Slice(problems, func(i, j int) bool { return problems[i].Error() < problems[j].Error() })
	return errors.Join(problems...)
}

// Fields returns the effective configuration as key/value pairs, for the
// start-up log line.
func (c Config) Fields() map[string]any {
	return map[string]any{
		"application.id":                c.ApplicationID,
		"bootstrap.servers":             strings.Join(c.BootstrapServers, ","),
		"state.dir":                     c.StateDir,
		"input.topic":                   c.InputTopic,
		"notification.topic":            c.NotificationTopic,
		"store.name":                    c.StoreName,
		"notification.threshold":        c.NotificationThreshold,
		"processing.guarantee":          c.ProcessingGuarantee,
		"auto.offset.reset":             c.AutoOffsetReset,
		"commit.interval.ms":            c.CommitInterval.Milliseconds(),
		"topics.create":                 c.TopicsCreate,
		"topics.partitions":             c.TopicsPartitions,
		"replication.factor":            c.ReplicationFactor,
		"http.addr":                     c.HTTPAddr,
		"http.tls.cert.file":            c.HTTP.CertFile,
		"http.tls.key.file":             c.HTTP.KeyFile,
		"http.tls.client.ca.file":       c.HTTP.ClientCAFile,
		"http.tls.peer.cert.file":       c.HTTP.PeerCertFile,
		"http.tls.peer.key.file":        c.HTTP.PeerKeyFile,
		"http.tls.peer.ca.file":         c.HTTP.PeerCAFile,
		"http.auth.tokens.file":         c.HTTP.TokensFile,
		"http.auth.metrics":             c.HTTP.AuthMetrics,
		"http.max.connections":          c.HTTP.MaxConnections,
		"http.pprof":                    c.HTTPPprof,
		"application.server":            c.ApplicationServer,
		"dlq.topic":                     c.DLQTopic,
		"dlq.max.record.bytes":          c.DLQMaxRecordBytes,
		"task.timeout.ms":               c.TaskTimeout.Milliseconds(),
		"security.protocol":             c.Security.Protocol,
		"sasl.mechanism":                c.Security.SASLMechanism,
		"sasl.username":                 c.Security.SASLUsername,
		"sasl.password":                 redact(c.Security.SASLPassword),
		"sasl.password.file":            c.Security.SASLPasswordFile,
		"ssl.ca.file":                   c.Security.CAFile,
		"ssl.cert.file":                 c.Security.CertFile,
		"ssl.key.file":                  c.Security.KeyFile,
		"group.instance.id":             c.GroupInstanceID,
		"session.timeout.ms":            c.SessionTimeout.Milliseconds(),
		"leave.group.on.close":          c.LeaveGroupOnClose,
		"num.standby.replicas":          c.NumStandbyReplicas,
		"acceptable.recovery.lag":       c.AcceptableRecoveryLag,
		"max.warmup.replicas":           c.MaxWarmupReplicas,
		"probing.rebalance.interval.ms": c.ProbingRebalanceInterval.Milliseconds(),
		"cache.max.bytes":               c.CacheMaxBytes,
		"store.cache.bytes":             c.StoreCacheBytes,
		"memory.limit.bytes":            c.MemoryLimit(),
		"compression.type":              c.CompressionType,
		"transaction.timeout.ms":        c.TransactionTimeout().Milliseconds(),
		"log.level":                     c.LogLevel,
		"log.format":                    c.LogFormat,
	}
}

func redact(secret string) string {
	if secret == "" {
		return ""
	}
	return "[redacted]"
}

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
