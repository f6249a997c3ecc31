package changelog_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

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
