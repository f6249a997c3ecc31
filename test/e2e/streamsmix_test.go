//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// TestMixedStreamsGroupIsRefused: the Kafka Streams reference (group.protocol=streams) runs
// the application's three tasks in a streams group; a salesagg instance with group.protocol
// streams and the same application.id asks to join it. Kafka Streams describes the same one
// subtopology, but its repartition topic is <app>-EMPTY_KEY_BY_PRODUCT-repartition where
// salesagg's is <app>-PRODUCT_AGGREGATED_SALES-repartition, and the group coordinator refuses a
// join whose topology differs from the group's (INVALID_REQUEST "Topology updates are not
// supported yet"; docs/streams-protocol.md §9). salesagg runs no task, /readyz names the
// refusal, and the reference goes on alone: every event of both batches is in its changelog's
// totals.
func TestMixedStreamsGroupIsRefused(t *testing.T) {
	buildReference(t)
	rng, appID, input, notif := begin(t, "sgmix", 0x73676d78)
	createTopic(t, notif, 3, nil)
	events := harness.GenEvents(rng, "mx", 30, 1200)
	first := events[:600]
	changelog := sales.ChangelogTopic(appID, sales.StoreName)
	holds := func(want map[string]int64) func() error {
		return func() error {
			got, _, err := harness.ReadTotals(bootstrap, changelog)
			if err != nil {
				return err
			}
			return harness.DiffTotals(changelog, got, want)
		}
	}
	dir := t.TempDir()
	ref := startReference(t, appID, filepath.Join(dir, "reference"), input, notif, "--prop", "group.protocol=streams")
	ref.waitRunning(t, 3*time.Minute)
	harness.Produce(t, newClient(t), recordsOf(input, first)...)
	harness.WaitFor(t, 2*time.Minute, "the reference's changelog to hold the first batch's totals", holds(harness.TotalsOf(first)))

	svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "salesagg"), Input: input, Notif: notif, CommitMs: 200,
		Flags: []string{"--processing.guarantee", "at_least_once", "--group.protocol", "streams"}})
	const refusal = "Topology updates are not supported yet"
	harness.WaitFor(t, time.Minute, "salesagg's /readyz to name the coordinator's refusal", func() error {
		code, body, _, err := svc.Get("/readyz")
		if err != nil {
			return err
		}
		if code == 200 || !strings.Contains(string(body), refusal) {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})
	harness.Produce(t, newClient(t), recordsOf(input, events[600:])...)
	harness.WaitFor(t, 2*time.Minute, "the reference's changelog to hold every event's totals", holds(harness.TotalsOf(events)))
	if ts := running(t, &harness.Member{Name: "salesagg", Service: svc}); len(ts) != 0 {
		t.Fatalf("salesagg runs %v in a group whose coordinator refused it", ts)
	}
	ref.terminate(t)
	svc.Terminate(t)
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
