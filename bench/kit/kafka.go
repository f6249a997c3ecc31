package kit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Broker is the Kafka broker of a benchmark run: one that
// test/kafka/kafka.sh starts in a temp dir, or the one given with
// --bootstrap (External). Client and Adm are an admin client of it.
type Broker struct {
	Addr     string
	Version  string // from the broker's log, else guessed from its API versions
	External bool
	Client   *kgo.Client
	Adm      *kadm.Client

	kafkaDir string // "" when external
	script   string
	logf     Logf
}

// OpenBroker returns the broker at bootstrap when it is not "", else
// starts one with `kafka.sh up` (KAFKA_DIR under tmp) of the repository at
// repo, and opens an admin client of it. Close it in every case, even after
// an error: a broker that failed to start is taken down.
func OpenBroker(ctx context.Context, repo, tmp, bootstrap string, logf Logf) (*Broker, error) {
	b := &Broker{Addr: bootstrap, External: bootstrap != "", logf: logf}
	if !b.External {
		if err := b.up(ctx, repo, tmp); err != nil {
			return b, err
		}
	}
	cl, adm, err := NewAdmin(b.Addr)
	if err != nil {
		return b, err
	}
	b.Client, b.Adm = cl, adm
	if b.Version == "" {
		b.Version = BrokerVersionGuess(ctx, adm)
	}
	return b, nil
}

// up runs `kafka.sh up`; the bootstrap address is the last line of its
// stdout.
func (b *Broker) up(ctx context.Context, repo, tmp string) error {
	b.kafkaDir, b.script = filepath.Join(tmp, "kafka"), filepath.Join(repo, "test", "kafka", "kafka.sh")
	b.logf("starting a Kafka broker: KAFKA_DIR=%s %s up", b.kafkaDir, b.script)
	cmd := exec.CommandContext(ctx, b.script, "up")
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+b.kafkaDir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("kafka.sh up: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	b.Addr = strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(b.Addr, "127.0.0.1:") {
		return fmt.Errorf("kafka.sh up printed %q as its last line, want a 127.0.0.1:PORT address", b.Addr)
	}
	if log, err := os.ReadFile(filepath.Join(b.kafkaDir, "broker.log")); err == nil {
		if m := regexp.MustCompile(`Kafka version: (\S+)`).FindSubmatch(log); m != nil {
			b.Version = string(m[1])
		}
	}
	return nil
}

// Close closes the admin client and stops the broker if OpenBroker started
// it (with a timeout of its own: it runs after an interrupt too).
func (b *Broker) Close() {
	if b == nil {
		return
	}
	if b.Client != nil {
		b.Client.Close()
	}
	if b.kafkaDir == "" {
		return
	}
	b.logf("stopping the Kafka broker (kafka.sh down)")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.script, "down")
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+b.kafkaDir)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		b.logf("kafka.sh down: %v", err)
	}
}

// NewAdmin returns a client of the broker at addr (with opts) and its
// admin client.
func NewAdmin(addr string, opts ...kgo.Opt) (*kgo.Client, *kadm.Client, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	return cl, kadm.NewClient(cl), nil
}

// BrokerVersionGuess asks the broker for its API versions (for an external
// broker, whose log is not at hand): "guess: v4.0", or "".
func BrokerVersionGuess(ctx context.Context, adm *kadm.Client) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	vs, err := adm.ApiVersions(ctx)
	if err != nil {
		return ""
	}
	for _, v := range vs {
		if v.Err == nil {
			return "guess: " + v.VersionGuess()
		}
	}
	return ""
}

// CreateTopic creates topic with partitions (replication 1, default
// configs), within 60 s.
func CreateTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	return nil
}

// CommittedAtEnd reports whether the group's committed offsets of topic
// reached ends on every partition, and how many offsets are committed.
func CommittedAtEnd(ctx context.Context, adm *kadm.Client, group, topic string, ends map[int32]int64) (bool, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false, 0, err
	}
	at := true
	var sum int64
	for p, end := range ends {
		o, ok := offs.Lookup(topic, p)
		if !ok || o.Err != nil || o.At < 0 {
			at = false
			continue
		}
		sum += o.At
		if o.At < end {
			at = false
		}
	}
	return at, sum, nil
}

// DeleteRun deletes the groups and the topics whose names start with
// prefix (within 30 s; what fails is logged, not returned: it is cleanup).
func DeleteRun(adm *kadm.Client, prefix string, groups []string, logf Logf) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(groups) > 0 {
		_, _ = adm.DeleteGroups(ctx, groups...)
	}
	tds, err := adm.ListTopics(ctx)
	if err != nil {
		logf("cleanup: listing topics: %v", err)
		return
	}
	var del []string
	for _, t := range tds.Names() {
		if strings.HasPrefix(t, prefix) {
			del = append(del, t)
		}
	}
	if len(del) == 0 {
		return
	}
	if _, err := adm.DeleteTopics(ctx, del...); err != nil {
		logf("cleanup: deleting topics %v: %v", del, err)
		return
	}
	logf("cleanup: deleted %d topics of this run", len(del))
}

// WarmGroupCoordinator commits an offset of topic for a throw-away group,
// so that the broker creates __consumer_offsets and elects the coordinator
// now rather than in the first measured start. It retries for up to 60 s.
func WarmGroupCoordinator(ctx context.Context, adm *kadm.Client, group, topic string) error {
	var os kadm.Offsets
	os.AddOffset(topic, 0, 0, -1)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		err := adm.CommitAllOffsets(ctx, group, os)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// BuildSalesagg builds cmd/salesagg of the repository at repo into out
// (untimed: before anything is measured), its output on standard error. It
// builds it as make build and the image do, with the repository's
// scripts/build.sh (cgo, linked statically, when a C compiler is there:
// Pebble's block cache and memtables are then C memory, outside the Go
// heap); a checkout older than the script gets `go build -trimpath`.
func BuildSalesagg(ctx context.Context, repo, out string, logf Logf) error {
	var cmd *exec.Cmd
	if _, err := os.Stat(filepath.Join(repo, "scripts", "build.sh")); err == nil {
		logf("building salesagg: scripts/build.sh %s", out)
		cmd = exec.CommandContext(ctx, "sh", "scripts/build.sh", out)
	} else {
		logf("building salesagg: go build -trimpath -o %s ./cmd/salesagg", out)
		cmd = exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./cmd/salesagg")
	}
	cmd.Dir, cmd.Stdout, cmd.Stderr = repo, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building salesagg: %w", err)
	}
	return nil
}

// NewBulkProducer returns a client that loads topic fast: batches of up to
// 1 MiB lingering 5 ms, up to 200,000 records buffered, acknowledged by
// every in-sync replica. Records are partitioned as the Java client does
// (murmur2 of the key).
func NewBulkProducer(addr, topic string) (*kgo.Client, error) {
	return kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(1<<20),
		kgo.MaxBufferedRecords(200_000),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
}

// ProduceAll produces next(0) … next(n-1) without waiting for each
// acknowledgement, logs its progress every 5 s (what: what is produced),
// flushes (within flushTimeout unless 0) and returns the first error.
func ProduceAll(ctx context.Context, cl *kgo.Client, n int, next func(i int) *kgo.Record, logf Logf, what string, flushTimeout time.Duration) error {
	failed := make(chan error, 1)
	lastLog := time.Now()
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		cl.Produce(ctx, next(i), func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		})
		if now := time.Now(); now.Sub(lastLog) >= 5*time.Second {
			lastLog = now
			logf("producing %s: %d of %d", what, i+1, n)
		}
	}
	fctx := ctx
	if flushTimeout > 0 {
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(ctx, flushTimeout)
		defer cancel()
	}
	if err := cl.Flush(fctx); err != nil {
		return fmt.Errorf("flushing %s: %w", what, err)
	}
	select {
	case err := <-failed:
		return fmt.Errorf("producing %s: %w", what, err)
	default:
		return nil
	}
}
