package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/salesagg/salesagg/test/harness"
)

func TestDeadBrokerReportedAtOnce(t *testing.T) {
	// Scenario: `produce` and `state verify` against an address where nothing listens name the broker
	// and "connection refused" and exit 1 within seconds (they used to wait 60 s, then say
	// "context deadline exceeded"); an unknown host is named as such.
	dead := harness.FreeAddr(t)
	root := t.TempDir()
	stateDirWithTask(t, root, "sales-aggregator")
	sample := filepath.Join("..", "..", "sample_events.txt")
	for name, args := range map[string][]string{
		"produce":      {"produce", "--file", sample, "--bootstrap.servers", dead},
		"state verify": {"state", "verify", "--state.dir", root, "--bootstrap.servers", dead},
		"no such host": {"produce", "--file", sample, "--bootstrap.servers", "no-such-host.invalid:9092"},
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			code, _, stderr := runBinary(t, nil, args...)
			took := time.Since(start)
			want := dead + ": unable to dial: dial tcp " + dead + ": connect: connection refused"
			if name == "no such host" {
				want = "no-such-host.invalid:9092: unable to dial: dial tcp: lookup no-such-host.invalid"
			}
			if code != exitError || !strings.Contains(stderr, "no broker of bootstrap.servers answered: "+want) {
				t.Errorf("exit %d (want 1), %s", code, stderr)
			}
			if name == "no such host" && !strings.Contains(stderr, "no such host") {
				t.Errorf("no 'no such host' in %s", stderr)
			}
			if took > 15*time.Second {
				t.Errorf("took %v, want well under the old 60 s", took)
			}
		})
	}
}

func TestProduceNamesAMistypedTopicAndUsesSASL(t *testing.T) {
	// Scenario: against a broker that requires SASL, `produce` with the security keys (read like run's:
	// a password file) sends the sample; a wrong password is an authentication error at once; a
	// mistyped topic fails at once naming it and the topic it is near.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "alice", "right"),
		kfake.SeedTopics(3, "sales-events-v1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	broker := cluster.ListenAddrs()[0]
	pw := filepath.Join(t.TempDir(), "pw")
	produce := func(password string, extra ...string) (int, string, time.Duration) {
		if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		code, stdout, stderr := runBinary(t, []string{"SALESAGG_SECURITY_PROTOCOL=SASL_PLAINTEXT", "SALESAGG_SASL_USERNAME=alice"},
			append([]string{"produce", "--file", filepath.Join("..", "..", "sample_events.txt"), "--bootstrap.servers", broker,
				"--sasl.password.file", pw}, extra...)...)
		return code, stdout + stderr, time.Since(start)
	}
	if code, out, _ := produce("right"); code != 0 || !strings.Contains(out, "sent 100 records to sales-events-v1") {
		t.Fatalf("with the right password: exit %d, %s", code, out)
	}
	code, out, took := produce("wrong")
	if code != exitError || !strings.Contains(out, broker+": ") || !strings.Contains(out, `the SASL authentication of "alice" with PLAIN failed`) || took > 15*time.Second {
		t.Errorf("with a wrong password: exit %d after %v, %s", code, took, out)
	}
	code, out, took = produce("right", "--topic", "sales-event-v1")
	if code != exitError || !strings.Contains(out, "topic sales-event-v1 does not exist at "+broker+": did you mean sales-events-v1?") || took > 15*time.Second {
		t.Errorf("a mistyped topic: exit %d after %v, %s", code, took, out)
	}
}
