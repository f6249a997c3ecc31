package main

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/test/harness"
)

func TestStateExportOfflineAndOverHTTP(t *testing.T) {
	// Scenario: after the sample events, `state export --from URL` exports every product's total
	// from the running service as CSV into a file (the task column empty), and the offline export
	// (refused while the service holds the state dir) writes JSONL to stdout with each product's
	// task; --task keeps one task's products. Restarted with HTTPS, client certificates and
	// tokens required, the service refuses an export without credentials, and --ca-file,
	// --cert-file, --key-file and --token-file get it. Every export holds exactly the sample's
	// totals. A bad --format is a usage error and leaves no file.
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	stateDir := filepath.Join(work, "state")
	svc := startService(t, brokerAddr, stateDir, nil)
	svc.WaitReady(t, 60*time.Second)
	produceSample(t, brokerAddr)
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)

	out := filepath.Join(work, "totals.csv")
	code, _, stderr := runBinary(t, nil, "state", "export", "--from", "http://"+svc.Addr, "--format", "csv", "--output", out)
	if code != 0 || !strings.Contains(stderr, "10 products written to "+out) {
		t.Fatalf("state export --from: exit %d\n%s", code, stderr)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 || strings.Join(rows[0], ",") != "task,product,total" {
		t.Fatalf("CSV header: %v", rows)
	}
	got := map[string]int64{}
	for _, r := range rows[1:] {
		v, err := strconv.ParseInt(r[2], 10, 64)
		if err != nil || r[0] != "" {
			t.Fatalf("CSV row %v: %v", r, err)
		}
		got[r[1]] = v
	}
	if !maps.Equal(got, harness.SampleTotals) {
		t.Fatalf("exported over HTTP %v, want %v", got, harness.SampleTotals)
	}

	code, _, stderr = runBinary(t, nil, "state", "export", "--state.dir", stateDir)
	if code != exitError || !strings.Contains(stderr, "refusing while the service runs") {
		t.Fatalf("offline export while the service runs: exit %d\n%s", code, stderr)
	}
	svc.Terminate(t)

	offline := func(args ...string) map[string]int64 {
		t.Helper()
		code, stdout, stderr := runBinary(t, nil, append([]string{"state", "export", "--state.dir", stateDir}, args...)...)
		if code != 0 {
			t.Fatalf("offline export %v: exit %d\n%s", args, code, stderr)
		}
		got := map[string]int64{}
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			var r exportRow
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("JSONL line %q: %v", line, err)
			}
			if want := state.TaskName(sales.Partition([]byte(r.Product), 3)); r.Task != want {
				t.Fatalf("%s exported under task %s, its task is %s", r.Product, r.Task, want)
			}
			got[r.Product] = r.Total
		}
		return got
	}
	if got := offline(); !maps.Equal(got, harness.SampleTotals) {
		t.Fatalf("exported offline %v, want %v", got, harness.SampleTotals)
	}
	want1 := map[string]int64{}
	for p, v := range harness.SampleTotals {
		if sales.Partition([]byte(p), 3) == 1 {
			want1[p] = v
		}
	}
	if got := offline("--task", "0_1"); len(want1) == 0 || !maps.Equal(got, want1) {
		t.Fatalf("exported task 0_1 %v, want %v", got, want1)
	}

	// Over HTTPS with client certificates and tokens required: export
	// --from authenticates with --ca-file, --cert-file, --key-file and
	// --token-file.
	pki := harness.NewPKI(t)
	srvCert, srvKey, _ := pki.Issue(t, "server")
	cliCert, cliKey, _ := pki.Issue(t, "client")
	tokens := filepath.Join(work, "tokens")
	if err := os.WriteFile(tokens, []byte("export-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secure := startService(t, brokerAddr, stateDir, nil, "--http.tls.cert.file", srvCert, "--http.tls.key.file", srvKey,
		"--http.tls.client.ca.file", pki.CAFile, "--http.auth.tokens.file", tokens)
	pool := x509.NewCertPool()
	pool.AddCert(pki.CA)
	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	harness.WaitFor(t, 60*time.Second, "the service over HTTPS to be ready", func() error {
		if err := secure.Exited(); err != nil {
			return err
		}
		resp, err := hc.Get("https://" + secure.Addr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	secured := filepath.Join(work, "secured.jsonl")
	from := "https://" + secure.Addr
	code, _, stderr = runBinary(t, nil, "state", "export", "--from", from, "--output", secured)
	if code != exitError || (!strings.Contains(stderr, "certificate") && !strings.Contains(stderr, "tls")) {
		t.Fatalf("export --from %s without credentials: exit %d, want %d on the certificate\n%s", from, code, exitError, stderr)
	}
	code, _, stderr = runBinary(t, nil, "state", "export", "--from", from, "--ca-file", pki.CAFile, "--cert-file", cliCert, "--key-file", cliKey,
		"--token-file", tokens, "--output", secured)
	if code != 0 {
		t.Fatalf("export --from %s with credentials: exit %d\n%s", from, code, stderr)
	}
	b, err := os.ReadFile(secured)
	if err != nil {
		t.Fatal(err)
	}
	got = map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r exportRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("JSONL line %q: %v", line, err)
		}
		got[r.Product] = r.Total
	}
	if !maps.Equal(got, harness.SampleTotals) {
		t.Fatalf("exported over HTTPS %v, want %v", got, harness.SampleTotals)
	}
	secure.Terminate(t)

	bad := filepath.Join(work, "bad.out")
	code, _, stderr = runBinary(t, nil, "state", "export", "--state.dir", stateDir, "--format", "xml", "--output", bad)
	if code != exitUsage || !strings.Contains(stderr, `--format "xml": want jsonl or csv`) {
		t.Fatalf("--format xml: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Fatalf("a failed export left %s (%v)", bad, err)
	}
}

func TestStateExportWindows(t *testing.T) {
	// Scenario: a service with 1h windows folds the sample events; `state export --from URL
	// --window 1h` writes every window the running instance holds (a size it does not keep
	// fails, naming its sizes); stopped, `state export --window 1h` writes the same windows
	// offline (JSONL, then CSV with its own header), whose totals add up to each product's total;
	// offline, a size that is not one of windows.sizes is a usage error.
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	stateDir := filepath.Join(work, "state")
	svc := startService(t, brokerAddr, stateDir, nil, "--windows.sizes", "1h")
	svc.WaitReady(t, 60*time.Second)
	produceSample(t, brokerAddr)
	svc.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	code, online, stderr := runBinary(t, nil, "state", "export", "--from", "http://"+svc.Addr, "--window", "1h")
	if code != 0 {
		t.Fatalf("export --from --window 1h: exit %d\n%s", code, stderr)
	}
	code, _, stderr = runBinary(t, nil, "state", "export", "--from", "http://"+svc.Addr, "--window", "24h")
	if code != 1 || !strings.Contains(stderr, "windows.sizes: 1h") {
		t.Fatalf("export --from --window 24h: exit %d, want 1 naming the sizes kept\n%s", code, stderr)
	}
	svc.Terminate(t)

	code, stdout, stderr := runBinary(t, nil, "state", "export", "--state.dir", stateDir, "--windows.sizes", "1h", "--window", "1h")
	if code != 0 {
		t.Fatalf("export --window 1h: exit %d\n%s", code, stderr)
	}
	// The same windows both ways (the online rows name no task), by start and then product.
	type windowRow struct {
		Product      string
		Start, Total int64
	}
	byStart := func(a, b windowRow) int {
		return cmp.Or(cmp.Compare(a.Start, b.Start), strings.Compare(a.Product, b.Product))
	}
	rows := func(out string) []windowRow {
		var rs []windowRow
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var r windowRow
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("window row %q: %v", line, err)
			}
			rs = append(rs, r)
		}
		return rs
	}
	// Offline rows come task by task; the online ones in order already.
	on, off := rows(online), rows(stdout)
	slices.SortFunc(off, byStart)
	if !slices.Equal(on, off) {
		t.Fatalf("export --from --window 1h wrote %v, offline (sorted) %v", on, off)
	}
	sums := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var r struct {
			Task, Product, Window string
			Start, End, Total     int64
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Window != "1h" || r.End-r.Start != 3_600_000 || r.Start%3_600_000 != 0 || !state.IsTaskName(r.Task) {
			t.Fatalf("window row %q: %+v, %v", line, r, err)
		}
		sums[r.Product] += r.Total
	}
	if !maps.Equal(sums, harness.SampleTotals) {
		t.Fatalf("the windows add up to %v, want the totals %v", sums, harness.SampleTotals)
	}
	code, stdout, _ = runBinary(t, nil, "state", "export", "--state.dir", stateDir, "--windows.sizes", "1h", "--window", "1h", "--format", "csv")
	if first, _, _ := strings.Cut(stdout, "\n"); code != 0 || first != "task,product,window,start,end,total" {
		t.Fatalf("export --window --format csv: exit %d, header %q", code, first)
	}
	code, _, stderr = runBinary(t, nil, "state", "export", "--state.dir", stateDir, "--windows.sizes", "1h", "--window", "24h")
	if code != exitUsage || !strings.Contains(stderr, "want one of windows.sizes (1h)") {
		t.Fatalf("export --window 24h: exit %d\n%s", code, stderr)
	}
}
