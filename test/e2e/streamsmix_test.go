//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestMixedStreamsGroupWithKafkaStreams: a live migration from Kafka Streams to salesagg and
// back, one instance at a time, in one streams group, both sides under one guarantee (each in
// turn; the handovers are clean, so at-least-once is exact too). salesagg
// describes the reference's topology field for field (the coordinator refuses any other;
// docs/streams-protocol.md §9) and forwards through Kafka Streams' repartition topic in its
// format, so a third of the events, produced with an empty key, travel between the two
// implementations' tasks in both directions. The reference R1 runs the three tasks; salesagg S
// joins and takes some while R1 runs the rest; R1 stops and S runs all three; a new reference
// R2 joins and takes some; S stops and R2 runs all three. Between each step a batch is
// produced, and after each the changelog both write holds every event's exact total; while S
// and R1 share the group each answers every product over HTTP (forwarding a query to the other
// for its tasks), S's answers are exact while it runs every task, S forwarded events, and
// alone it deletes the repartition records the group committed (repartition.purge.interval.ms).
func TestMixedStreamsGroupWithKafkaStreams(t *testing.T) {
	buildReference(t)
	for _, guarantee := range []string{"exactly_once_v2", "at_least_once"} {
		t.Run(guarantee, func(t *testing.T) { mixedStreamsGroup(t, guarantee) })
	}
}

func mixedStreamsGroup(t *testing.T, guarantee string) {
	rng, appID, input, notif := begin(t, "sgmix", 0x73676d78)
	createTopic(t, notif, 3, nil)
	events := harness.GenEvents(rng, "mx", 30, 1500)
	// A third with an empty key, spread over the partitions: most land on a partition that
	// does not own their product, whichever side runs it.
	for i := range events {
		if rng.IntN(3) == 0 {
			events[i].NoKey, events[i].Misroute, events[i].To = true, true, int32(i%3)
		}
	}
	batches := [][]harness.Event{events[:300], events[300:600], events[600:900], events[900:1200], events[1200:]}
	changelog := sales.ChangelogTopic(appID, sales.StoreName)
	sent := 0
	produce := func(what string) {
		t.Helper()
		harness.Produce(t, newClient(t, kgo.RecordPartitioner(harness.HeaderPartitioner{})), recordsOf(input, batches[sent])...)
		sent++
		want := harness.TotalsOf(events[:300*sent])
		harness.WaitFor(t, 2*time.Minute, "the changelog to hold every total after "+what, func() error {
			got, _, err := harness.ReadTotals(bootstrap, changelog)
			if err != nil {
				return err
			}
			return harness.DiffTotals(changelog, got, want)
		})
	}
	alive := func(r *reference) {
		t.Helper()
		if errs := r.marker("ERROR"); len(errs) > 0 || !r.Alive() {
			t.Fatalf("%s: %v, exited: %s", r.Name, errs, r.DescribeExit())
		}
	}
	dir := t.TempDir()
	r1addr := harness.FreeAddr(t)
	r1 := startReference(t, appID, filepath.Join(dir, "r1"), input, notif, "--prop", "group.protocol=streams", "--processing-guarantee", guarantee,
		"--http-addr", r1addr)
	r1.waitRunning(t, 3*time.Minute)
	produce("the reference ran alone")

	svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "s"), Input: input, Notif: notif, CommitMs: 200,
		Flags: []string{"--processing.guarantee", guarantee, "--group.protocol", "streams", "--repartition.purge.interval.ms", "500"}})
	s := &harness.Member{Name: "salesagg", Service: svc}
	harness.WaitFor(t, 2*time.Minute, "salesagg to run some of the tasks beside the reference", func() error {
		if ts := running(t, s); len(ts) == 0 || len(ts) == 3 {
			return fmt.Errorf("salesagg runs %v", ts)
		}
		return svc.Ready()
	})
	alive(r1)
	produce("salesagg joined the reference")
	alive(r1)
	if c, err := svc.Counters(); err != nil || c.Forwarded == 0 || c.Bad != 0 {
		t.Fatalf("salesagg beside the reference: %+v, %v; want events forwarded and none bad", c, err)
	}
	// Any instance answers for every product: each forwards a query for a task the other runs
	// to the endpoint the coordinator lists for it.
	both := harness.TotalsOf(events[:600])
	harness.WaitFor(t, time.Minute, "salesagg's HTTP totals, the reference's tasks' included", func() error { return svc.CheckTotals(both) })
	harness.WaitFor(t, time.Minute, "the reference's HTTP totals, salesagg's tasks' included", func() error { return harness.NewAPI(r1addr).CheckTotals(both) })

	r1.terminate(t)
	harness.WaitFor(t, 2*time.Minute, "salesagg to run all 3 tasks once the reference left", func() error {
		if ts := running(t, s); len(ts) != 3 {
			return fmt.Errorf("salesagg runs %v", ts)
		}
		return nil
	})
	adm := kadm.NewClient(newClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	repartition := appID + "-" + sales.RepartitionName + "-repartition"
	before, err := adm.ListEndOffsets(ctx, repartition)
	if err != nil {
		t.Fatal(err)
	}
	produce("the reference left")
	harness.WaitFor(t, time.Minute, "salesagg's HTTP totals", func() error { return svc.CheckTotals(harness.TotalsOf(events[:900])) })
	// salesagg alone now deletes what it committed of the repartition topic (Kafka Streams'
	// retention.ms -1 keeps the rest forever): past what the last batch forwarded.
	harness.WaitFor(t, time.Minute, "salesagg to delete the committed records of the repartition topic", func() error {
		committed, err := adm.FetchOffsets(ctx, appID)
		if err != nil {
			return err
		}
		starts, err := adm.ListStartOffsets(ctx, repartition)
		if err != nil {
			return err
		}
		for p := int32(0); p < 3; p++ {
			b, _ := before.Lookup(repartition, p)
			c, _ := committed.Lookup(repartition, p)
			st, _ := starts.Lookup(repartition, p)
			if c.At <= b.Offset || st.Offset < c.At {
				return fmt.Errorf("partition %d: end %d before the batch, committed %d, start %d", p, b.Offset, c.At, st.Offset)
			}
		}
		return nil
	})

	r2 := startReference(t, appID, filepath.Join(dir, "r2"), input, notif, "--prop", "group.protocol=streams", "--processing-guarantee", guarantee)
	r2.waitRunning(t, 3*time.Minute)
	harness.WaitFor(t, 2*time.Minute, "the new reference to take some of salesagg's tasks", func() error {
		if ts := running(t, s); len(ts) == 3 {
			return fmt.Errorf("salesagg runs %v", ts)
		}
		return nil
	})
	produce("a new reference joined salesagg")
	alive(r2)
	svc.Terminate(t)
	produce("salesagg left")
	alive(r2)
	r2.terminate(t)
}

// TestClassicGroupMovesToStreams: a running classic group and a streams group of the same id
// cannot coexist: while classic member A runs the tasks (at-least-once), streams member B's join
// is refused (GROUP_ID_NOT_FOUND "… is not a streams group", named by /readyz) and B runs
// nothing. Once A stopped and left, B joins, runs all three tasks, and every total is exact
// over HTTP after a second batch, the first batch's included: an application moves from the
// classic protocol to streams by a stop of every classic instance, not one at a time.
func TestClassicGroupMovesToStreams(t *testing.T) {
	rng, appID, input, notif := begin(t, "sgmove", 0x73676d76)
	events := harness.GenEvents(rng, "mv", 30, 1200)
	dir := t.TempDir()
	a := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "a"), Input: input, Notif: notif, CommitMs: 200,
		Flags: []string{"--processing.guarantee", "at_least_once"}})
	a.WaitRestored(t, 90*time.Second)
	harness.Produce(t, newClient(t), recordsOf(input, events[:600])...)
	harness.WaitFor(t, time.Minute, "A's totals of the first batch", func() error { return a.CheckTotals(harness.TotalsOf(events[:600])) })

	b := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "b"), Input: input, Notif: notif, CommitMs: 200,
		Flags: []string{"--processing.guarantee", "at_least_once", "--group.protocol", "streams"}})
	harness.WaitFor(t, time.Minute, "B's /readyz to name the refusal of its join", func() error {
		code, body, _, err := b.Get("/readyz")
		if err != nil {
			return err
		}
		if code == 200 || !strings.Contains(string(body), "is not a streams group") {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})
	if ts := running(t, &harness.Member{Name: "B", Service: b}); len(ts) != 0 {
		t.Fatalf("B runs %v beside a running classic group", ts)
	}
	a.Terminate(t)
	harness.WaitFor(t, 90*time.Second, "B to run all 3 tasks once A left", func() error {
		if ts := running(t, &harness.Member{Name: "B", Service: b}); len(ts) != 3 {
			return fmt.Errorf("B runs %v", ts)
		}
		return nil
	})
	harness.Produce(t, newClient(t), recordsOf(input, events[600:])...)
	harness.WaitFor(t, time.Minute, "B's totals of both batches", func() error { return b.CheckTotals(harness.TotalsOf(events)) })
	b.Terminate(t)
}

// TestStreamsUpgradeKeepsEarlierForwards: an earlier salesagg forwarded through
// <app>-PRODUCT_AGGREGATED_SALES-repartition under group.protocol streams; this one forwards
// through Kafka Streams' topic. Events the earlier version forwarded and its group never folded
// (here: five, no committed offsets) stop the start, exit 1 with where they wait and what to do,
// and no instance runs with them missing from its totals. Once the group's offsets of that topic
// reach its end (what a drain leaves; the test commits them), the start goes on, deletes the
// topic's folded records, logs it as safe to delete, and every input event's total is exact.
func TestStreamsUpgradeKeepsEarlierForwards(t *testing.T) {
	rng, appID, input, notif := begin(t, "sgupg", 0x73677570)
	events := harness.GenEvents(rng, "ug", 20, 200)
	earlier := appID + "-" + sales.StoreName + "-repartition"
	createTopic(t, earlier, 3, nil)
	var forwarded []*kgo.Record
	for i, e := range harness.GenEvents(rng, "ugf", 5, 5) {
		r := e.Record(earlier)
		r.Partition = int32(i % 3)
		forwarded = append(forwarded, r)
	}
	harness.Produce(t, newClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner())), forwarded...)
	dir := t.TempDir()
	flags := []string{"--group.protocol", "streams"}
	svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "a"), Input: input, Notif: notif, CommitMs: 200, Flags: flags})
	harness.WaitFor(t, time.Minute, "the start to stop on the earlier version's unfolded forwards", func() error {
		if svc.Alive() {
			return fmt.Errorf("still running")
		}
		return nil
	})
	const want = "holds events past group " // then the group, and where: partition 0 from offset 0, …
	if code := svc.ExitCode(); code != 1 || !strings.Contains(svc.Stderr(), want) || !strings.Contains(svc.Stderr(), earlier) ||
		!strings.Contains(svc.Stderr(), "(partition 0 from offset 0, partition 1 from offset 0, partition 2 from offset 0)") {
		t.Fatalf("exit %d, want 1 with %q naming %s and each partition's first waiting offset; stderr tail:\n%s", code, want, earlier, svc.Tail(5))
	}

	// A drained topic: the group's offsets at its end.
	adm := kadm.NewClient(newClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, earlier)
	if err != nil {
		t.Fatal(err)
	}
	drained := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) {
		drained.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	if err := adm.CommitAllOffsets(ctx, appID, drained); err != nil {
		t.Fatal(err)
	}
	svc = startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "a"), Input: input, Notif: notif, CommitMs: 200, Flags: flags})
	harness.Produce(t, newClient(t), recordsOf(input, events)...)
	harness.WaitFor(t, 2*time.Minute, "every total once the earlier topic is drained", func() error { return svc.CheckTotals(harness.TotalsOf(events)) })
	if !strings.Contains(svc.Stderr(), "The repartition topic of an earlier version is drained") {
		t.Fatalf("no log line naming %s as safe to delete", earlier)
	}
	// Its folded records are gone: a start after the group's offsets of it expired finds none.
	starts, err := adm.ListStartOffsets(ctx, earlier)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if st, _ := starts.Lookup(earlier, o.Partition); st.Offset != o.Offset {
			t.Errorf("%s-%d starts at %d after the drained start, want its end %d", earlier, o.Partition, st.Offset, o.Offset)
		}
	})
	svc.Terminate(t)
}
