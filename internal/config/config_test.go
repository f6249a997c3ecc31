package config

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func load(t *testing.T, file string, env []string, args ...string) (Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	if file != "" {
		name := filepath.Join(t.TempDir(), "salesagg.yaml")
		if err := os.WriteFile(name, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", name)
	}
	if err := ParseFlags(fs, args); err != nil {
		t.Fatal(err)
	}
	return Load(fs, env)
}

func TestDefaults(t *testing.T) {
	// Scenario: with nothing set, the documented defaults apply.
	c := Default()
	if c.ApplicationID != "sales-aggregator" || c.BootstrapServers[0] != "localhost:9092" || c.StateDir != "/tmp/salesagg" ||
		c.InputTopic != "sales-events-v1" || c.NotificationTopic != "notifications-events-v1" || c.StoreName != "PRODUCT_AGGREGATED_SALES" ||
		c.NotificationThreshold != 2000 || c.ProcessingGuarantee != ExactlyOnceV2 || c.AutoOffsetReset != "earliest" ||
		c.CommitInterval != 100*time.Millisecond || !c.TopicsCreate || c.TopicsPartitions != 3 || c.ReplicationFactor != 1 ||
		c.HTTPAddr != ":8080" || c.LogLevel != "info" || c.LogFormat != "" || !c.LeaveGroupOnClose || c.GroupInstanceID != "" ||
		c.TransactionTimeout() != 10*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if got := c.ChangelogTopic(); got != "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog" {
		t.Fatalf("changelog topic %s", got)
	}
}

func TestPrecedenceFileEnvFlags(t *testing.T) {
	// Scenario: the file sets keys, the environment overrides it, flags override both.
	file := "application.id: from-file\nnotification.threshold: 10\nstate.dir: /data/file\ncommit.interval.ms: 250\n"
	env := []string{"SALESAGG_NOTIFICATION_THRESHOLD=20", "SALESAGG_STATE_DIR=/data/env", "KAFKA_BOOTSTRAP_SERVERS=k1:9092,k2:9092", "PATH=/bin"}
	c, err := load(t, file, env, "--state.dir", "/data/flag")
	if err != nil {
		t.Fatal(err)
	}
	if c.ApplicationID != "from-file" || c.NotificationThreshold != 20 || c.StateDir != "/data/flag" || c.CommitInterval != 250*time.Millisecond {
		t.Fatalf("got %+v", c)
	}
	if strings.Join(c.BootstrapServers, ",") != "k1:9092,k2:9092" {
		t.Fatalf("bootstrap %v", c.BootstrapServers)
	}
	// SALESAGG_BOOTSTRAP_SERVERS wins over the KAFKA_ alias.
	c, err = load(t, "", []string{"KAFKA_BOOTSTRAP_SERVERS=a:1", "SALESAGG_BOOTSTRAP_SERVERS=b:2"})
	if err != nil || c.BootstrapServers[0] != "b:2" {
		t.Fatalf("got %v, %v", c.BootstrapServers, err)
	}
}

func TestNestedYAML(t *testing.T) {
	// Scenario: YAML written nested instead of with dotted keys means the same.
	c, err := load(t, "application:\n  id: nested\ntopics:\n  partitions: 6\n", nil)
	if err != nil || c.ApplicationID != "nested" || c.TopicsPartitions != 6 {
		t.Fatalf("got %+v, %v", c, err)
	}
}

func TestBadConfigNamesKeyValueAndAllowed(t *testing.T) {
	// Scenario: every bad key is reported at once with its value and what is allowed.
	file := "notification.threshold: lots\nunknown.key: 1\n"
	env := []string{"SALESAGG_PROCESSING_GUARANTEE=exactly_twice", "SALESAGG_NOPE=1"}
	_, err := load(t, file, env, "--commit.interval.ms", "0", "--topics.partitions", "x", "--log.level", "loud",
		"--application.id", "bad id", "--bootstrap.servers", "nohostport", "--topics.create", "maybe", "--http.addr", "8080")
	if err == nil {
		t.Fatal("bad config accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		`unknown key "unknown.key"`,
		`notification.threshold = "lots"`,
		"SALESAGG_NOPE",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	// Validation errors list together.
	_, err = load(t, "", []string{"SALESAGG_PROCESSING_GUARANTEE=exactly_twice"}, "--commit.interval.ms", "5", "--log.level", "loud",
		"--application.id", "bad id", "--bootstrap.servers", "nohostport", "--http.addr", "8080", "--auto.offset.reset", "middle")
	msg = err.Error()
	for _, want := range []string{
		`processing.guarantee = "exactly_twice": allowed: exactly_once_v2, at_least_once`,
		`log.level = "loud": allowed: debug, info, warn, error`,
		`application.id = "bad id"`,
		`bootstrap.servers = "nohostport": each entry must be host:port`,
		`http.addr = "8080"`,
		`auto.offset.reset = "middle": allowed: earliest, latest`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	_, err = load(t, "", nil, "--commit.interval.ms", "0")
	if err == nil || !strings.Contains(err.Error(), "commit.interval.ms = 0: must be from 1 to 3600000") {
		t.Errorf("commit.interval.ms 0: %v", err)
	}
	// The commit interval defaults per guarantee, as in Kafka Streams.
	if c, err := load(t, "", nil, "--processing.guarantee", "at_least_once"); err != nil || c.CommitInterval != time.Second {
		t.Errorf("at_least_once: %v %v", c.CommitInterval, err)
	}
}

func TestStateDirUnderTemp(t *testing.T) {
	// Scenario: a state dir under the temp dir is flagged, a volume path is not.
	c := Default()
	c.StateDir = filepath.Join(os.TempDir(), "x")
	if !c.StateDirUnderTemp() {
		t.Error("temp state dir not flagged")
	}
	c.StateDir = "/shared-volume/state_store"
	if c.StateDirUnderTemp() {
		t.Error("volume state dir flagged")
	}
}

func TestSecurityConfig(t *testing.T) {
	// Scenario: SASL and TLS settings are validated at start, the password can come from a file,
	// and the effective configuration that is logged never shows it.
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("from-file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, "", []string{"SALESAGG_SECURITY_PROTOCOL=SASL_PLAINTEXT", "SALESAGG_SASL_MECHANISM=SCRAM-SHA-512",
		"SALESAGG_SASL_USERNAME=sales", "SALESAGG_SASL_PASSWORD_FILE=" + pw})
	if err != nil {
		t.Fatal(err)
	}
	if c.Security.SASLPassword != "from-file-secret" || !c.Security.SASL() || c.Security.TLS() {
		t.Fatalf("security %+v", c.Security)
	}
	if got := fmt.Sprint(c.Fields()); strings.Contains(got, "from-file-secret") || !strings.Contains(got, "[redacted]") {
		t.Fatalf("logged config shows the secret or no redaction: %s", got)
	}
	c, err = load(t, "", nil, "--security.protocol", "SASL_SSL", "--sasl.username", "u", "--sasl.password", "inline-secret")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmt.Sprint(c.Fields()), "inline-secret") {
		t.Fatal("inline password logged")
	}

	_, err = load(t, "", nil, "--security.protocol", "SASL_SSL", "--sasl.mechanism", "GSSAPI", "--ssl.ca.file", "/nonexistent/ca.pem",
		"--ssl.cert.file", "/x.pem", "--sasl.password", "hunter2")
	if err == nil {
		t.Fatal("bad security config accepted")
	}
	for _, want := range []string{
		`sasl.mechanism = "GSSAPI": allowed: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512`,
		`sasl.username = "": required with security.protocol SASL_SSL`,
		`ssl.ca.file = "/nonexistent/ca.pem": must be a readable file`,
		"ssl.cert.file and ssl.key.file go together",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error shows the password: %v", err)
	}
	_, err = load(t, "", nil, "--security.protocol", "TLS")
	if err == nil || !strings.Contains(err.Error(), `security.protocol = "TLS": allowed: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL`) {
		t.Fatalf("security.protocol TLS: %v", err)
	}
}

func TestEveryKeyIsLogged(t *testing.T) {
	// Scenario: the start-up log line shows every key, so a new key cannot be left out of it.
	fields := Default().Fields()
	for _, k := range Keys() {
		if _, ok := fields[k]; !ok {
			t.Errorf("Fields() lacks %s", k)
		}
	}
	if len(fields) != len(Keys()) {
		t.Errorf("Fields() has %d entries for %d keys", len(fields), len(Keys()))
	}
}

func TestLeaveGroupOnClose(t *testing.T) {
	// Scenario: a clean stop leaves the group unless leave.group.on.close=false, set by file, environment or flag.
	for _, tc := range []struct {
		name    string
		file    string
		env     []string
		args    []string
		want    bool
		wantErr string
	}{
		{name: "default", want: true},
		{name: "file", file: "leave.group.on.close: false\n", want: false},
		{name: "nested file", file: "leave:\n  group:\n    on:\n      close: false\n", want: false},
		{name: "environment", env: []string{"SALESAGG_LEAVE_GROUP_ON_CLOSE=false"}, want: false},
		{name: "flag over environment", env: []string{"SALESAGG_LEAVE_GROUP_ON_CLOSE=false"}, args: []string{"--leave.group.on.close", "true"}, want: true},
		{name: "not a bool", args: []string{"--leave.group.on.close", "maybe"}, wantErr: `leave.group.on.close = "maybe": must be true or false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.file, tc.env, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.LeaveGroupOnClose != tc.want {
				t.Fatalf("LeaveGroupOnClose = %v, want %v", c.LeaveGroupOnClose, tc.want)
			}
			if got := c.Fields()["leave.group.on.close"]; got != tc.want {
				t.Fatalf("Fields()[leave.group.on.close] = %v", got)
			}
		})
	}
}

func TestGroupInstanceIDDefaultIsDerived(t *testing.T) {
	// Scenario: group.instance.id is documented as derived from the state dir's process id; unset, it
	// stays empty in Config (the runtime derives it), set, it is kept and checked.
	fs := pflag.NewFlagSet("help", pflag.ContinueOnError)
	RegisterFlags(fs)
	if help := fs.Lookup("group.instance.id").Usage; !strings.Contains(help, "default: derived from the process id in the state dir") ||
		strings.Contains(help, "dynamic membership") {
		t.Fatalf("group.instance.id help: %s", help)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr string
	}{
		{name: "unset: derive", want: ""},
		{name: "pod name", args: []string{"--group.instance.id", "salesagg-0"}, want: "salesagg-0"},
		{name: "illegal", args: []string{"--group.instance.id", "a b"}, wantErr: `group.instance.id = "a b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, "", nil, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || c.GroupInstanceID != tc.want {
				t.Fatalf("GroupInstanceID = %q, %v; want %q", c.GroupInstanceID, err, tc.want)
			}
		})
	}
}

func TestTransactionTimeout(t *testing.T) {
	// Scenario: the transaction timeout is 10 commit intervals, never under 60 s.
	for _, tc := range []struct {
		commit time.Duration
		want   time.Duration
	}{
		{100 * time.Millisecond, 10 * time.Second},
		{6 * time.Second, 60 * time.Second},
		{10 * time.Second, 100 * time.Second},
		{90 * time.Second, 15 * time.Minute},
		{2 * time.Minute, 20 * time.Minute},
	} {
		t.Run(tc.commit.String(), func(t *testing.T) {
			c := Default()
			c.CommitInterval = tc.commit
			if got := c.TransactionTimeout(); got != tc.want {
				t.Fatalf("TransactionTimeout() = %s, want %s", got, tc.want)
			}
		})
	}
	if MaxTransactionTimeout != 900_000*time.Millisecond {
		t.Fatalf("MaxTransactionTimeout = %s, want the broker's default transaction.max.timeout.ms 900000", MaxTransactionTimeout)
	}
}

func TestCommitIntervalWithinTransactionMax(t *testing.T) {
	// Scenario: under exactly_once_v2 a commit interval whose transaction timeout the broker would refuse
	// stops the start, naming the key, the value, the limit and why; at-least-once has no such limit.
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "default exactly-once"},
		{name: "exactly-once at the limit", args: []string{"--commit.interval.ms", "90000"}},
		{name: "exactly-once just above", args: []string{"--commit.interval.ms", "90001"},
			wantErr: `config: commit.interval.ms = "90001": at most 90000 with processing.guarantee exactly_once_v2`},
		{name: "exactly-once 2 min", args: []string{"--commit.interval.ms", "120000"},
			wantErr: `config: commit.interval.ms = "120000": at most 90000 with processing.guarantee exactly_once_v2 (the transaction timeout, 10 × commit.interval.ms, must stay within the broker's transaction.max.timeout.ms of 15 min)`},
		{name: "at-least-once 2 min", args: []string{"--processing.guarantee", "at_least_once", "--commit.interval.ms", "120000"}},
		{name: "at-least-once 1 h", args: []string{"--processing.guarantee", "at_least_once", "--commit.interval.ms", "3600000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, "", nil, tc.args...)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one with %q", err, tc.wantErr)
			}
		})
	}
}

func TestDecodeAndValidationProblemsTogether(t *testing.T) {
	// Scenario: a value that does not decode and one that decodes but is not allowed are reported in
	// one error; the key that did not decode is reported once, not again by validation.
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		want  []string
		once  []string
		never []string
	}{
		{
			name: "guarantee and negative commit interval",
			args: []string{"--processing.guarantee", "nope", "--commit.interval.ms", "-5"},
			want: []string{`processing.guarantee = "nope": allowed: exactly_once_v2, at_least_once`, "commit.interval.ms = -5: must be from 1 to 3600000"},
			once: []string{"commit.interval.ms"},
		},
		{
			name:  "type errors beside validation errors",
			env:   []string{"SALESAGG_LOG_LEVEL=loud"},
			args:  []string{"--topics.partitions", "x", "--replication.factor", "0", "--leave.group.on.close", "maybe", "--http.addr", "8080"},
			want:  []string{`topics.partitions = "x"`, `log.level = "loud"`, `replication.factor = "0": must be -1`, `leave.group.on.close = "maybe"`, `http.addr = "8080"`},
			once:  []string{"topics.partitions"},
			never: []string{`topics.partitions = "0"`},
		},
		{
			name:  "unreadable password file beside a bad mechanism",
			args:  []string{"--security.protocol", "SASL_PLAINTEXT", "--sasl.username", "u", "--sasl.password.file", "/nonexistent/pw", "--sasl.mechanism", "GSSAPI"},
			want:  []string{`sasl.password.file = "/nonexistent/pw"`, `sasl.mechanism = "GSSAPI"`},
			never: []string{"sasl.password or sasl.password.file is required"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, "", tc.env, tc.args...)
			if err == nil {
				t.Fatal("bad config accepted")
			}
			msg := err.Error()
			for _, want := range tc.want {
				if !strings.Contains(msg, want) {
					t.Errorf("error lacks %q:\n%s", want, msg)
				}
			}
			for _, key := range tc.once {
				if n := strings.Count(msg, "config: "+key+" "); n != 1 {
					t.Errorf("%s reported %d times:\n%s", key, n, msg)
				}
			}
			for _, never := range tc.never {
				if strings.Contains(msg, never) {
					t.Errorf("error has %q:\n%s", never, msg)
				}
			}
		})
	}
}

func TestApplicationServer(t *testing.T) {
	// Scenario: the address advertised for query routing is application.server when set (and must
	// be host:port), else http.addr's host (the host name for a wildcard) with the bound port.
	host, _ := os.Hostname()
	for _, tc := range []struct {
		name, bound, want, wantErr string
		args                       []string
	}{
		{name: "set", args: []string{"--application.server", "salesagg-0.salesagg:8080"}, bound: "[::]:8080", want: "salesagg-0.salesagg:8080"},
		{name: "http.addr host", args: []string{"--http.addr", "127.0.0.1:0"}, bound: "127.0.0.1:41234", want: "127.0.0.1:41234"},
		{name: "wildcard", args: []string{"--http.addr", ":8080"}, bound: "[::]:8080", want: net.JoinHostPort(host, "8080")},
		{name: "not bound yet", args: []string{"--http.addr", "127.0.0.1:9000"}, want: "127.0.0.1:9000"},
		{name: "no port", args: []string{"--application.server", "salesagg-0"}, wantErr: `application.server = "salesagg-0": must be host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, "", nil, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.AdvertisedServer(tc.bound); got != tc.want {
				t.Fatalf("AdvertisedServer(%q) = %q, want %q", tc.bound, got, tc.want)
			}
		})
	}
}

func TestTransactionTimeoutKey(t *testing.T) {
	// Scenario: transaction.timeout.ms overrides the derived timeout; one shorter than two commit
	// intervals, or past the broker's maximum, is refused naming the key.
	c, err := load(t, "", nil, "--transaction.timeout.ms", "5000")
	if err != nil || c.TransactionTimeout() != 5*time.Second {
		t.Fatalf("transaction.timeout.ms 5000: %v, %v", c.TransactionTimeout(), err)
	}
	for _, args := range [][]string{
		{"--transaction.timeout.ms", "1500", "--commit.interval.ms", "1000"},
		{"--transaction.timeout.ms", "900001"},
	} {
		if _, err := load(t, "", nil, args...); err == nil || !strings.Contains(err.Error(), "transaction.timeout.ms") {
			t.Fatalf("%v: %v, want an error naming transaction.timeout.ms", args, err)
		}
	}
}

func TestHTTPSecurityConfig(t *testing.T) {
	// Scenario: application.server is host:port and nothing else; application.id cannot climb
	// out of state.dir; the HTTP TLS keys go in pairs and name readable files; client
	// certificates need TLS; a SASL password given as a flag or in the environment starts the
	// service with a warning pointing to sasl.password.file.
	for _, bad := range []string{"host:8080/any/path#", "host:8080?x", "user@host:8080", "host:http", "host:99999", "host", "[::1]:80/x"} {
		if _, err := load(t, "", nil, "--application.server", bad); err == nil || !strings.Contains(err.Error(), "application.server") {
			t.Errorf("application.server %q: %v", bad, err)
		}
	}
	if c, err := load(t, "", nil, "--application.server", "salesagg-0.salesagg:8080"); err != nil || c.ApplicationServer != "salesagg-0.salesagg:8080" {
		t.Fatalf("a pod DNS name: %v", err)
	}
	for _, id := range []string{"..", "."} {
		if _, err := load(t, "", nil, "--application.id", id); err == nil || !strings.Contains(err.Error(), "application.id") {
			t.Errorf("application.id %q: %v", id, err)
		}
	}
	cert := filepath.Join(t.TempDir(), "c.pem")
	if err := os.WriteFile(cert, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := load(t, "", nil, "--http.tls.cert.file", cert, "--http.tls.client.ca.file", "/nonexistent/ca.pem")
	for _, want := range []string{"http.tls.cert.file and http.tls.key.file go together", "http.tls.client.ca.file", "must be a readable file"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("half a TLS pair and a missing CA: %v, want %q", err, want)
		}
	}
	if _, err := load(t, "", nil, "--http.tls.client.ca.file", cert); err == nil || !strings.Contains(err.Error(), "needs http.tls.cert.file") {
		t.Errorf("client certificates without TLS: %v", err)
	}
	c, err := load(t, "", nil, "--http.tls.cert.file", cert, "--http.tls.key.file", cert)
	if err != nil || !c.HTTP.TLS() || c.HTTP.Scheme() != "https" || c.HTTP.MaxConnections != 512 || !c.HTTP.AuthMetrics {
		t.Fatalf("TLS on: %+v, %v", c.HTTP, err)
	}
	sasl := []string{"--security.protocol", "SASL_PLAINTEXT", "--sasl.username", "u"}
	c, err = load(t, "", nil, append(sasl, "--sasl.password", "hunter2")...)
	if err != nil || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "sasl.password.file") || strings.Contains(c.Warnings[0], "hunter2") {
		t.Fatalf("password as a flag: %v %v", c.Warnings, err)
	}
	c, err = load(t, "", []string{"SALESAGG_SASL_PASSWORD=hunter2"}, sasl...)
	if err != nil || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "environment") {
		t.Fatalf("password in the environment: %v %v", c.Warnings, err)
	}
}

func TestPeek(t *testing.T) {
	// Scenario: Peek reads the keys asked for from a file whose other keys are unknown or bad, and fails only on an unreadable file or an undeclared name.
	dir := t.TempDir()
	name := filepath.Join(dir, "salesagg.yaml")
	file := "http:\n  addr: 127.0.0.1:9090\n  tls.cert.file: /etc/tls/cert.pem\nno.such.key: 1\ntopics.partitions: lots\nhttp.max.connections: 5\n"
	if err := os.WriteFile(name, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Peek(name, "http.addr", "http.tls.cert.file", "http.tls.peer.ca.file", "http.max.connections")
	if err != nil {
		t.Fatalf("Peek: %v", err)
	}
	want := map[string]string{"http.addr": "127.0.0.1:9090", "http.tls.cert.file": "/etc/tls/cert.pem", "http.max.connections": "5"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Peek = %v, want %v", got, want)
	}
	if _, err := Peek(name, "http.adr"); err == nil || !strings.Contains(err.Error(), `no key "http.adr"`) {
		t.Fatalf("Peek of an undeclared key: %v", err)
	}
	if _, err := Peek(filepath.Join(dir, "missing.yaml"), "http.addr"); err == nil {
		t.Fatal("Peek of a missing file: no error")
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("http.addr: [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Peek(bad, "http.addr"); err == nil {
		t.Fatal("Peek of a file that is not YAML: no error")
	}
}

func TestWindowsConfig(t *testing.T) {
	// Scenario: windows are off by default; sizes come as a YAML list or a comma separated
	// value, with grace and retention; a size that is not a duration of at least 1s, a size
	// given twice or a retention shorter than a size plus the grace fail at start naming the
	// key, the value and what is allowed.
	c, err := load(t, "", nil)
	if err != nil || len(c.WindowSizes()) != 0 {
		t.Fatalf("default windows = %v, %v", c.WindowSizes(), err)
	}
	c, err = load(t, "windows:\n  sizes: [1h, 24h]\n  grace.ms: 600000\n", nil)
	if err != nil || !reflect.DeepEqual(c.WindowSizes(), []time.Duration{time.Hour, 24 * time.Hour}) || c.Windows.Grace != 10*time.Minute {
		t.Fatalf("windows from YAML = %v grace %s, %v", c.WindowSizes(), c.Windows.Grace, err)
	}
	if got := c.WindowRetention(time.Hour); got != 24*time.Hour {
		t.Fatalf("default retention of 1h = %s, want 24h", got)
	}
	if got := c.WindowRetention(24 * time.Hour); got != 24*time.Hour+10*time.Minute {
		t.Fatalf("default retention of 24h with 10m grace = %s, want 24h10m", got)
	}
	if got := c.WindowChangelogTopic(time.Hour); got != "sales-aggregator-PRODUCT_AGGREGATED_SALES-1h-changelog" {
		t.Fatalf("1h changelog = %s", got)
	}
	c, err = load(t, "", []string{"SALESAGG_WINDOWS_SIZES=15m, 1h"}, "--windows.retention.ms", "7200000")
	if err != nil || !reflect.DeepEqual(c.WindowSizes(), []time.Duration{15 * time.Minute, time.Hour}) || c.WindowRetention(time.Hour) != 2*time.Hour {
		t.Fatalf("windows from the environment = %v, %v", c.WindowSizes(), err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--windows.sizes", "1h,soon"}, `windows.sizes = "soon": each entry must be a Go duration`},
		{[]string{"--windows.sizes", "500ms"}, `windows.sizes = "500ms": each entry must be a Go duration`},
		{[]string{"--windows.sizes", "1h,60m"}, `windows.sizes = "1h": each size at most once`},
		{[]string{"--windows.sizes", "1h", "--windows.grace.ms", "600000", "--windows.retention.ms", "3600000"},
			`windows.retention.ms = "3600000": must be 0 or at least each window size plus windows.grace.ms (4200000 for the size 1h)`},
	} {
		if _, err := load(t, "", nil, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

func TestGroupProtocolKey(t *testing.T) {
	// Scenario: group.protocol is classic by default, streams on request (any case) with
	// either guarantee; another protocol is refused naming the key.
	c, err := load(t, "", nil)
	if err != nil || c.GroupProtocol != GroupProtocolClassic {
		t.Fatalf("default group.protocol = %q, %v", c.GroupProtocol, err)
	}
	c, err = load(t, "", nil, "--group.protocol", "Streams", "--processing.guarantee", AtLeastOnce)
	if err != nil || c.GroupProtocol != GroupProtocolStreams {
		t.Fatalf("group.protocol Streams: %q, %v", c.GroupProtocol, err)
	}
	c, err = load(t, "", nil, "--group.protocol", "streams") // exactly_once_v2 by default
	if err != nil || c.GroupProtocol != GroupProtocolStreams || c.ProcessingGuarantee != ExactlyOnceV2 {
		t.Fatalf("group.protocol streams: %q %q, %v", c.GroupProtocol, c.ProcessingGuarantee, err)
	}
	// Under streams events are forwarded as Kafka Streams forwards them.
	if got := c.RepartitionTopic(); got != c.ApplicationID+"-EMPTY_KEY_BY_PRODUCT-repartition" || !c.ForwardsAmounts() {
		t.Fatalf("streams: repartition topic %s, amounts %v", got, c.ForwardsAmounts())
	}
	if c, _ := load(t, "", nil); c.RepartitionTopic() != c.ApplicationID+"-PRODUCT_AGGREGATED_SALES-repartition" || c.ForwardsAmounts() {
		t.Fatalf("classic: repartition topic %s, amounts %v", c.RepartitionTopic(), c.ForwardsAmounts())
	}
	for _, args := range [][]string{
		{"--group.protocol", "consumer"},
	} {
		if _, err := load(t, "", nil, args...); err == nil || !strings.Contains(err.Error(), "group.protocol") {
			t.Fatalf("%v: %v, want an error naming group.protocol", args, err)
		}
	}
}
