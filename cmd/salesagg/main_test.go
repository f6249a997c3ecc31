package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/port"
)

// binary is the salesagg binary built once for these tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "salesagg-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "salesagg")
	// The test build: -tags salesaggtest carries the crash-point hook
	// (crashpoint_testbuild.go), which a release build has not.
	build := exec.Command("go", "build", "-race", "-tags", "salesaggtest", "-o", binary, ".")
	if os.Getenv("SALESAGGTEST_NORACE") != "" {
		build = exec.Command("go", "build", "-tags", "salesaggtest", "-o", binary, ".")
	}
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building salesagg:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := port.Free()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// proc is a salesagg subprocess with its stderr (the JSON logs) captured.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	mu     sync.Mutex
	logs   bytes.Buffer
	http   string
	exited chan struct{}
	err    error
}

// startProc starts salesagg with args and extra environment.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, exited: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.Write(sc.Bytes())
			p.logs.WriteByte('\n')
			p.mu.Unlock()
		}
	}()
	go func() {
		<-copied
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.kill() })
	return p
}

// startService runs "salesagg run" against broker with its state in stateDir.
func startService(t *testing.T, broker, stateDir string, env []string, extra ...string) *proc {
	t.Helper()
	addr := freeAddr(t)
	args := append([]string{"run", "--bootstrap.servers", broker, "--state.dir", stateDir, "--http.addr", addr,
		"--log.format", "json", "--commit.interval.ms", "100"}, extra...)
	p := startProc(t, env, args...)
	p.http = "http://" + addr
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// logLines returns the decoded JSON log lines whose msg contains snippet.
func (p *proc) logLines(snippet string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.output(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if msg, _ := m["msg"].(string); strings.Contains(msg, snippet) {
			out = append(out, m)
		}
	}
	return out
}

// restored returns the records restored and the number of tasks that
// finished restoring, from the "Finished restoring" log lines.
func (p *proc) restored() (int64, int) {
	var n int64
	lines := p.logLines("Finished restoring changelog")
	for _, m := range lines {
		n += int64(m["records"].(float64))
	}
	return n, len(lines)
}

// restoredAll waits until tasks "Finished restoring" lines reached the test
// (they come through the process's log pipe, possibly after /readyz says
// ready) and returns the records they restored.
func (p *proc) restoredAll(tasks int) int64 {
	p.t.Helper()
	waitFor(p.t, 15*time.Second, fmt.Sprintf("%d restore lines", tasks), func() bool { _, n := p.restored(); return n >= tasks })
	n, _ := p.restored()
	return n
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			p.t.Fatalf("salesagg exited with %v after SIGTERM; logs:\n%s", p.err, p.output())
		}
	case <-time.After(45 * time.Second):
		p.t.Fatalf("salesagg did not stop within 45s of SIGTERM")
	}
}

// kill sends SIGKILL and waits.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *proc) get(path string) (int, []byte) {
	resp, err := http.Get(p.http + path)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (p *proc) waitReady() {
	p.t.Helper()
	waitFor(p.t, 60*time.Second, "readiness", func() bool {
		if !p.alive() {
			p.t.Fatalf("salesagg exited: %v; logs:\n%s", p.err, p.output())
		}
		code, _ := p.get("/readyz")
		return code == http.StatusOK
	})
}

// waitTotals waits until GET /v1/products/{p} gives every wanted total.
func (p *proc) waitTotals(want map[string]int64, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var wrong []string
		for product, w := range want {
			code, body := p.get("/v1/products/" + product)
			var got struct{ Total int64 }
			_ = json.Unmarshal(body, &got)
			if code != http.StatusOK || got.Total != w {
				wrong = append(wrong, fmt.Sprintf("%s=%d(http %d, want %d)", product, got.Total, code, w))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if !p.alive() {
			p.t.Fatalf("salesagg exited: %v", p.err)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("totals not reached after %s: %d wrong, e.g. %v", timeout, len(wrong), wrong[:min(5, len(wrong))])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// changelogTotals reads the latest committed total per product from the
// changelog, and the number of records.
func changelogTotals(t *testing.T, broker, topic string) (map[string]int64, int) {
	t.Helper()
	got := map[string]int64{}
	n := 0
	readCommitted(t, broker, topic, func(r *kgo.Record) {
		v, err := sales.DecodeTotal(r.Value)
		if err != nil {
			t.Fatalf("changelog value at %d: %v", r.Offset, err)
		}
		got[string(r.Key)] = v
		n++
	})
	return got, n
}

// notifications reads the committed notification values per product, in order.
func notifications(t *testing.T, broker, topic string) map[string][]int64 {
	t.Helper()
	got := map[string][]int64{}
	readCommitted(t, broker, topic, func(r *kgo.Record) {
		var n sales.Notification
		if err := json.Unmarshal(r.Value, &n); err != nil {
			t.Fatalf("notification %s: %v", r.Value, err)
		}
		got[n.SKU] = append(got[n.SKU], n.Value)
	})
	return got
}

// readCommitted reads a topic's committed records up to its last stable
// offset, in offset order per partition.
func readCommitted(t *testing.T, broker, topic string, each func(*kgo.Record)) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v", topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			each(r)
		})
	}
}
