package main

import (
	"context"
	"encoding/binary"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestVerifyChangelog: the verifier reads every partition to its stable end
// through the service's changelog reader: committed totals in the right
// partitions pass, an aborted transaction's values are not seen, and a wrong
// total is a mismatch.
func TestVerifyChangelog(t *testing.T) {
	const topic, partitions = "bench-PRODUCT_AGGREGATED_SALES-changelog", 3
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addr := c.ListenAddrs()[0]
	expected := []int64{10, 20, 30, 40, 50}
	write := func(commit bool, totals []int64) {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID("tx"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		var recs []*kgo.Record
		for n, v := range totals {
			key := []byte("p" + strconv.Itoa(n))
			recs = append(recs, &kgo.Record{Topic: topic, Partition: sales.Partition(key, partitions), Key: key,
				Value: binary.BigEndian.AppendUint64(nil, uint64(v))})
		}
		harness.Transaction(t, cl, commit, recs...)
	}
	write(true, []int64{1, 2, 3, 4, 5})
	write(true, expected)
	write(false, []int64{99, 99, 99, 99, 99})

	ctx := context.Background()
	if vr := verifyChangelog(ctx, addr, topic, expected, partitions); !vr.OK || vr.KeysFound != 5 || vr.ChangelogRecords != 10 {
		t.Fatalf("a correct changelog: %+v", vr)
	}
	wrong := append([]int64(nil), expected...)
	wrong[3] = 41
	if vr := verifyChangelog(ctx, addr, topic, wrong, partitions); vr.OK || vr.Mismatches != 1 {
		t.Fatalf("one wrong total: %+v", vr)
	}
}
