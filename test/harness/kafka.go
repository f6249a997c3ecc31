package harness

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

// Kafka is the Apache Kafka broker that test/kafka/kafka.sh runs, with its
// data (and its jars' cache, logs and pid) in Dir, the script's KAFKA_DIR.
type Kafka struct {
	Script, Dir string
	// Env is added to the script's environment (e.g. KAFKA_NODES).
	Env []string
}

// NewKafka returns the kafka.sh broker of the repository at root, with
// KAFKA_DIR dir.
func NewKafka(root, dir string) Kafka {
	return Kafka{Script: filepath.Join(root, "test", "kafka", "kafka.sh"), Dir: dir}
}

// LogLines returns the last n lines of the single broker's log
// ($KAFKA_DIR/broker.log) that match, oldest first; what could not be read
// is said in the one line returned.
func (k Kafka) LogLines(match func(string) bool, n int) []string {
	b, err := os.ReadFile(filepath.Join(k.Dir, "broker.log"))
	if err != nil {
		return []string{fmt.Sprintf("(the broker log could not be read: %v)", err)}
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if match(l) {
			out = append(out, l)
		}
	}
	return out[max(0, len(out)-n):]
}

// Run runs kafka.sh with args. It returns stdout on success, stdout and
// stderr on failure.
func (k Kafka) Run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.Script, args...)
	cmd.Env = append(append(os.Environ(), k.Env...), "KAFKA_DIR="+k.Dir)
	// kafka.sh stops the broker it is starting when it gets SIGTERM while
	// waiting for its readiness.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// Up runs `kafka.sh up` and returns the bootstrap address, the last line it
// prints (HOST:PORT, HOST the KAFKA_HOST of Env, else 127.0.0.1).
func (k Kafka) Up(timeout time.Duration) (string, error) {
	out, err := k.Run(timeout, "up")
	if err != nil {
		return "", fmt.Errorf("kafka.sh up: %w\n%s", err, out)
	}
	host := "127.0.0.1"
	for _, e := range k.Env {
		if v, ok := strings.CutPrefix(e, "KAFKA_HOST="); ok && v != "" {
			host = v
		}
	}
	addr := LastLine(out)
	if !strings.HasPrefix(addr, host+":") {
		return "", fmt.Errorf("kafka.sh up printed %q as its last line, want %s:PORT", addr, host)
	}
	return addr, nil
}

// Watchdog starts a shell in its own session (named name) that waits for
// this process to end, then runs `kafka.sh down` and removes remove (unless
// ""). kafka.sh runs the broker in a session of its own: should this process
// die without taking it down (a panic, the -timeout alarm, a signal), nothing
// else would. Kill the watchdog once the broker is down.
func (k Kafka) Watchdog(name, remove string) (*exec.Cmd, error) {
	script := `while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" down; [ -z "$3" ] || rm -rf "$3"`
	cmd := exec.Command("bash", "-c", script, name, strconv.Itoa(os.Getpid()), k.Script, remove)
	cmd.Env = append(append(os.Environ(), k.Env...), "KAFKA_DIR="+k.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the broker watchdog: %w", err)
	}
	return cmd, nil
}

// StartKafka returns the bootstrap address of a broker for the test:
// KAFKA_BOOTSTRAP_SERVERS when set (external: true), else a single-node
// Apache Kafka that kafka.sh starts on loopback with KAFKA_DIR <dir>/kafka,
// taken down when the test ends, and by a watchdog if this process dies
// first.
func StartKafka(t testing.TB, root, dir string) (addr string, external bool) {
	t.Helper()
	if addr := strings.TrimSpace(os.Getenv("KAFKA_BOOTSTRAP_SERVERS")); addr != "" {
		t.Logf("using the broker at %s (KAFKA_BOOTSTRAP_SERVERS)", addr)
		return addr, true
	}
	return StartKafkaOn(t, root, dir, ""), false
}

// StartKafkaOn starts the project's Apache Kafka test broker under dir
// with every listener bound to and advertised at host (kafka.sh's
// KAFKA_HOST; "" is 127.0.0.1), stopped when the test ends, and returns its
// bootstrap address.
func StartKafkaOn(t testing.TB, root, dir, host string) string {
	t.Helper()
	k := NewKafka(root, filepath.Join(dir, "kafka"))
	if host != "" {
		k.Env = append(k.Env, "KAFKA_HOST="+host)
	}
	wd, err := k.Watchdog("kafka-watchdog", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := k.Run(2*time.Minute, "down"); err != nil {
			t.Errorf("kafka.sh down: %v\n%s", err, out)
		}
		_ = wd.Process.Kill()
		_ = wd.Wait()
	})
	t0 := time.Now()
	addr, err := k.Up(5 * time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Apache Kafka up at %s in %s (KAFKA_DIR=%s)", addr, time.Since(t0).Round(time.Millisecond), k.Dir)
	return addr
}

// LastLine is the last non-empty line of s, trimmed.
func LastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// NewClient returns a franz-go client for bootstrap (host:port[,...]),
// closed when the test ends. Producing uses the default partitioner:
// murmur2 of the key, as the Java producer does.
func NewClient(t testing.TB, bootstrap string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bootstrap, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CreateTopic creates topic with partitions and configs (replication 1).
func CreateTopic(t testing.TB, bootstrap, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(NewClient(t, bootstrap)).CreateTopic(ctx, partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

// Produce sends recs and waits for all of them to be acknowledged.
func Produce(t testing.TB, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing %d records: %v", len(recs), err)
	}
}

// Transaction sends recs in one transaction of cl (a client with a
// transactional id) and commits it, or aborts it when commit is false.
func Transaction(t testing.TB, cl *kgo.Client, commit bool, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("beginning a transaction: %v", err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing %d records in a transaction: %v", len(recs), err)
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("ending a transaction (commit %t): %v", commit, err)
	}
}

// TopicContent is what ReadTopic found.
type TopicContent struct {
	Records []*kgo.Record
	// Start and End are each partition's log start and last stable offsets
	// when the read began; Records holds the committed records between
	// them, in offset order per partition.
	Start, End map[int32]int64
}

// Written is the number of offsets ever written to the topic (the sum of
// the end offsets): without transactions, one per record produced.
func (c TopicContent) Written() int64 {
	var n int64
	for _, e := range c.End {
		n += e
	}
	return n
}

// ReadTopic reads every committed record of topic from the log start to
// the last stable offset each partition has now (transaction markers are
// read to pass them, and left out of Records).
func ReadTopic(bootstrap, topic string, timeout time.Duration) (TopicContent, error) {
	c := TopicContent{Start: map[int32]int64{}, End: map[int32]int64{}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	seeds := kgo.SeedBrokers(strings.Split(bootstrap, ",")...)
	cl, err := kgo.NewClient(seeds)
	if err != nil {
		return c, err
	}
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	var ends kadm.ListedOffsets
	if err == nil {
		ends, err = adm.ListCommittedOffsets(ctx, topic)
	}
	if err == nil {
		err = ends.Error()
	}
	cl.Close()
	if err != nil {
		return c, fmt.Errorf("listing offsets of %s: %w", topic, err)
	}
	if len(ends[topic]) == 0 {
		return c, fmt.Errorf("topic %s has no partitions", topic)
	}
	from := map[int32]kgo.Offset{}
	pending := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		s := starts[topic][o.Partition].Offset
		c.Start[o.Partition], c.End[o.Partition] = s, o.Offset
		if o.Offset > s {
			from[o.Partition] = kgo.NewOffset().At(s)
			pending[o.Partition] = o.Offset
		}
	})
	if len(pending) == 0 {
		return c, nil
	}
	cons, err := kgo.NewClient(seeds, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return c, err
	}
	defer cons.Close()
	for len(pending) > 0 {
		fetches := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			return c, fmt.Errorf("reading %s: %w (partitions not read to their end: %v)", topic, ctx.Err(), pending)
		}
		if err := fetches.Err(); err != nil {
			return c, fmt.Errorf("reading %s: %w", topic, err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			end, ok := pending[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			if r.Offset+1 >= end {
				delete(pending, r.Partition)
			}
			if !r.Attrs.IsControl() {
				c.Records = append(c.Records, r)
			}
		})
	}
	return c, nil
}

// LatestTotals folds a changelog: the latest value of each key (records of
// a key are in one partition, in offset order), an 8-byte big-endian
// total; a null value deletes the key.
func LatestTotals(recs []*kgo.Record) (map[string]int64, error) {
	out := map[string]int64{}
	for _, r := range recs {
		if r.Value == nil {
			delete(out, string(r.Key))
			continue
		}
		if len(r.Value) != 8 {
			return nil, fmt.Errorf("changelog record %s-%d@%d: value has %d bytes, want 8", r.Topic, r.Partition, r.Offset, len(r.Value))
		}
		out[string(r.Key)] = int64(binary.BigEndian.Uint64(r.Value))
	}
	return out, nil
}

// ReadTotals reads a changelog's latest committed totals, and how many
// records it holds.
func ReadTotals(bootstrap, topic string) (map[string]int64, int, error) {
	c, err := ReadTopic(bootstrap, topic, 30*time.Second)
	if err != nil {
		return nil, 0, err
	}
	got, err := LatestTotals(c.Records)
	return got, len(c.Records), err
}

// CheckChangelog returns nil when the changelog's latest committed totals
// equal want exactly (no other keys either).
func CheckChangelog(bootstrap, topic string, want map[string]int64) error {
	got, _, err := ReadTotals(bootstrap, topic)
	if err != nil {
		return err
	}
	return DiffTotals("changelog "+topic, got, want)
}

// ReadNotifications reads the committed notifications of topic: each
// product's values, in order.
func ReadNotifications(bootstrap, topic string) (map[string][]int64, error) {
	c, err := ReadTopic(bootstrap, topic, 30*time.Second)
	if err != nil {
		return nil, err
	}
	got := map[string][]int64{}
	for _, r := range c.Records {
		if windowed(r) {
			continue
		}
		var n sales.Notification
		if err := json.Unmarshal(r.Value, &n); err != nil {
			return nil, fmt.Errorf("notification %s-%d@%d %q: %w", r.Topic, r.Partition, r.Offset, r.Value, err)
		}
		got[n.SKU] = append(got[n.SKU], n.Value)
	}
	return got, nil
}

// windowed reports whether a notification is a window's (it carries
// sales.WindowHeader).
func windowed(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == sales.WindowHeader {
			return true
		}
	}
	return false
}

// ReadWindows reads a window changelog topic: the latest committed total
// of each window, keyed "product@start" (start in ms); a tombstone
// deletes it.
func ReadWindows(bootstrap, topic string) (map[string]int64, error) {
	c, err := ReadTopic(bootstrap, topic, 30*time.Second)
	if err != nil {
		return nil, err
	}
	got := map[string]int64{}
	for _, r := range c.Records {
		p, start, err := sales.DecodeWindowKey(r.Key)
		if err != nil {
			return nil, fmt.Errorf("window record %s-%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
		}
		k := fmt.Sprintf("%s@%d", p, start)
		if r.Value == nil {
			delete(got, k)
			continue
		}
		v, err := sales.DecodeTotal(r.Value)
		if err != nil {
			return nil, fmt.Errorf("window record %s-%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
		}
		got[k] = v
	}
	return got, nil
}

// WindowTruth returns, from the records of an input topic, each window's
// total ("product@start", start in ms) of the tumbling windows of size by
// record timestamp: the product is the record key, or without one the
// event's product field; events that are not valid are left out.
func WindowTruth(recs []*kgo.Record, size time.Duration) map[string]int64 {
	out := map[string]int64{}
	for _, r := range recs {
		key, value, _, err := sales.DecodeKey(r.Key, r.Value)
		if err != nil {
			continue
		}
		start := sales.WindowStart(r.Timestamp.UnixMilli(), size.Milliseconds())
		out[fmt.Sprintf("%s@%d", key, start)] += value
	}
	return out
}

// InputTotals returns each product's total of the records of an input
// topic (the product is the key, or the event's product field): what the
// service must reach.
func InputTotals(recs []*kgo.Record) map[string]int64 {
	out := map[string]int64{}
	for _, r := range recs {
		if key, value, _, err := sales.DecodeKey(r.Key, r.Value); err == nil {
			out[string(key)] += value
		}
	}
	return out
}

// DiffTotals returns nil when got equals want, else an error naming what
// and (up to 5 of) the differences: products missing, wrong or unexpected.
func DiffTotals(what string, got, want map[string]int64) error {
	var diffs []string
	for _, p := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[p]; !ok {
			diffs = append(diffs, p+": missing")
		} else if g != want[p] {
			diffs = append(diffs, fmt.Sprintf("%s: got %d want %d", p, g, want[p]))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: unexpected (%d)", p, got[p]))
		}
	}
	if err := Summarize(diffs); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Summarize returns nil for no differences, else an error counting them and
// listing the first 5.
func Summarize(diffs []string) error {
	if len(diffs) == 0 {
		return nil
	}
	n, more := len(diffs), ""
	if n > 5 {
		more = fmt.Sprintf(" (and %d more)", n-5)
		diffs = diffs[:5]
	}
	return fmt.Errorf("%d differences: %s%s", n, strings.Join(diffs, "; "), more)
}

// TopicIDs returns the ids of topics, as the cluster at bootstrap lists them.
func TopicIDs(bootstrap string, topics ...string) (map[string][16]byte, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listed, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		return nil, err
	}
	ids := map[string][16]byte{}
	for _, topic := range topics {
		td, ok := listed[topic]
		if !ok || td.Err != nil {
			return nil, fmt.Errorf("listing topic %s: %v", topic, td.Err)
		}
		ids[topic] = td.ID
	}
	return ids, nil
}
