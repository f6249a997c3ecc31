//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// referenceScript is bench/kstreams-reference/run.sh.
func referenceScript() string {
	return filepath.Join(repoRoot, "bench", "kstreams-reference", "run.sh")
}

// buildReference builds the Kafka Streams reference if needed (Maven; about
// 10 s the first time), so that no run of it builds while it is timed.
func buildReference(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, referenceScript(), "--build-only")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("building the Kafka Streams reference (%s --build-only): %v\n%s", referenceScript(), err, out.String())
	}
	t.Logf("Kafka Streams reference built (if needed) in %s", time.Since(t0).Round(time.Millisecond))
}

// reference is one run of the Kafka Streams reference.
type reference struct{ *harness.Proc }

var referenceSeq int

// startReference runs the reference at-least-once, leaving the group on
// close (so that the next member gets the partitions at once), committing
// every 200 ms (its record cache then reaches the changelog within that).
func startReference(t *testing.T, appID, stateDir, input, notif string, extra ...string) *reference {
	t.Helper()
	referenceSeq++
	name := fmt.Sprintf("reference-%02d", referenceSeq)
	p := harness.Start(t, harness.Spec{Name: name, Path: referenceScript(), Dir: repoRoot, Args: append([]string{
		"--bootstrap", bootstrap,
		"--application-id", appID,
		"--state-dir", stateDir,
		"--input-topic", input,
		"--notification-topic", notif,
		"--processing-guarantee", "at_least_once",
		"--leave-group-on-close", "true",
		"--commit-interval-ms", "200",
	}, extra...)})
	t.Logf("started %s (pid %d, state dir %s)", name, p.PID, stateDir)
	return &reference{p}
}

// marker returns the stdout lines starting with "REFERENCE "+prefix.
func (r *reference) marker(prefix string) []string {
	var out []string
	for _, l := range r.StdoutLines() {
		if strings.HasPrefix(l, "REFERENCE "+prefix) {
			out = append(out, l)
		}
	}
	return out
}

// waitRunning waits for "REFERENCE STATE RUNNING" and returns the records of
// the "REFERENCE RESTORE TOTAL" line before it.
func (r *reference) waitRunning(t *testing.T, timeout time.Duration) int64 {
	t.Helper()
	harness.WaitFor(t, timeout, r.Name+" to reach RUNNING", func() error {
		if errs := r.marker("ERROR"); len(errs) > 0 {
			t.Fatalf("%s failed: %s", r.Name, errs[0])
		}
		if !r.Alive() {
			t.Fatalf("%s exited (%s)", r.Name, r.DescribeExit())
		}
		if len(r.marker("STATE RUNNING")) == 0 {
			return fmt.Errorf("states so far: %v", r.marker("STATE"))
		}
		return nil
	})
	totals := r.marker("RESTORE TOTAL")
	if len(totals) == 0 {
		t.Fatalf("%s reached RUNNING without a RESTORE TOTAL line", r.Name)
	}
	m := regexp.MustCompile(`records=(\d+)`).FindStringSubmatch(totals[len(totals)-1])
	if m == nil {
		t.Fatalf("%s: cannot read %q", r.Name, totals[len(totals)-1])
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	t.Logf("%s RUNNING: %s", r.Name, totals[len(totals)-1])
	return n
}

// terminate stops the reference with SIGTERM and requires "REFERENCE
// STOPPED clean=true".
func (r *reference) terminate(t *testing.T) {
	t.Helper()
	if _, killed := r.Stop(60 * time.Second); killed {
		t.Fatalf("%s did not stop within 60 s of SIGTERM; killed", r.Name)
	}
	stopped := r.marker("STOPPED")
	if len(stopped) == 0 || !strings.Contains(stopped[0], "clean=true") {
		t.Fatalf("%s stopped (%s) with %v, want \"REFERENCE STOPPED clean=true\"", r.Name, r.DescribeExit(), stopped)
	}
	t.Logf("%s stopped: %s", r.Name, stopped[0])
}

// TestMigrationFromKafkaStreams: the Kafka Streams reference processes batch 1 and stops; salesagg with the same application.id restores its changelog and adds batch 2; then the reference takes over again from salesagg's changelog and adds batch 3; totals exact at each step.
func TestMigrationFromKafkaStreams(t *testing.T) {
	buildReference(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	appID, input, notif := testNames("mig")
	changelog := sales.ChangelogTopic(appID, sales.StoreName)
	// The reference needs its input and notification topics to exist.
	createTopic(t, input, 3, nil)
	createTopic(t, notif, 3, nil)
	batch1 := harness.GenEvents(rng, "mp", 20, 1000)
	batch2 := harness.GenEvents(rng, "mp", 25, 1000) // five products new in batch 2
	batch3 := harness.GenEvents(rng, "mp", 30, 1000) // and five more in batch 3
	cl := newClient(t)
	send := func(evs []harness.Event) { harness.Produce(t, cl, harness.Records(input, evs)...) }
	dir := t.TempDir()

	// Batch 1 through the reference.
	ref := startReference(t, appID, filepath.Join(dir, "reference-1"), input, notif)
	ref.waitRunning(t, 3*time.Minute)
	send(batch1)
	harness.WaitFor(t, 2*time.Minute, "the reference's changelog to hold the batch 1 totals", func() error {
		return checkChangelog(changelog, harness.TotalsOf(batch1))
	})
	ref.terminate(t)

	forwardOK := t.Run("forward", func(t *testing.T) {
		c, err := readTopic(changelog, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		svc := startService(t, harness.ServiceConfig{AppID: appID, StateDir: filepath.Join(dir, "salesagg"), Input: input, Notif: notif})
		sum := svc.WaitRestored(t, 2*time.Minute)
		t.Logf("salesagg took over: %s; restored %d records %v of the reference's changelog (%d records)", sum.TookLine, sum.Total, sum.Partitions, len(c.Records))
		if sum.Total != int64(len(c.Records)) {
			t.Errorf("salesagg restored %d records, want the %d records of the reference's changelog", sum.Total, len(c.Records))
		}
		harness.WaitFor(t, time.Minute, "batch 1 totals over HTTP (restored, not reprocessed)", func() error { return svc.CheckTotals(harness.TotalsOf(batch1)) })
		send(batch2)
		want := harness.TotalsOf(batch1, batch2)
		harness.WaitFor(t, time.Minute, "batch 1+2 totals over HTTP", func() error { return svc.CheckTotals(want) })
		harness.WaitFor(t, 30*time.Second, "batch 1+2 totals in the changelog", func() error { return checkChangelog(changelog, want) })
		svc.Terminate(t)
	})

	t.Run("reverse", func(t *testing.T) {
		if !forwardOK {
			t.Skip("the forward migration failed; the reverse one starts from its result")
		}
		c, err := readTopic(changelog, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ref := startReference(t, appID, filepath.Join(dir, "reference-2"), input, notif)
		restored := ref.waitRunning(t, 3*time.Minute)
		if restored != int64(len(c.Records)) {
			t.Errorf("the reference restored %d records, want the %d records of the changelog", restored, len(c.Records))
		}
		send(batch3)
		want := harness.TotalsOf(batch1, batch2, batch3)
		harness.WaitFor(t, 2*time.Minute, "batch 1+2+3 totals in the reference's changelog", func() error { return checkChangelog(changelog, want) })
		ref.terminate(t)
	})
}
