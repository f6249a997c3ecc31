package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/salesagg/salesagg/test/harness"
)

// holdPort listens on a free loopback port for the rest of the test and
// returns its address. The kernel completes connections to it (they wait
// in the backlog), so to a TCP probe it looks like a broker.
func holdPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// startDevScript runs scripts/dev.sh with the test binary, BUILD=0 and env.
func startDevScript(t *testing.T, env ...string) *harness.Proc {
	t.Helper()
	return harness.Start(t, harness.Spec{Name: "dev.sh", Path: filepath.Join("..", "..", "scripts", "dev.sh"),
		Env: append([]string{"BIN=" + binary, "BUILD=0", "SALESAGG_LOG_FORMAT=json"}, env...)})
}

// output is everything p wrote, both streams.
func output(p *harness.Proc) string {
	return strings.Join(p.StdoutLines(), "\n") + "\n" + strings.Join(p.StderrLines(), "\n")
}

// exitsWithin waits until p has exited, at most timeout.
func exitsWithin(t *testing.T, p *harness.Proc, timeout time.Duration) {
	t.Helper()
	harness.WaitFor(t, timeout, p.Name+" to exit", func() error {
		if p.Alive() {
			return errors.New("still running")
		}
		return nil
	})
}

func TestBrokerFailsAtOnceOnBusyPort(t *testing.T) {
	// Scenario: another process (this test) listens on the port `salesagg broker --listen` is
	// given: the broker exits 1 at once, naming the address, "address already in use" and the
	// holder's pid and command line (from /proc).
	addr := holdPort(t)
	start := time.Now()
	b := harness.Start(t, harness.Spec{Name: "dev-broker", Path: binary, Args: []string{"broker", "--data-dir", "", "--listen", addr, "--log.format", "json"}})
	exitsWithin(t, b, 15*time.Second)
	if code := b.ExitCode(); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	stderr := b.Stderr()
	self, _ := os.Executable()
	for _, want := range []string{"listening on " + addr, "address already in use", fmt.Sprintf("held by pid %d (%s", os.Getpid(), self)} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if len(b.StdoutLines()) != 0 {
		t.Errorf("stdout %q, want nothing (its \"broker listening on\" line means bound)", b.StdoutLines())
	}
	t.Logf("failed in %s: %s", time.Since(start).Round(time.Millisecond), stderr)
}

func TestDevScriptFailsOnBusyPortWithoutStartingTheService(t *testing.T) {
	// Scenario: `make run` while the dev broker's address is taken (another `make run`, a Kafka
	// of one's own): the script exits non-zero at once, the broker's error names the address and
	// the holder, and no service is started (before, it logged "Dev broker ready" and joined
	// whatever held the port).
	addr := holdPort(t)
	work := t.TempDir()
	p := startDevScript(t, "BROKER_LISTEN="+addr, "HTTP="+harness.FreeAddr(t), "DATA="+work)
	exitsWithin(t, p, 30*time.Second)
	if code := p.ExitCode(); code == 0 {
		t.Errorf("dev.sh exited 0, want non-zero")
	}
	out := output(p)
	for _, want := range []string{"listening on " + addr + ": address already in use", fmt.Sprintf("held by pid %d", os.Getpid()),
		"The dev broker could not start (its error is above); the service is not started"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, never := range []string{"Dev broker ready", "Starting salesagg"} {
		if strings.Contains(out, never) {
			t.Errorf("output has %q: the service was started:\n%s", never, out)
		}
	}
}

func TestDevScriptWithBrokerNothingListening(t *testing.T) {
	// Scenario: BROKER names an address where nothing answers (a typo): the script fails within
	// seconds naming it, without starting a broker or the service.
	addr := harness.FreeAddr(t)
	p := startDevScript(t, "BROKER="+addr, "HTTP="+harness.FreeAddr(t), "DATA="+t.TempDir())
	exitsWithin(t, p, 30*time.Second)
	if code := p.ExitCode(); code == 0 {
		t.Errorf("dev.sh exited 0, want non-zero")
	}
	out := output(p)
	if !strings.Contains(out, "Nothing answers at BROKER; the service is not started") || !strings.Contains(out, addr) {
		t.Errorf("output does not say that nothing answers at %s:\n%s", addr, out)
	}
	for _, never := range []string{"Embedded dev broker started", "Starting salesagg"} {
		if strings.Contains(out, never) {
			t.Errorf("output has %q:\n%s", never, out)
		}
	}
}

func TestDevScriptUsesTheBrokerGivenOnPurpose(t *testing.T) {
	// Scenario: `BROKER=host:port make run` with a broker already running: the script starts no
	// dev broker, runs the service on that one (the sample totals over HTTP), and on SIGTERM
	// stops the service and leaves the broker running.
	work := t.TempDir()
	addr, httpAddr := harness.FreeAddr(t), harness.FreeAddr(t)
	broker := startBroker(t, filepath.Join(work, "broker"), addr)
	p := startDevScript(t, "BROKER="+addr, "HTTP="+httpAddr, "DATA="+work)
	svc := harness.NewAPI(httpAddr)
	harness.WaitFor(t, 60*time.Second, "the service to be ready", func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		return svc.Ready()
	})
	produceSample(t, addr)
	harness.WaitFor(t, 30*time.Second, "the sample totals over HTTP", func() error { return svc.CheckTotals(harness.SampleTotals) })

	if err := p.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	exitsWithin(t, p, 60*time.Second)
	if code := p.ExitCode(); code != 0 {
		t.Errorf("dev.sh exited %d after SIGINT, want 0", code)
	}
	out := output(p)
	if !strings.Contains(out, "Using the broker at BROKER (no dev broker is started)") {
		t.Errorf("no line saying the given broker is used:\n%s", out)
	}
	for _, never := range []string{"Embedded dev broker started", "Stopping the dev broker", "Dev broker ready"} {
		if strings.Contains(out, never) {
			t.Errorf("output has %q: the script started or stopped a broker:\n%s", never, out)
		}
	}
	if !strings.Contains(out, "Left the group") {
		t.Errorf("the service did not leave the group on the way out:\n%s", out)
	}
	if !broker.Alive() {
		t.Errorf("the broker given in BROKER is gone: %s", broker.DescribeExit())
	}
}

func TestDevScriptExitsZeroOnCtrlC(t *testing.T) {
	// Scenario: scripts/dev.sh with the README's overrides (BIN, BUILD=0, BROKER_LISTEN, HTTP, DATA) runs
	// the service on them, and Ctrl-C (SIGINT to the whole foreground process group) ends the
	// script with exit code 0. What `make run` logs and does on the way (the service stops
	// first, then the broker; the last cycle committed) is TestReadmeWalkthrough's, which runs it
	// as the README's walkthrough says.
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	work := t.TempDir()
	brokerAddr, httpAddr := harness.FreeAddr(t), harness.FreeAddr(t)
	// A job, as a shell started from a terminal runs it: Ctrl-C is SIGINT to its group.
	p := harness.Start(t, harness.Spec{Name: "dev.sh", Path: filepath.Join("..", "..", "scripts", "dev.sh"), Job: true,
		Env: []string{"BIN=" + binary, "BUILD=0", "BROKER_LISTEN=" + brokerAddr, "HTTP=" + httpAddr, "DATA=" + work}})
	t.Cleanup(func() {
		// The script's children run in process groups of their own (job
		// control): kill them too if the script did not stop them.
		for _, pid := range processesWith(work) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	svc := harness.NewAPI(httpAddr)
	harness.WaitFor(t, 60*time.Second, "the service to be ready", func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		return svc.Ready()
	})
	if got := len(processesWith(work)); got < 2 {
		t.Errorf("%d processes hold %s, want the broker and the service", got, work)
	}

	// Ctrl-C.
	if err := p.SignalGroup(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !p.WaitExit(60 * time.Second) {
		t.Fatal("dev.sh did not exit within 60 s of SIGINT")
	}
	if p.ExitCode() != 0 {
		t.Errorf("dev.sh: %s after SIGINT, want exit code 0", p.DescribeExit())
	}
	if left := processesWith(work); len(left) > 0 {
		t.Errorf("processes %v still hold %s after dev.sh exited", left, work)
	}
}

// processesWith returns the pids of the processes whose command line
// holds s.
func processesWith(s string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(b), s) {
			out = append(out, pid)
		}
	}
	return out
}

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
