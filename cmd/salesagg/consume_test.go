package main

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// consumeCmd runs `salesagg consume args...` to its end and returns its
// standard output's lines, its standard error and its exit code.
func consumeCmd(t *testing.T, broker string, args ...string) ([]string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"consume", "--bootstrap.servers", broker}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil && !errors.As(err, new(*exec.ExitError)) {
		t.Fatal(err)
	}
	t.Logf("salesagg consume %s: exit %d in %s", strings.Join(args, " "), cmd.ProcessState.ExitCode(), time.Since(start).Round(time.Millisecond))
	var lines []string
	if s := strings.TrimSuffix(stdout.String(), "\n"); s != "" {
		lines = strings.Split(s, "\n")
	}
	return lines, stderr.String(), cmd.ProcessState.ExitCode()
}

func TestConsumeReadsWhatTheServiceWrote(t *testing.T) {
	// Scenario: the service runs on the dev broker with a dead-letter topic; the sample events
	// and one malformed event are produced. `salesagg consume` then prints each topic kind one
	// record per line: the notifications' JSON as written, the changelog's int64 totals decoded
	// (the latest per product being the sample totals, the salesagg.offsets header decoded),
	// the dead letter with its headers; it exits 0 after --timeout of nothing new or after
	// --max-messages, starts at the end without --from-beginning, and fails on a missing topic.
	work := t.TempDir()
	addr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), addr)
	svc := startService(t, addr, filepath.Join(work, "state"), nil, "--dlq.topic", "sales-dlq")
	svc.WaitReady(t, 60*time.Second)
	produceSample(t, addr)
	cl := harness.NewClient(t, addr)
	harness.Produce(t, cl, &kgo.Record{Topic: "sales-events-v1", Key: []byte("bad"), Value: []byte("not json")})
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	harness.WaitFor(t, 30*time.Second, "the dead letter", func() error {
		c, err := harness.ReadTopic(addr, "sales-dlq", 10*time.Second)
		if err == nil && len(c.Records) != 1 {
			err = fmt.Errorf("%d dead letters", len(c.Records))
		}
		return err
	})

	t.Run("notifications", func(t *testing.T) {
		want, err := harness.ReadNotifications(addr, "notifications-events-v1")
		if err != nil {
			t.Fatal(err)
		}
		lines, stderr, code := consumeCmd(t, addr, "--topic", "notifications-events-v1", "--from-beginning", "--timeout", "2s")
		got := map[string][]int64{}
		for _, l := range lines {
			key, value, _ := strings.Cut(l, "\t")
			var v int64
			if _, err := fmt.Sscanf(value, `{"sku":"`+key+`","value":%d}`, &v); err != nil {
				t.Errorf("line %q: not KEY<TAB>{\"sku\":KEY,\"value\":N}", l)
			}
			got[key] = append(got[key], v)
		}
		if code != 0 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("exit %d, notifications %v, want exit 0 and %v", code, got, want)
		}
		if !strings.Contains(stderr, fmt.Sprintf("Processed a total of %d messages", len(lines))) {
			t.Errorf("stderr %q lacks the count", stderr)
		}
	})

	t.Run("changelog", func(t *testing.T) {
		lines, _, code := consumeCmd(t, addr, "--topic", changelogTopic, "--from-beginning", "--timeout", "2s",
			"--print.partition", "--print.offset", "--print.headers")
		latest := map[string]int64{}
		for _, l := range lines {
			cols := strings.Split(l, "\t")
			if len(cols) != 5 || !strings.HasPrefix(cols[0], "Partition:") || !strings.HasPrefix(cols[1], "Offset:") {
				t.Fatalf("line %q: want Partition:P, Offset:O, headers, key, value", l)
			}
			if want := fmt.Sprintf("Partition:%d", sales.Partition([]byte(cols[3]), 3)); cols[0] != want {
				t.Errorf("line %q: product %s is on partition %s", l, cols[3], want)
			}
			if !strings.HasPrefix(cols[2], sales.OffsetsHeader+":p") || !strings.Contains(cols[2], " topic=") {
				t.Errorf("line %q: headers not the decoded salesagg.offsets (pN@OFFSET ... topic=ID)", l)
			}
			total, err := strconv.ParseInt(cols[4], 10, 64)
			if err != nil {
				t.Errorf("line %q: value not a decoded total", l)
			}
			latest[cols[3]] = total
		}
		if code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
		if err := harness.DiffTotals("the changelog as consume prints it", latest, harness.SampleTotals); err != nil {
			t.Error(err)
		}
	})

	t.Run("dead letters", func(t *testing.T) {
		// --max-messages alone: it must stop by itself after one.
		lines, _, code := consumeCmd(t, addr, "--topic", "sales-dlq", "--from-beginning", "--max-messages", "1")
		if code != 0 || len(lines) != 1 {
			t.Fatalf("exit %d, lines %q: want exit 0 and one line", code, lines)
		}
		cols := strings.Split(lines[0], "\t")
		if len(cols) != 3 || cols[1] != "bad" || cols[2] != "not json" {
			t.Fatalf("line %q: want HEADERS<TAB>bad<TAB>not json", lines[0])
		}
		for _, h := range []string{"salesagg.dlq.topic:sales-events-v1", "salesagg.dlq.partition:", "salesagg.dlq.offset:", "salesagg.dlq.reason:not_json", "salesagg.dlq.error:"} {
			if !strings.Contains(cols[0], h) {
				t.Errorf("headers %q lack %q", cols[0], h)
			}
		}
	})

	t.Run("tombstone in a topic named -changelog", func(t *testing.T) {
		harness.CreateTopic(t, addr, "scratch-changelog", 1, nil)
		harness.Produce(t, cl, &kgo.Record{Topic: "scratch-changelog", Key: []byte("k"), Value: sales.EncodeTotal(-5)},
			&kgo.Record{Topic: "scratch-changelog", Key: []byte("k")})
		lines, _, code := consumeCmd(t, addr, "--topic", "scratch-changelog", "--from-beginning", "--timeout", "2s")
		if want := []string{"k\t-5", "k\t(tombstone)"}; code != 0 || strings.Join(lines, "|") != strings.Join(want, "|") {
			t.Errorf("exit %d, lines %q: want 0 and %q", code, lines, want)
		}
	})

	t.Run("from the end", func(t *testing.T) {
		lines, stderr, code := consumeCmd(t, addr, "--topic", "notifications-events-v1", "--timeout", "2s")
		if code != 0 || len(lines) != 0 || !strings.Contains(stderr, "Processed a total of 0 messages") {
			t.Errorf("exit %d, lines %q, stderr %q: want 0, nothing, 0 messages", code, lines, stderr)
		}
	})

	t.Run("missing topic", func(t *testing.T) {
		_, stderr, code := consumeCmd(t, addr, "--topic", "no-such-topic", "--timeout", "2s")
		if code != 1 || !strings.Contains(stderr, "reading topic no-such-topic at "+addr+": it does not exist") {
			t.Errorf("exit %d, stderr %q: want 1 and that the topic does not exist", code, stderr)
		}
	})

	t.Run("usage", func(t *testing.T) {
		_, stderr, code := consumeCmd(t, addr, "--max-messages", "-1")
		if code != exitUsage || !strings.Contains(stderr, "--topic is required") || !strings.Contains(stderr, "--max-messages = -1") {
			t.Errorf("exit %d, stderr %q: want 2 naming both problems", code, stderr)
		}
	})
}
