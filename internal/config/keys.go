package config

import (
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
)

// keys declares every configuration key, once: its name, default, help and
// binding (kind, field, decoding and rules). Their defaults and meanings are
// the documented contract: README.md's table lists them, and a test keeps
// the two in step. Keys are decoded in this order, so a key derived from
// others (commit.interval.ms) or overriding another (sasl.password.file)
// comes after them.
var keys = []key{
	{name: "application.id", def: "sales-aggregator",
		help: "consumer group id, prefix of internal topics, state sub-directory",
		bind: text(func(c *Config) *string { return &c.ApplicationID }).must(topicName, dirName)},
	{name: "bootstrap.servers", def: "localhost:9092",
		help: "Kafka brokers, comma separated host:port",
		bind: hosts(func(c *Config) *[]string { return &c.BootstrapServers })},
	{name: "state.dir", def: "/tmp/salesagg",
		help: "directory holding the local stores (a mounted volume in production)",
		bind: text(func(c *Config) *string { return &c.StateDir }).must(nonEmpty("must name a directory"))},
	{name: "input.topic", def: "sales-events-v1",
		help: "topic the sales events are read from",
		bind: text(func(c *Config) *string { return &c.InputTopic }).must(topicName)},
	{name: "notification.topic", def: "notifications-events-v1",
		help: "topic notifications are written to",
		bind: text(func(c *Config) *string { return &c.NotificationTopic }).must(topicName)},
	{name: "store.name", def: sales.StoreName,
		help: "name of the store; the changelog is <application.id>-<store.name>-changelog",
		bind: text(func(c *Config) *string { return &c.StoreName }).must(topicName, dirName)},
	{name: "notification.threshold", def: "2000",
		help: "a product total at or above this emits a notification",
		bind: number(math.MinInt64, math.MaxInt64, func(c *Config) *int64 { return &c.NotificationThreshold })},
	{name: "processing.guarantee", def: ExactlyOnceV2,
		help: "exactly_once_v2 or at_least_once",
		bind: text(func(c *Config) *string { return &c.ProcessingGuarantee }).allow(ExactlyOnceV2, AtLeastOnce)},
	{name: "auto.offset.reset", def: "earliest",
		help: "where a new group starts reading the input: earliest or latest",
		bind: text(func(c *Config) *string { return &c.AutoOffsetReset }).allow("earliest", "latest")},
	{name: "commit.interval.ms",
		help: "how often state is flushed, checkpointed and input offsets committed (default 100 exactly-once, 1000 at-least-once)",
		bind: millis(1, 3_600_000, func(c *Config) *time.Duration { return &c.CommitInterval }).positive().
			derivedBy(defaultCommitInterval)},
	{name: "commit.idle.ms", def: "50",
		help: "when the input pauses this long after everything it held was read, commit without waiting for commit.interval.ms (0: only on the interval)",
		bind: millis(0, 3_600_000, func(c *Config) *time.Duration { return &c.CommitIdle })},
	{name: "topics.create", def: "true",
		help: "create missing notification, dead-letter, changelog and repartition topics",
		bind: toggle(func(c *Config) *bool { return &c.TopicsCreate })},
	{name: "topics.input.create", def: "false",
		help: "create the input topic (topics.partitions partitions) when it is missing; false: a missing input topic stops the start, naming the nearest existing topic (Kafka Streams' MissingSourceTopicException)",
		bind: toggle(func(c *Config) *bool { return &c.TopicsCreateInput })},
	{name: "topics.partitions", def: "3",
		help: "partitions of a created input topic",
		bind: number(1, 10_000, func(c *Config) *int32 { return &c.TopicsPartitions }).positive()},
	{name: "replication.factor", def: "1",
		help: "replication factor of created topics (-1: the broker's default)",
		bind: number(-1, math.MaxInt16, func(c *Config) *int16 { return &c.ReplicationFactor }).must(replicationFactor)},
	{name: "http.addr", def: ":8080",
		help: "address of the HTTP server (queries, tasks, health)",
		bind: text(func(c *Config) *string { return &c.HTTPAddr }).must(listenAddr)},
	{name: "http.pprof", def: "false",
		help: "serve Go's runtime profiles (CPU, heap, goroutines) under /debug/pprof/ on the HTTP server",
		bind: toggle(func(c *Config) *bool { return &c.HTTPPprof })},
	{name: "http.tls.cert.file",
		help: "PEM certificate (chain) the HTTP server presents: it serves HTTPS (default: plain HTTP); re-read when the file changes",
		bind: text(func(c *Config) *string { return &c.HTTP.CertFile }).must(readable)},
	{name: "http.tls.key.file",
		help: "PEM key of http.tls.cert.file",
		bind: text(func(c *Config) *string { return &c.HTTP.KeyFile }).must(readable)},
	{name: "http.tls.client.ca.file",
		help: "PEM CA bundle: every request (the probes /healthz and /readyz excepted) must present a client certificate it signed (mutual TLS)",
		bind: text(func(c *Config) *string { return &c.HTTP.ClientCAFile }).must(needsHTTPS, readable)},
	{name: "http.tls.peer.cert.file",
		help: "PEM certificate this instance presents to the others when it forwards a query (mutual TLS between instances)",
		bind: text(func(c *Config) *string { return &c.HTTP.PeerCertFile }).must(readable)},
	{name: "http.tls.peer.key.file",
		help: "PEM key of http.tls.peer.cert.file",
		bind: text(func(c *Config) *string { return &c.HTTP.PeerKeyFile }).must(readable)},
	{name: "http.tls.peer.ca.file",
		help: "PEM CA bundle this instance trusts the others' HTTPS servers with (default: the system roots)",
		bind: text(func(c *Config) *string { return &c.HTTP.PeerCAFile }).must(readable)},
	{name: "http.auth.tokens.file",
		help: "file of bearer tokens, one per line: every request (the probes excepted) needs 'Authorization: Bearer <token>'; re-read when it changes; instances forward with its first token",
		bind: text(func(c *Config) *string { return &c.HTTP.TokensFile }).must(readable)},
	{name: "http.auth.metrics", def: "true",
		help: "with http.auth.tokens.file, GET /metrics needs a token too (false: open, for a scraper without one)",
		bind: toggle(func(c *Config) *bool { return &c.HTTP.AuthMetrics })},
	{name: "http.max.connections", def: "512",
		help: "most HTTP connections open at once (more wait to be accepted), so that clients cannot take the file descriptors the stores and Kafka need",
		bind: number(16, 1_000_000, func(c *Config) *int { return &c.HTTP.MaxConnections })},
	{name: "application.server",
		help: "host:port other instances reach this one's HTTP server at, advertised in the group for query routing (default: the host name and the port of http.addr; the pod DNS name on Kubernetes)",
		bind: text(func(c *Config) *string { return &c.ApplicationServer }).must(server).
			shows(func(c Config) any { return c.AdvertisedServer("") }), derived: true},
	{name: "security.protocol", def: ProtocolPlaintext,
		help: "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
		bind: text(func(c *Config) *string { return &c.Security.Protocol }).folded(strings.ToUpper).
			allow(ProtocolPlaintext, ProtocolSSL, ProtocolSASLPlaintext, ProtocolSASLSSL)},
	{name: "sasl.mechanism", def: "PLAIN",
		help: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		bind: text(func(c *Config) *string { return &c.Security.SASLMechanism }).folded(strings.ToUpper).
			allow("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512").checkedWhen(func(c Config) bool { return c.Security.SASL() })},
	{name: "sasl.username",
		help: "SASL user",
		bind: text(func(c *Config) *string { return &c.Security.SASLUsername })},
	{name: "sasl.password", secret: true,
		help: "SASL password (prefer sasl.password.file; never logged)",
		bind: text(func(c *Config) *string { return &c.Security.SASLPassword }).
			shows(func(c Config) any { return redact(c.Security.SASLPassword) })},
	{name: "sasl.password.file",
		help: "file holding the SASL password (e.g. a mounted secret)",
		bind: text(func(c *Config) *string { return &c.Security.SASLPasswordFile }).loads(readPassword)},
	{name: "ssl.ca.file",
		help: "PEM CA bundle to verify the brokers (default: system roots)",
		bind: text(func(c *Config) *string { return &c.Security.CAFile }).must(kafkaTLSFile)},
	{name: "ssl.cert.file",
		help: "PEM client certificate for mutual TLS",
		bind: text(func(c *Config) *string { return &c.Security.CertFile }).must(kafkaTLSFile)},
	{name: "ssl.key.file",
		help: "PEM key of the client certificate",
		bind: text(func(c *Config) *string { return &c.Security.KeyFile }).must(kafkaTLSFile)},
	{name: "dlq.topic",
		help: "dead-letter topic for bad events (default: none, bad events are skipped and counted)",
		bind: text(func(c *Config) *string { return &c.DLQTopic }).must(dlqTopic)},
	{name: "dlq.max.record.bytes", def: "262144",
		help: "largest dead-letter record (key, value and headers); a bigger bad event is cut to fit, with headers giving its original sizes (keep it under the topic's max.message.bytes)",
		bind: number(1024, 64<<20, func(c *Config) *int64 { return &c.DLQMaxRecordBytes })},
	{name: "windows.sizes",
		help: "tumbling window sizes, comma separated Go durations (e.g. 1h,24h): each product's total per window of each size, with a window store and changelog per size (default: none, no windows)",
		bind: windowSizes(func(c *Config) *[]string { return &c.Windows.Sizes })},
	{name: "windows.grace.ms", def: "0",
		help: "how long after a window ends (by event time) late events still count; later ones are dropped, counted as late and dead-lettered when dlq.topic is set",
		bind: millis(0, 365*24*3_600_000, func(c *Config) *time.Duration { return &c.Windows.Grace })},
	{name: "windows.retention.ms", def: "0",
		help: "how long a window is kept, from its start by stream time (the latest event time of its task), then deleted from the store and tombstoned in the changelog; 0 or at least each size + grace (0: 24 h, or size + grace when longer)",
		bind: millis(0, 10*365*24*3_600_000, func(c *Config) *time.Duration { return &c.Windows.Retention }).must(windowRetention)},
	{name: "windows.notify", def: WindowNotifyUpdates,
		help: "windowed notifications: updates (a window's total at or above notification.threshold, at each commit that changes it) or final (once, when the window closes: its final total, at or above the threshold; exactly once under exactly_once_v2)",
		bind: text(func(c *Config) *string { return &c.Windows.Notify }).allow(WindowNotifyUpdates, WindowNotifyFinal)},
	{name: "windows.time.field",
		help: "JSON field of the event holding its time, epoch milliseconds or RFC 3339 (default: the record timestamp)",
		bind: text(func(c *Config) *string { return &c.Windows.TimeField })},
	{name: "task.timeout.ms", def: "300000",
		help: "how long a task may keep failing (its restore errors, or its records cannot be produced) while it retries with backoff before GET /healthz reports the process unhealthy; the task keeps retrying",
		bind: millis(1000, 24*3_600_000, func(c *Config) *time.Duration { return &c.TaskTimeout })},
	{name: "group.instance.id",
		help: "static group membership id, e.g. the pod name (default: derived from the process id in the state dir, so a restart on the same volume rejoins at once)",
		bind: text(func(c *Config) *string { return &c.GroupInstanceID }).must(instanceID), derived: true},
	{name: "session.timeout.ms", def: "45000",
		help: "consumer group session timeout",
		bind: millis(1000, 3_600_000, func(c *Config) *time.Duration { return &c.SessionTimeout })},
	{name: "group.protocol", def: GroupProtocolClassic,
		help: "classic (a consumer group, tasks assigned by salesagg's balancer) or streams (a KIP-1071 streams group, tasks assigned by the broker; Apache Kafka 4.2 or later)",
		bind: text(func(c *Config) *string { return &c.GroupProtocol }).folded(strings.ToLower).allow(GroupProtocolClassic, GroupProtocolStreams)},
	{name: "repartition.purge.interval.ms", def: "30000",
		help: "group.protocol streams: how often the records of the repartition topic's partitions of this instance's tasks are deleted up to the group's committed offsets, as Kafka Streams' key (that repartition topic keeps records forever: retention.ms -1)",
		bind: millis(100, 24*3_600_000, func(c *Config) *time.Duration { return &c.RepartitionPurgeInterval })},
	{name: "leave.group.on.close", def: "true",
		help: "on a clean shutdown the member leaves the group at once (LeaveGroup with its group.instance.id), so its tasks move without waiting for the session timeout; false keeps its tasks for a rolling restart",
		bind: toggle(func(c *Config) *bool { return &c.LeaveGroupOnClose })},
	{name: "num.standby.replicas", def: "0",
		help: "standby copies of each task kept by other members, tailing its changelog, so a failover restores only what they lack",
		bind: number(0, 100, func(c *Config) *int { return &c.NumStandbyReplicas })},
	{name: "acceptable.recovery.lag", def: "10000",
		help: "changelog records a member's store may lag and still count as caught up; active tasks go to caught-up members first",
		bind: number(0, math.MaxInt64, func(c *Config) *int64 { return &c.AcceptableRecoveryLag })},
	{name: "max.warmup.replicas", def: "2",
		help: "warm-up copies built at once on members that should take a task over but are not caught up",
		bind: number(1, 10_000, func(c *Config) *int { return &c.MaxWarmupReplicas })},
	{name: "probing.rebalance.interval.ms", def: "600000",
		help: "how often a member with warm-up copies rejoins to let caught-up warm-ups take their tasks over (one that catches up rejoins at once)",
		bind: millis(1000, 24*3_600_000, func(c *Config) *time.Duration { return &c.ProbingRebalanceInterval })},
	{name: "transaction.timeout.ms",
		help: "exactly-once transaction timeout (default 10 × commit.interval.ms, at least 10000): how long a killed instance's open transaction holds up the new owner of its tasks, and how long Kafka may be unreachable before the open transaction is aborted and the producer session restarts",
		bind: millis(1000, MaxTransactionTimeout.Milliseconds(), func(c *Config) *time.Duration { return &c.TransactionTimeoutSet }).
			shows(func(c Config) any { return c.TransactionTimeout().Milliseconds() }), derived: true},
	{name: "compression.type", def: "none",
		help: "compression of produced batches (changelog, notifications, repartition): none, gzip, snappy, lz4 or zstd",
		bind: text(func(c *Config) *string { return &c.CompressionType }).folded(strings.ToLower).
			allow("none", "gzip", "snappy", "lz4", "zstd")},
	{name: "cache.max.bytes", def: "67108864",
		help: "bytes of product totals kept in memory in front of the stores, over all tasks, so hot products read no disk (0: none)",
		bind: number(0, 1<<40, func(c *Config) *int64 { return &c.CacheMaxBytes })},
	{name: "memory.limit.bytes",
		help: "soft limit of the Go heap (the runtime's memory limit: the GC works harder near it), default 268435456 + cache.max.bytes (built without cgo, + store.cache.bytes + 100663296 for the memtables: Pebble's caches are then Go heap); 0: none; the GOMEMLIMIT environment variable, when set, wins",
		bind: number(0, 1<<50, func(c *Config) *int64 { return &c.MemoryLimitSet }).unsetAs(-1).
			shows(func(c Config) any { return c.MemoryLimit() }), derived: true},
	{name: "store.cache.bytes", def: "134217728",
		help: "bytes of Pebble's block cache (index, bloom filter and data blocks), shared by every local store of the process",
		bind: number(1<<20, 1<<40, func(c *Config) *int64 { return &c.StoreCacheBytes })},
	{name: "log.level", def: "info",
		help: "debug, info, warn or error",
		bind: text(func(c *Config) *string { return &c.LogLevel }).folded(strings.ToLower).allow("debug", "info", "warn", "error")},
	{name: "log.format",
		help: "json or console (default: console on a terminal, json otherwise)",
		bind: text(func(c *Config) *string { return &c.LogFormat }).folded(strings.ToLower).allow("json", "console")},
	{name: "log.summary.interval.ms", def: "120000",
		help: "how often the \"Processed N total records\" summary (records, rate, committed tasks, input lag) is logged, as Kafka Streams' key; an interval that read nothing with no lag logs nothing",
		bind: millis(1, 24*3_600_000, func(c *Config) *time.Duration { return &c.LogSummaryInterval })},
}

// defaultCommitInterval is Kafka Streams' default: 100 ms under
// exactly_once_v2, 1 s at least once.
func defaultCommitInterval(c Config) time.Duration {
	if c.ProcessingGuarantee == ExactlyOnceV2 {
		return 100 * time.Millisecond
	}
	return time.Second
}

// readPassword reads sasl.password.file into the password, trailing line
// ends dropped.
func readPassword(c *Config, file string) error {
	if file == "" {
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("config: sasl.password.file = %q: %v", file, err)
	}
	c.Security.SASLPassword = strings.TrimRight(string(b), "\r\n")
	return nil
}

func redact(secret string) string {
	if secret == "" {
		return ""
	}
	return "[redacted]"
}

// The rules of keys. Each returns what is allowed, or "" when v passes.

var legalName = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

func topicName(v string, _ Config) string {
	if !legalName.MatchString(v) || len(v) > 200 {
		return "must be 1 to 200 characters of a-z, A-Z, 0-9, '.', '_' and '-' (it names Kafka topics)"
	}
	return ""
}

func dirName(v string, _ Config) string {
	if v == "." || v == ".." {
		return "must not be '.' or '..' (it names a directory in state.dir)"
	}
	return ""
}

func nonEmpty(allowed string) rule[string] {
	return func(v string, _ Config) string {
		if v == "" {
			return allowed
		}
		return ""
	}
}

func replicationFactor(v int16, _ Config) string {
	if v == 0 || v < -1 {
		return "must be -1 (broker default) or at least 1"
	}
	return ""
}

// listenAddr is the rule of an address to listen on: host:port or :port,
// the port from 1 to 65535, or 0 for any free one. It is checked here so
// that a bad port stops the start as a bad configuration (exit 2), not
// later at bind.
func listenAddr(v string, _ Config) string {
	if _, port, err := net.SplitHostPort(v); err != nil || !portIn(port, 0) {
		return "must be host:port or :port, with a port from 1 to 65535 (0: any free port)"
	}
	return ""
}

// portIn reports whether port is a decimal number from lo to 65535.
func portIn(port string, lo int) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n >= lo && n <= 65535 && strconv.Itoa(n) == port
}

func server(v string, _ Config) string {
	if err := CheckServer(v); err != nil {
		return "must be host:port, reachable by the other instances: " + err.Error()
	}
	return ""
}

func readable(v string, _ Config) string {
	if _, err := os.Stat(v); err != nil {
		return "must be a readable file: " + err.Error()
	}
	return ""
}

func needsHTTPS(_ string, c Config) string {
	if !c.HTTP.TLS() {
		return "needs http.tls.cert.file and http.tls.key.file (client certificates are asked for over HTTPS)"
	}
	return ""
}

// kafkaTLSFile is the rule of the ssl.* files: used only over TLS, and
// then readable.
func kafkaTLSFile(v string, c Config) string {
	if !c.Security.TLS() {
		return "only used with security.protocol SSL or SASL_SSL"
	}
	return readable(v, c)
}

func dlqTopic(v string, c Config) string {
	if !legalName.MatchString(v) || v == c.InputTopic || v == c.NotificationTopic {
		return "must be a topic name of a-z, A-Z, 0-9, '.', '_' and '-', other than input.topic and notification.topic"
	}
	return ""
}

func instanceID(v string, _ Config) string {
	if !legalName.MatchString(v) || len(v) > 249 {
		return "must be up to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-'"
	}
	return ""
}

// windowSizes binds windows.sizes: Go durations of at least 1s, each once,
// at most MaxWindowSizes; empty is allowed (no windows).
func windowSizes(at func(*Config) *[]string) *list {
	return &list{at: at, each: func(v string, c Config) string {
		d, err := parseWindowSize(v)
		if err != nil {
			return "each entry must be a Go duration (1h, 15m, 24h) of whole milliseconds, from 1s to 366 days"
		}
		same := 0
		for _, o := range c.Windows.Sizes {
			if od, err := parseWindowSize(o); err == nil && od == d {
				same++
			}
		}
		if same > 1 {
			return "each size at most once"
		}
		if len(c.Windows.Sizes) > MaxWindowSizes {
			return fmt.Sprintf("at most %d sizes", MaxWindowSizes)
		}
		return ""
	}}
}

// windowRetention is the rule of windows.retention.ms: 0 (the default) or
// at least every size plus the grace, so a window is kept until it closes.
func windowRetention(v time.Duration, c Config) string {
	if v == 0 {
		return ""
	}
	for _, size := range c.WindowSizes() {
		if v < size+c.Windows.Grace {
			return fmt.Sprintf("must be 0 or at least each window size plus windows.grace.ms (%d for the size %s)", (size + c.Windows.Grace).Milliseconds(), sales.FormatWindowSize(size))
		}
	}
	return ""
}
