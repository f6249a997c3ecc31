//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/test/harness"
)

// TestKafkaCluster: a 3-node Apache Kafka cluster of its own (kafka.sh, KAFKA_NODES=3, 2 client listeners) rides out the faults the harness injects: the leader of a partition SIGKILLed (a new one is elected, acks=all produce goes on with 2 of 3 in sync), a group coordinator SIGSTOPped past the broker session timeout (fenced, the coordinator moves, the group's offsets stay), one client blackholed from every node (its produce waits while a direct client's completes, and completes once healed), a follower SIGSTOPped while the leader appends (the records are above the high watermark and changelog.LogEnd sees them until the follower copies them); every record lands exactly once.
func TestKafkaCluster(t *testing.T) {
	requireOwnBroker(t) // the suite may run without Java when the broker is external
	t0 := time.Now()
	c := harness.StartKafkaCluster(t, repoRoot, t.TempDir(), 3, 2) // logs how long it took

	ctx := context.Background()
	_, topic, _ := testNames("cluster")
	adm := kadm.NewClient(harness.NewClient(t, c.Bootstrap()))
	{
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := adm.CreateTopic(cctx, 3, 3, nil, topic)
		cancel()
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating %s (3 partitions, RF 3): %v", topic, err)
		}
	}
	for p := range int32(3) {
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("%s-%d fully replicated", topic, p), func() error {
			isr, err := c.ISR(ctx, topic, p)
			if err != nil {
				return err
			}
			if len(isr) != 3 {
				return fmt.Errorf("ISR %v", isr)
			}
			return nil
		})
	}

	// written counts the records acknowledged, by key: each must be read
	// back exactly once.
	written := map[string]int{}
	manual := kgo.RecordPartitioner(kgo.ManualPartitioner())
	// produce sends one record per partition, keys tag-0..tag-2, and
	// requires every one acknowledged (acks=all, idempotent: the default).
	produce := func(cl *kgo.Client, tag string) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		start := time.Now()
		if err := cl.ProduceSync(pctx, partitionRecords(topic, tag)...).FirstErr(); err != nil {
			t.Fatalf("producing %s: %v", tag, err)
		}
		for p := range 3 {
			written[fmt.Sprintf("%s-%d", tag, p)]++
		}
		t.Logf("produced %s to every partition in %s", tag, time.Since(start).Round(time.Millisecond))
	}

	// Listener 1: a client that only ever talks to the cluster through
	// its proxies.
	p1 := harness.StartProxySet(t, c, 1)
	prod := harness.NewClient(t, p1.Bootstrap(), manual, kgo.RequiredAcks(kgo.AllISRAcks()))
	produce(prod, "first")
	{
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		md, err := kadm.NewClient(prod).BrokerMetadata(mctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, b := range md.Brokers {
			got = append(got, fmt.Sprintf("%s:%d", b.Host, b.Port))
		}
		sort.Strings(got)
		want := strings.Split(p1.Bootstrap(), ",")
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Fatalf("metadata through listener CLIENT1 names brokers %v, want its proxies %v", got, want)
		}
	}

	// A leader killed: the controller fences it and elects another; acks=all
	// goes on with 2 of 3 replicas in sync (min.insync.replicas=2).
	leader, err := c.LeaderOf(ctx, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	var newLeader int32
	took := harness.WaitFor(t, 45*time.Second, fmt.Sprintf("a leader of %s-0 other than the killed node %d", topic, leader), func() error {
		l, err := c.LeaderOf(ctx, topic, 0)
		if err != nil {
			return err
		}
		if l == leader {
			return fmt.Errorf("node %d still leads", l)
		}
		newLeader = l
		return nil
	})
	t.Logf("node %d (leader of %s-0) killed; node %d leads after %s", leader, topic, newLeader, took.Round(time.Millisecond))
	harness.Expect(t, 10*time.Second, fmt.Sprintf("the ISR of %s-0 without node %d", topic, leader), func() error {
		isr, err := c.ISR(ctx, topic, 0)
		if err != nil {
			return err
		}
		if len(isr) != 2 || slices.Contains(isr, leader) {
			return fmt.Errorf("ISR %v", isr)
		}
		return nil
	})
	produce(prod, "after-kill")
	t1 := time.Now()
	if err := c.Start(leader); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c)
	t.Logf("node %d restarted and the cluster healthy again in %s", leader, time.Since(t1).Round(time.Millisecond))

	// A transaction, as its coordinator describes it.
	txnID := topic + "-txn"
	txn := harness.NewClient(t, p1.Bootstrap(), manual, kgo.TransactionalID(txnID))
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	{
		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := txn.ProduceSync(pctx, &kgo.Record{Topic: topic, Partition: 1, Key: []byte("txn-1")}).FirstErr()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	pid, epoch, err := txn.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.DescribeTransaction(ctx, txnID)
	if err != nil {
		t.Fatal(err)
	}
	coord, err := c.TxnCoordinator(ctx, txnID)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != "Ongoing" || d.ProducerID != pid || d.ProducerEpoch != epoch || d.Coordinator != coord {
		t.Errorf("open transaction described as %+v, want Ongoing, producer %d epoch %d, coordinator %d", d, pid, epoch, coord)
	}
	{
		ectx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := txn.EndTransaction(ectx, kgo.TryCommit)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		written["txn-1"]++
	}
	harness.Expect(t, 30*time.Second, "the transaction described as CompleteCommit", func() error {
		d, err := c.DescribeTransaction(ctx, txnID)
		if err != nil {
			return err
		}
		if d.State != "CompleteCommit" {
			return fmt.Errorf("state %s", d.State)
		}
		return nil
	})
	if l, err := c.ListTransactions(ctx); err != nil || !slices.ContainsFunc(l, func(x harness.TxnListing) bool { return x.ID == txnID }) {
		t.Errorf("ListTransactions = %v, %v; want %s listed", l, err, txnID)
	}
	t.Logf("transaction %s (producer %d, epoch %d) on coordinator node %d: Ongoing, then CompleteCommit", txnID, pid, epoch, coord)

	// A group coordinator paused past broker.session.timeout.ms (9 s): the
	// controller fences it and the group's coordinator moves, with its
	// committed offsets.
	group := topic + "-group"
	var offsets kadm.Offsets
	for p := range int32(3) {
		offsets.Add(kadm.Offset{Topic: topic, Partition: p, At: 1, LeaderEpoch: -1})
	}
	harness.WaitFor(t, 60*time.Second, "committing the group's offsets", func() error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := adm.CommitOffsets(cctx, group, offsets)
		if err != nil {
			return err
		}
		return resp.Error()
	})
	gcoord, err := c.GroupCoordinator(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(gcoord); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	var movedTo int32
	harness.WaitFor(t, 45*time.Second, fmt.Sprintf("the controller to fence the paused node %d and the coordinator of %s to move", gcoord, group), func() error {
		fenced, err := c.Fenced(ctx)
		if err != nil {
			return err
		}
		if !slices.Contains(fenced, gcoord) {
			return fmt.Errorf("fenced brokers %v", fenced)
		}
		n, err := c.GroupCoordinator(ctx, group)
		if err != nil {
			return err
		}
		if n == gcoord {
			return fmt.Errorf("node %d still coordinates it", n)
		}
		movedTo = n
		return nil
	})
	t.Logf("node %d (coordinator of %s) paused; fenced and the coordinator on node %d after %s", gcoord, group, movedTo, time.Since(paused).Round(time.Millisecond))
	// Right after the move the new coordinator can answer an OffsetFetch
	// with no offsets and no error (seen for up to ~0.5 s): poll.
	live := kadm.NewClient(harness.NewClient(t, c.LiveBootstrap()))
	var firstMiss error
	fetched := time.Now()
	if harness.Expect(t, 30*time.Second, fmt.Sprintf("the offsets of %s on its new coordinator", group), func() error {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		got, err := live.FetchOffsets(fctx, group)
		if err == nil {
			err = got.Error()
		}
		if err != nil {
			if firstMiss == nil {
				firstMiss = fmt.Errorf("error: %w", err)
			}
			return err
		}
		for p := range int32(3) {
			if o, ok := got.Lookup(topic, p); !ok || o.At != 1 {
				err := fmt.Errorf("offsets %+v, want 1 for each partition of %s", got, topic)
				if firstMiss == nil {
					firstMiss = err
				}
				return err
			}
		}
		return nil
	}) {
		t.Logf("the new coordinator serves the group's offsets after %s (first miss: %v)", time.Since(fetched).Round(time.Millisecond), firstMiss)
	}
	if err := c.Resume(gcoord); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	waitHealthy(t, c)
	t.Logf("node %d resumed and the cluster healthy again in %s", gcoord, time.Since(t2).Round(time.Millisecond))

	// Listener 2: one client cut off from every node; a direct client is not.
	p2 := harness.StartProxySet(t, c, 2)
	cut := harness.NewClient(t, p2.Bootstrap(), manual)
	direct := harness.NewClient(t, c.Bootstrap(), manual)
	produce(cut, "cut-before")
	produce(direct, "direct-before")
	p2.BlackholeAll()
	blackholed := time.Now()
	done := make(chan error, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		done <- cut.ProduceSync(pctx, partitionRecords(topic, "cut-during")...).FirstErr()
	}()
	produce(direct, "direct-during")
	select {
	case err := <-done:
		t.Fatalf("the blackholed client's produce completed (%v) after %s, want it held", err, time.Since(blackholed))
	case <-time.After(2 * time.Second):
	}
	var conns int
	for _, n := range c.Nodes() {
		conns += p2.Proxy(n).Conns()
	}
	if conns == 0 {
		t.Errorf("the blackholed client has no connection through its proxies")
	}
	p2.PassAll()
	healed := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the healed client's produce: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the healed client's produce did not complete within 30 s")
	}
	for p := range 3 {
		written[fmt.Sprintf("cut-during-%d", p)]++
	}
	t.Logf("blackholed client held %s (%d connections); its produce completed %s after Pass", healed.Sub(blackholed).Round(time.Millisecond), conns, time.Since(healed).Round(time.Millisecond))

	// A follower paused: what the leader appends is above the high
	// watermark until the follower copies it; changelog.LogEnd (what a
	// restore waits for) sees it, the high watermark does not.
	waitHealthy(t, c)
	{
		lead, err := c.LeaderOf(ctx, topic, 1)
		if err != nil {
			t.Fatal(err)
		}
		isr, err := c.ISR(ctx, topic, 1)
		if err != nil {
			t.Fatal(err)
		}
		follower := int32(-1)
		for _, n := range isr {
			if n != lead {
				follower = n
				break
			}
		}
		if follower < 0 {
			t.Fatalf("%s-1 has no follower in sync: ISR %v, leader %d", topic, isr, lead)
		}
		ends := func(cl *kgo.Client) changelog.LeaderEnds {
			t.Helper()
			e, err := changelog.LogEnd(ctx, cl, topic, 1, nil)
			if err != nil {
				t.Fatalf("the ends of %s-1: %v", topic, err)
			}
			return e
		}
		before := ends(harness.NewClient(t, c.Bootstrap()))
		if before.LogEnd != before.HighWatermark {
			t.Fatalf("%s-1 with every replica in sync: %+v, want the log end at the high watermark", topic, before)
		}
		if err := c.Pause(follower); err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		// Clients made now, seeded with the live nodes only: none waits on
		// the paused one.
		direct := harness.NewClient(t, c.LiveBootstrap())
		leaderOnly := harness.NewClient(t, c.LiveBootstrap(), manual, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		recs := []*kgo.Record{{Topic: topic, Partition: 1, Key: []byte("unreplicated-a")}, {Topic: topic, Partition: 1, Key: []byte("unreplicated-b")}}
		err = leaderOnly.ProduceSync(pctx, recs...).FirstErr()
		cancel()
		if err != nil {
			t.Fatalf("producing with acks=1 while node %d is paused: %v", follower, err)
		}
		written["unreplicated-a"]++
		written["unreplicated-b"]++
		during := ends(direct)
		if took := time.Since(paused); took > 8*time.Second {
			t.Fatalf("the checks took %s: the controller may have fenced node %d (9 s), which moves the high watermark", took, follower)
		}
		if during.LogEnd != before.LogEnd+2 || during.HighWatermark != before.HighWatermark {
			t.Fatalf("with follower %d paused, after 2 records acks=1: %+v; want the log end at %d and the high watermark still at %d",
				follower, during, before.LogEnd+2, before.HighWatermark)
		}
		if err := c.Resume(follower); err != nil {
			t.Fatal(err)
		}
		took := harness.WaitFor(t, 60*time.Second, fmt.Sprintf("the high watermark of %s-1 to reach the records appended while node %d was paused", topic, follower), func() error {
			if e := ends(direct); e.HighWatermark < during.LogEnd {
				return fmt.Errorf("%+v", e)
			}
			return nil
		})
		t.Logf("node %d (follower of %s-1) paused: 2 records appended above the high watermark %d, seen in the leader's log end; copied %s after the resume", follower, topic, before.HighWatermark, took.Round(time.Millisecond))
	}

	// Every acknowledged record once, none other.
	content, err := harness.ReadTopic(c.Bootstrap(), topic, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]int{}
	for _, r := range content.Records {
		read[string(r.Key)]++
	}
	var diffs []string
	for k, n := range written {
		if read[k] != n {
			diffs = append(diffs, fmt.Sprintf("%s: read %d, written %d", k, read[k], n))
		}
	}
	for k, n := range read {
		if _, ok := written[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: read %d, never written", k, n))
		}
	}
	sort.Strings(diffs)
	if err := harness.Summarize(diffs); err != nil {
		t.Errorf("records of %s: %v", topic, err)
	}
	t.Logf("%d records read back, each once; scenario took %s", len(content.Records), time.Since(t0).Round(time.Millisecond))
}

// partitionRecords is one record for each of the 3 partitions of topic,
// keyed tag-<partition>.
func partitionRecords(topic, tag string) []*kgo.Record {
	var out []*kgo.Record
	for p := range int32(3) {
		out = append(out, &kgo.Record{Topic: topic, Partition: p, Key: []byte(fmt.Sprintf("%s-%d", tag, p)), Value: []byte(tag)})
	}
	return out
}

// waitHealthy waits up to 90 s for c.WaitHealthy.
func waitHealthy(t *testing.T, c *harness.KafkaCluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
}
