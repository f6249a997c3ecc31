package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

// broker is the Kafka broker of the run: one started by test/kafka/kafka.sh
// in a temp dir, or the one given with --bootstrap.
type broker struct {
	addr     string
	kafkaDir string // "" when external
	script   string
	version  string
}

// startBroker runs `kafka.sh up` with KAFKA_DIR under tmp.
func startBroker(ctx context.Context, repo, tmp string) (*broker, error) {
	b := &broker{kafkaDir: filepath.Join(tmp, "kafka"), script: filepath.Join(repo, "test", "kafka", "kafka.sh")}
	logf("starting a Kafka broker: KAFKA_DIR=%s %s up", b.kafkaDir, b.script)
	cmd := exec.CommandContext(ctx, b.script, "up")
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+b.kafkaDir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return b, fmt.Errorf("kafka.sh up: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	b.addr = strings.TrimSpace(lines[len(lines)-1])
	if log, err := os.ReadFile(filepath.Join(b.kafkaDir, "broker.log")); err == nil {
		if m := regexp.MustCompile(`Kafka version: (\S+)`).FindSubmatch(log); m != nil {
			b.version = string(m[1])
		}
	}
	return b, nil
}

// down stops the broker started by startBroker (always, with its own timeout).
func (b *broker) down() {
	if b == nil || b.kafkaDir == "" {
		return
	}
	logf("stopping the Kafka broker (kafka.sh down)")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.script, "down")
	cmd.Env = append(os.Environ(), "KAFKA_DIR="+b.kafkaDir)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		logf("kafka.sh down: %v", err)
	}
}

func newAdmin(addr string, opts ...kgo.Opt) (*kgo.Client, *kadm.Client, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	return cl, kadm.NewClient(cl), nil
}

// brokerVersionGuess asks the broker for its API versions (for --bootstrap).
func brokerVersionGuess(ctx context.Context, adm *kadm.Client) string {
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

func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	_, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	return nil
}

// dataset is the generated input: per-product expected totals and the end
// offsets of the input topic after producing.
type dataset struct {
	topic     string
	events    int
	expected  map[string]int64
	ends      map[int32]int64
	produceMs int64
	bytes     int64
}

// generate produces the events into topic (created with the given
// partitions) with franz-go's default partitioner (murmur2 on the key, as
// the Java client) and returns the expected totals.
func generate(ctx context.Context, addr, topic string, o options, adm *kadm.Client) (*dataset, error) {
	if err := createTopic(ctx, adm, topic, o.partitions); err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(1<<20),
		kgo.MaxBufferedRecords(200_000),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	ds := &dataset{topic: topic, events: o.events, expected: make(map[string]int64, o.products)}
	rng := rand.New(rand.NewPCG(o.seed, o.seed^0x9e3779b97f4a7c15))
	var (
		failed   = make(chan error, 1)
		t0       = time.Now()
		lastLog  = t0
		valueBuf []byte
	)
	for i := 0; i < o.events; i++ {
		product := "p" + strconv.Itoa(rng.IntN(o.products))
		value := int64(1 + rng.IntN(1000))
		ds.expected[product] += value
		valueBuf = valueBuf[:0]
		valueBuf = append(valueBuf, `{"product":"`...)
		valueBuf = append(valueBuf, product...)
		valueBuf = append(valueBuf, `","value":`...)
		valueBuf = strconv.AppendInt(valueBuf, value, 10)
		valueBuf = append(valueBuf, '}')
		r := &kgo.Record{Key: []byte(product), Value: bytes.Clone(valueBuf)}
		ds.bytes += int64(len(r.Key) + len(r.Value))
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		})
		if now := time.Now(); now.Sub(lastLog) >= 5*time.Second {
			lastLog = now
			logf("producing: %d of %d events", i+1, o.events)
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return nil, fmt.Errorf("flushing the producer: %w", err)
	}
	select {
	case err := <-failed:
		return nil, fmt.Errorf("producing to %s: %w", topic, err)
	default:
	}
	ds.produceMs = time.Since(t0).Milliseconds()

	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of %s: %w", topic, err)
	}
	ds.ends = map[int32]int64{}
	var sum int64
	ends.Each(func(lo kadm.ListedOffset) {
		ds.ends[lo.Partition] = lo.Offset
		sum += lo.Offset
	})
	if len(ds.ends) != o.partitions || sum != int64(o.events) {
		return nil, fmt.Errorf("input topic %s holds %d records in %d partitions, want %d in %d", topic, sum, len(ds.ends), o.events, o.partitions)
	}
	return ds, nil
}

// committedAtEnd reports whether the group's committed offsets of topic
// reached ends on every partition, and how many offsets are committed.
func committedAtEnd(ctx context.Context, adm *kadm.Client, group, topic string, ends map[int32]int64) (bool, int64, error) {
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

// verifyResult is the comparison of a changelog with the expected totals.
type verifyResult struct {
	Changelog        string   `json:"changelog_topic"`
	ChangelogRecords int64    `json:"changelog_records"`
	Tombstones       int64    `json:"tombstones"`
	BadValues        int64    `json:"bad_values"`
	KeysExpected     int      `json:"keys_expected"`
	KeysFound        int      `json:"keys_found"`
	KeysChecked      int      `json:"keys_checked"`
	Mismatches       int      `json:"mismatches"`
	Missing          int      `json:"missing"`
	Extra            int      `json:"extra"`
	WrongPartition   int      `json:"keys_in_wrong_partition"`
	MultiPartition   int      `json:"keys_in_several_partitions"`
	Examples         []string `json:"examples,omitempty"`
	ReadMs           int64    `json:"read_ms"`
	OK               bool     `json:"ok"`
	Error            string   `json:"error,omitempty"`
}

// verifyChangelog reads the whole changelog topic (latest value per key) and
// compares every key with the expected totals. A key must live in partition
// murmur2(key) mod N, the partition the input producer put it in.
func verifyChangelog(ctx context.Context, addr, topic string, expected map[string]int64, partitions int) verifyResult {
	vr := verifyResult{Changelog: topic, KeysExpected: len(expected)}
	t0 := time.Now()
	fail := func(err error) verifyResult {
		vr.Error = err.Error()
		vr.ReadMs = time.Since(t0).Milliseconds()
		return vr
	}
	cl, adm, err := newAdmin(addr)
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fail(fmt.Errorf("listing start offsets of %s: %w", topic, err))
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fail(fmt.Errorf("listing end offsets of %s: %w", topic, err))
	}
	from := map[int32]kgo.Offset{}
	want := map[int32]int64{} // last offset to read, per partition
	ends.Each(func(lo kadm.ListedOffset) {
		s, _ := starts.Lookup(topic, lo.Partition)
		if lo.Offset > s.Offset {
			from[lo.Partition] = kgo.NewOffset().At(s.Offset)
			want[lo.Partition] = lo.Offset - 1
		}
	})
	if len(ends[topic]) != partitions {
		return fail(fmt.Errorf("changelog %s has %d partitions, want %d", topic, len(ends[topic]), partitions))
	}

	type entry struct {
		total int64
		part  int32
	}
	got := map[string]entry{}
	parts := map[string]map[int32]bool{}
	if len(from) > 0 {
		rc, err := kgo.NewClient(
			kgo.SeedBrokers(addr),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.KeepControlRecords(), // offsets of transaction markers count towards the end
			kgo.FetchMaxBytes(64<<20),
		)
		if err != nil {
			return fail(err)
		}
		defer rc.Close()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		for len(want) > 0 {
			fetches := rc.PollFetches(rctx)
			if rctx.Err() != nil {
				return fail(fmt.Errorf("reading %s: %w (partitions not read to the end: %v)", topic, rctx.Err(), want))
			}
			var ferr error
			fetches.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
			if ferr != nil {
				return fail(fmt.Errorf("reading %s: %w", topic, ferr))
			}
			fetches.EachRecord(func(r *kgo.Record) {
				if last, ok := want[r.Partition]; ok && r.Offset >= last {
					delete(want, r.Partition)
				}
				if r.Attrs.IsControl() {
					return
				}
				vr.ChangelogRecords++
				k := string(r.Key)
				if parts[k] == nil {
					parts[k] = map[int32]bool{}
				}
				parts[k][r.Partition] = true
				switch {
				case r.Value == nil:
					vr.Tombstones++
					delete(got, k)
				case len(r.Value) != 8:
					vr.BadValues++
				default:
					got[k] = entry{int64(binary.BigEndian.Uint64(r.Value)), r.Partition}
				}
			})
		}
	}

	vr.KeysFound = len(got)
	example := func(s string) {
		if len(vr.Examples) < 10 {
			vr.Examples = append(vr.Examples, s)
		}
	}
	keys := make([]string, 0, len(expected))
	for k := range expected {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		vr.KeysChecked++
		g, ok := got[k]
		switch {
		case !ok:
			vr.Missing++
			example(fmt.Sprintf("missing %s (want %d)", k, expected[k]))
		case g.total != expected[k]:
			vr.Mismatches++
			example(fmt.Sprintf("%s: changelog %d, want %d (diff %+d)", k, g.total, expected[k], g.total-expected[k]))
		}
		if ok {
			if p := sales.Partition([]byte(k), int32(partitions)); g.part != p {
				vr.WrongPartition++
				example(fmt.Sprintf("%s in changelog partition %d, want %d", k, g.part, p))
			}
		}
	}
	for k, g := range got {
		if _, ok := expected[k]; !ok {
			vr.Extra++
			example(fmt.Sprintf("unexpected key %q = %d", k, g.total))
		}
	}
	for _, ps := range parts {
		if len(ps) > 1 {
			vr.MultiPartition++
		}
	}
	vr.ReadMs = time.Since(t0).Milliseconds()
	vr.OK = vr.Error == "" && vr.Mismatches == 0 && vr.Missing == 0 && vr.Extra == 0 &&
		vr.BadValues == 0 && vr.WrongPartition == 0 && vr.MultiPartition == 0
	return vr
}

// deleteRunTopics deletes the topics and groups of this run (with --bootstrap).
func deleteRunTopics(addr, prefix string, groups []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, adm, err := newAdmin(addr)
	if err != nil {
		return
	}
	defer cl.Close()
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
	if len(del) > 0 {
		if _, err := adm.DeleteTopics(ctx, del...); err != nil {
			logf("cleanup: deleting topics: %v", err)
		} else {
			logf("cleanup: deleted %d topics of this run", len(del))
		}
	}
}

// warmGroupCoordinator commits an offset for a throw-away group, so that the
// broker creates __consumer_offsets and elects the coordinator now rather
// than in the first measured system's start.
func warmGroupCoordinator(ctx context.Context, adm *kadm.Client, group, topic string) error {
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
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}
