package changelog_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/changelog"
	th "github.com/salesagg/salesagg/test/harness"
)

const topic = "app-STORE-changelog"

// broker is an in-process Kafka-protocol broker with one changelog
// partition.
func broker(t *testing.T) []kgo.Opt {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
}

func total(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

// transaction produces recs in one transaction and commits or aborts it.
func transaction(t *testing.T, client []kgo.Opt, commit bool, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(append(client, kgo.TransactionalID("tx"), kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	th.Transaction(t, cl, commit, recs...)
}

func stableEnd(t *testing.T, client []kgo.Opt) int64 {
	t.Helper()
	cl, err := kgo.NewClient(client...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := changelog.Ends(context.Background(), kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}
	return ends[0]
}

// TestScanReadsCommittedRecordsOnly: records of an aborted transaction and
// the transaction markers are passed, the committed records come in offset
// order, and the scan ends at the stable end although the last offsets
// before it hold nothing readable.
func TestScanReadsCommittedRecordsOnly(t *testing.T) {
	client := broker(t)
	transaction(t, client, true, &kgo.Record{Key: []byte("a"), Value: total(1)}, &kgo.Record{Key: []byte("b"), Value: total(2)})
	transaction(t, client, false, &kgo.Record{Key: []byte("a"), Value: total(100)})
	transaction(t, client, true, &kgo.Record{Key: []byte("a"), Value: total(3)}, &kgo.Record{Key: []byte("b")})
	transaction(t, client, false, &kgo.Record{Key: []byte("c"), Value: total(100)})
	end := stableEnd(t, client)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []string
	latest := map[string]int64{}
	err := changelog.Scan(ctx, client, topic, 0, 0, end, func(r *kgo.Record) {
		u, err := changelog.Update(r)
		if err != nil {
			t.Errorf("offset %d: %v", r.Offset, err)
			return
		}
		got = append(got, u.Product)
		if u.Delete {
			delete(latest, u.Product)
		} else {
			latest[u.Product] = u.Entry.Total
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("records read %v, want %v (committed only, in order)", got, want)
	}
	if len(latest) != 1 || latest["a"] != 3 {
		t.Fatalf("latest values %v, want a=3 (b deleted; aborted values never seen)", latest)
	}
}

// TestScanEndsAtAnAbortedTailByTopicName: Scan is given the topic's name
// only. The last records below the end it reads to are an aborted
// transaction's whose abort marker lies past that end (another
// transaction, begun before the abort, is still open): its consumer is
// never given anything there, so Scan asks the broker what lies at its
// position, which a fetch names by the topic's id, and ends.
func TestScanEndsAtAnAbortedTailByTopicName(t *testing.T) {
	client := broker(t)
	transaction(t, client, true, &kgo.Record{Key: []byte("a"), Value: total(1)})
	begin := func(id string) *kgo.Client {
		cl, err := kgo.NewClient(append(client, kgo.TransactionalID(id), kgo.DefaultProduceTopic(topic))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		return cl
	}
	aborted, open := begin("aborted"), begin("open")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := aborted.ProduceSync(ctx, &kgo.Record{Key: []byte("a"), Value: total(100)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := open.ProduceSync(ctx, &kgo.Record{Key: []byte("b"), Value: total(2)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := aborted.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = open.EndTransaction(context.Background(), kgo.TryAbort) })
	end := stableEnd(t, client)

	var got []string
	// The question waits behind the consumer's fetch: a short one.
	opts := append(slices.Clip(client), kgo.FetchMaxWait(500*time.Millisecond))
	err := changelog.Scan(ctx, opts, topic, 0, 0, end, func(r *kgo.Record) { got = append(got, string(r.Key)) })
	if err != nil {
		t.Fatalf("Scan to the stable end %d: %v (read %v)", end, err, got)
	}
	if !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Scan read %v, want [a] (the committed record only)", got)
	}
}

// TestReaderPositionPastTheLogIsOutOfRange: a position the partition does
// not have is an error the caller sees (it wipes its copy), not a silent
// jump to the log start.
func TestReaderPositionPastTheLogIsOutOfRange(t *testing.T) {
	client := broker(t)
	transaction(t, client, true, &kgo.Record{Key: []byte("a"), Value: total(1)})
	end := stableEnd(t, client)
	r, err := changelog.Open(changelog.Options{Client: client, Topic: topic, From: end + 10})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 100; i++ {
		b, err := r.Next(ctx)
		if errors.Is(err, changelog.ErrOutOfRange) {
			return
		}
		if err != nil {
			t.Fatalf("Next: %v, want ErrOutOfRange", err)
		}
		if len(b.Records) > 0 {
			t.Fatalf("read %d records from past the log's end", len(b.Records))
		}
	}
	t.Fatal("no ErrOutOfRange after 100 reads")
}

// TestReaderPositionBelowTheLogStartIsOutOfRange: while a reader that has
// read everything asks the broker what lies at its position (it got
// nothing for Quiet), records are written and deleted (retention;
// compaction moves the log start the same way), a tombstone among them.
// Its position is now below the log start: Next returns ErrOutOfRange, so
// that the caller wipes its copy and restores from the start, not a batch
// that skips to the new start and leaves it holding the deleted key.
func TestReaderPositionBelowTheLogStartIsOutOfRange(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	client := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.FetchMaxWait(500 * time.Millisecond)}
	transaction(t, client, true, &kgo.Record{Key: []byte("a"), Value: total(1)}, &kgo.Record{Key: []byte("b"), Value: total(2)})
	end := stableEnd(t, client)

	// The reader's question (a fetch that does not wait, at its position)
	// is answered once the records are gone.
	asked, gone := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		if req.MaxWaitMillis != 0 || len(req.Topics) != 1 || len(req.Topics[0].Partitions) != 1 || req.Topics[0].Partitions[0].FetchOffset != end {
			return nil, nil, false
		}
		once.Do(func() {
			close(asked)
			c.SleepControl(func() { <-gone })
		})
		return nil, nil, false
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := changelog.Open(changelog.Options{Client: client, Topic: topic, TopicID: c.TopicInfo(topic).TopicID, Quiet: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for r.Position() < end {
		if _, err := r.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		b   changelog.Batch
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := r.Next(ctx)
		done <- result{b, err}
	}()
	select {
	case <-asked:
	case <-ctx.Done():
		t.Fatal("the reader did not ask the broker what lies at its position")
	}
	transaction(t, client, true, &kgo.Record{Key: []byte("a")}, &kgo.Record{Key: []byte("c"), Value: total(3)})
	newStart := stableEnd(t, client)
	cl, err := kgo.NewClient(client...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	to := kadm.Offsets{}
	to.AddOffset(topic, 0, newStart, -1)
	deleted, err := kadm.NewClient(cl).DeleteRecords(ctx, to)
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	close(gone)

	res := <-done
	if !errors.Is(res.err, changelog.ErrOutOfRange) {
		t.Fatalf("Next at %d with the log start at %d: %d records, next %d, skipped from %d, error %v; want ErrOutOfRange (offsets %d to %d, a's tombstone among them, were never read)",
			end, newStart, len(res.b.Records), res.b.Next, res.b.SkippedFrom, res.err, end, newStart-1)
	}
}

// TestReaderBatchesAreBounded: one Next returns at most about FetchBytes
// of records, so a reader's memory does not grow with the partition.
func TestReaderBatchesAreBounded(t *testing.T) {
	client := broker(t)
	// 20 transactions of 10 records: 20 record batches of about 10 KB (a
	// fetch always returns at least one whole batch).
	for tx := range 20 {
		var recs []*kgo.Record
		for i := range 10 {
			recs = append(recs, &kgo.Record{Key: binary.BigEndian.AppendUint32(nil, uint32(tx*10+i)), Value: noise(1000)})
		}
		transaction(t, client, true, recs...)
	}
	end := stableEnd(t, client)
	r, err := changelog.Open(changelog.Options{Client: client, Topic: topic, FetchBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	read, batches := 0, 0
	for r.Position() < end && batches < 1000 {
		b, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		batches++
		read += len(b.Records)
		if b.Next != r.Position() {
			t.Fatalf("batch ends at %d, reader at %d", b.Next, r.Position())
		}
	}
	if read != 200 {
		t.Fatalf("read %d records, want 200", read)
	}
	if batches < 2 {
		t.Fatalf("200 KB came in %d batch with 16 KiB fetches", batches)
	}
}

// noise is n bytes that do not compress.
func noise(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}
