package stream_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/httpapi/streamview"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
	th "github.com/salesagg/salesagg/test/harness"
)

// harness is an in-process kfake broker and a state dir for runtimes.
type harness struct {
	t        testing.TB
	cluster  *kfake.Cluster
	addr     string
	stateDir string
	cfg      config.Config
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return harnessOn(t, c, c.ListenAddrs()[0])
}

// harnessOn is a harness on a broker the test started (c may be nil: not
// started yet) at addr.
func harnessOn(t testing.TB, c *kfake.Cluster, addr string) *harness {
	h := &harness{t: t, cluster: c, addr: addr, stateDir: t.TempDir()}
	h.cfg = config.Default()
	h.cfg.BootstrapServers = []string{h.addr}
	h.cfg.StateDir = h.stateDir
	h.cfg.CommitInterval = 100 * time.Millisecond
	// The tests start the runtime on an empty broker, before producing: the
	// input topic is created as asked (a test of a missing input topic sets
	// this back to false).
	h.cfg.TopicsCreateInput = true
	// Loopback only: the advertised address is http.addr's host.
	h.cfg.HTTPAddr = "127.0.0.1:0"
	return h
}

// instanceCfg is the harness config with a state dir of its own, for one of
// several instances of a test.
func (h *harness) instanceCfg(name string) config.Config {
	c := h.cfg
	c.StateDir = filepath.Join(h.stateDir, name)
	return c
}

// client returns a plain client on the broker, closed at the end of the test
// (before the broker: closing the broker first leaves ghost members).
func (h *harness) client(opts ...kgo.Opt) *kgo.Client {
	h.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.addr)}, opts...)...)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(cl.Close)
	return cl
}

// createInput creates the input topic with n partitions.
func (h *harness) createInput(n int32) {
	h.t.Helper()
	adm := kadm.NewClient(h.client())
	if _, err := adm.CreateTopic(context.Background(), n, 1, nil, h.cfg.InputTopic); err != nil {
		h.t.Fatal(err)
	}
}

// produce sends records to the input topic; a record with Partition >= 0
// and manual set goes to that partition, others by murmur2 of the key.
func (h *harness) produce(recs ...*kgo.Record) {
	h.t.Helper()
	cl := h.client(kgo.RecordPartitioner(manualOrKeyPartitioner{}))
	for _, r := range recs {
		if r.Topic == "" {
			r.Topic = h.cfg.InputTopic
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		h.t.Fatal(err)
	}
}

// manualOrKeyPartitioner partitions a record marked with a "manual" header
// by its Partition field, others by murmur2 of the key as the Java client.
type manualOrKeyPartitioner struct{}

func (manualOrKeyPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return manualOrKey{kgo.StickyKeyPartitioner(nil).ForTopic(topic)}
}

type manualOrKey struct{ byKey kgo.TopicPartitioner }

func (m manualOrKey) OnNewBatch() {}

func (m manualOrKey) RequiresConsistency(*kgo.Record) bool { return true }
func (m manualOrKey) Partition(r *kgo.Record, n int) int {
	for _, hd := range r.Headers {
		if hd.Key == "manual" {
			return int(r.Partition)
		}
	}
	return m.byKey.Partition(r, n)
}

func event(key, product string, value int64) *kgo.Record {
	return &kgo.Record{Key: []byte(key), Value: []byte(fmt.Sprintf(`{"product":%q,"value":%d}`, product, value))}
}

func eventTo(partition int32, key, product string, value int64) *kgo.Record {
	r := event(key, product, value)
	r.Partition = partition
	r.Headers = []kgo.RecordHeader{{Key: "manual"}}
	return r
}

// sampleEvents reads the project's sample_events.txt.
func sampleEvents(t *testing.T) []*kgo.Record {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "sample_events.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []*kgo.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		recs = append(recs, &kgo.Record{Key: []byte(k), Value: []byte(v)})
	}
	return recs
}

// sampleTotals are the totals sample_events.txt must give.
var sampleTotals = map[string]int64{
	"product1": 9200, "product2": 8150, "product3": 7350, "product4": 11700, "product5": 6000,
	"product6": 8750, "product7": 9150, "product8": 12150, "product9": 7550, "product10": 3450,
}

// seedAndStop runs an instance over the sample events until their totals
// are served, and stops it cleanly.
func (h *harness) seedAndStop(t *testing.T) {
	t.Helper()
	in := h.start(h.cfg)
	in.waitReady()
	h.produce(sampleEvents(t)...)
	in.waitTotals(sampleTotals)
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
}

// instance is one running Runtime with its HTTP handler and captured logs.
type instance struct {
	h      *harness
	rt     *stream.Runtime
	dir    *state.Dir
	logs   *observer.ObservedLogs
	http   *httptest.Server
	cancel context.CancelFunc
	done   chan error
}

func (h *harness) start(cfg config.Config) *instance {
	h.t.Helper()
	return h.startWith(cfg, stream.Knobs{})
}

func (h *harness) startWith(cfg config.Config, knobs stream.Knobs) *instance {
	h.t.Helper()
	return h.launch(cfg, knobs, nil)
}

// launch starts a runtime on cfg with its HTTP API served by httptest, its
// Info and higher log lines observed (teed into recent when not nil, which
// the status page then shows, as the service wires them).
func (h *harness) launch(cfg config.Config, knobs stream.Knobs, recent *httpapi.RecentLog) *instance {
	h.t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	if os.Getenv("SALESAGGTEST_VERBOSE") != "" {
		log = zap.New(zapcore.NewTee(core, zaptest.NewLogger(h.t, zaptest.Level(zapcore.DebugLevel)).Core()))
	}
	if recent != nil {
		log = log.WithOptions(zap.WrapCore(recent.Tee))
	}
	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		h.t.Fatal(err)
	}
	rt := stream.New(cfg, log, dir, knobs)
	opts := []httpapi.Option{httpapi.WithMetrics(metricsOf(rt))}
	if recent != nil {
		opts = append(opts, httpapi.WithRecentLog(recent))
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{h: h, rt: rt, dir: dir, logs: logs, cancel: cancel, done: make(chan error, 1)}
	in.http = httptest.NewServer(httpapi.Handler(streamview.New(rt), opts...))
	rt.Advertise(in.http.Listener.Addr().String())
	go func() { in.done <- rt.Run(ctx) }()
	h.t.Cleanup(func() {
		in.stop()
		in.dumpIfFailed()
	})
	return in
}

// dumpIfFailed writes the instance's last log lines into the test's output
// when the test failed, so a failure seen only in CI can be read there.
func (in *instance) dumpIfFailed() {
	if !in.h.t.Failed() {
		return
	}
	const keep = 200
	all := in.logs.All()
	lines := all[max(0, len(all)-keep):]
	var b strings.Builder
	for _, e := range lines {
		fmt.Fprintf(&b, "%s %s %s", e.Time.Format("15:04:05.000"), e.Level.CapitalString(), e.Message)
		for _, f := range e.Context {
			if f.Key == "error" || f.Key == "waited" || f.Key == "task" {
				fmt.Fprintf(&b, " %s=%v", f.Key, fieldValue(f))
			}
		}
		b.WriteByte('\n')
	}
	in.h.t.Logf("the last %d of %d log lines of the instance at %s:\n%s", len(lines), len(all), in.http.URL, b.String())
}

// fieldValue is a zap field's value as the log would print it.
func fieldValue(f zapcore.Field) any {
	enc := zapcore.NewMapObjectEncoder()
	f.AddTo(enc)
	return enc.Fields[f.Key]
}

// metricsOf is the registry the service serves at /metrics (cmd/salesagg's
// newRegistry): rt's collector with the Go runtime and process collectors.
func metricsOf(rt *stream.Runtime) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), rt)
	return reg
}

// stop shuts the instance down as SIGTERM does and returns Run's error.
func (in *instance) stop() error {
	if in.cancel == nil {
		return nil
	}
	in.cancel()
	in.cancel = nil
	var err error
	select {
	case err = <-in.done:
	case <-time.After(stream.GracePeriod + 10*time.Second):
		in.h.t.Fatal("runtime did not stop")
	}
	in.http.Close()
	_ = in.dir.Close()
	return err
}

func (in *instance) waitReady() {
	in.h.t.Helper()
	th.WaitFor(in.h.t, 30*time.Second, "readiness", th.Holds(func() bool {
		resp, err := http.Get(in.http.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}))
}

// total reads GET /v1/products/{product}; -1 when unknown.
func (in *instance) total(product string) (int64, int) {
	resp, err := http.Get(in.http.URL + "/v1/products/" + product)
	if err != nil {
		return -1, 0
	}
	defer resp.Body.Close()
	var body struct {
		Total int64 `json:"total"`
	}
	if resp.StatusCode != http.StatusOK {
		return -1, resp.StatusCode
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return body.Total, resp.StatusCode
}

// waitTotals waits until every product's total read over HTTP is as wanted.
func (in *instance) waitTotals(want map[string]int64) {
	in.h.t.Helper()
	var last string
	deadline := time.Now().Add(30 * time.Second)
	for {
		last = ""
		for p, w := range want {
			if got, code := in.total(p); got != w {
				last += fmt.Sprintf(" %s=%d(http %d, want %d)", p, got, code, w)
			}
		}
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			in.h.t.Fatalf("totals not reached:%s", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restored sums the records of the "Finished restoring" lines logged.
func (in *instance) restored() (records int64, lines int) {
	for _, e := range in.logs.FilterMessageSnippet("Finished restoring changelog").All() {
		records += e.ContextMap()["records"].(int64)
		lines++
	}
	return records, lines
}

func (in *instance) waitRestored(tasks int) int64 {
	in.h.t.Helper()
	th.WaitFor(in.h.t, 30*time.Second, "restores to finish", th.Holds(func() bool {
		_, n := in.restored()
		return n >= tasks
	}))
	n, _ := in.restored()
	return n
}

// foldP1AndStop is the first half of a restore test: on a 3-partition
// input, an instance of the harness's config under guarantee folds p1 = 10
// and stops. It returns the instance's config and p1's changelog partition.
func (h *harness) foldP1AndStop(guarantee string) (config.Config, int32) {
	h.t.Helper()
	h.createInput(3)
	h.cfg.ProcessingGuarantee = guarantee
	cfg := h.instanceCfg("a")
	a := h.start(cfg)
	a.waitReady()
	h.produce(event("p1", "p1", 10))
	a.waitTotals(map[string]int64{"p1": 10})
	_, _, partitionOf := h.changelog(cfg)
	var p int32 = -1
	for q := range partitionOf["p1"] {
		p = q
	}
	if p < 0 {
		h.t.Fatal("p1 is in no changelog partition")
	}
	if err := a.stop(); err != nil {
		h.t.Fatal(err)
	}
	return cfg, p
}

// changelog reads the whole changelog and returns the latest total per
// product, the record count, and the partition each product was written to.
func (h *harness) changelog(cfg config.Config) (totals map[string]int64, records int, partitionOf map[string]map[int32]bool) {
	h.t.Helper()
	return h.readCompacted(cfg.ChangelogTopic(), func(v []byte) int64 {
		n, err := sales.DecodeTotal(v)
		if err != nil {
			h.t.Fatalf("changelog value: %v", err)
		}
		return n
	})
}

// notifications reads the notification topic: the latest value per sku and
// every value seen.
func (h *harness) notifications(cfg config.Config) (latest map[string]int64, count int) {
	h.t.Helper()
	latest, count, _ = h.readCompacted(cfg.NotificationTopic, func(v []byte) int64 {
		var n sales.Notification
		if err := json.Unmarshal(v, &n); err != nil {
			h.t.Fatalf("notification %s: %v", v, err)
		}
		if n.Value < cfg.NotificationThreshold {
			h.t.Fatalf("notification below the threshold: %s", v)
		}
		return n.Value
	})
	return latest, count
}

func (h *harness) readCompacted(topic string, decode func([]byte) int64) (map[string]int64, int, map[string]map[int32]bool) {
	h.t.Helper()
	latest := map[string]int64{}
	parts := map[string]map[int32]bool{}
	n := 0
	h.readCommitted(topic, func(r *kgo.Record) {
		n++
		latest[string(r.Key)] = decode(r.Value)
		if parts[string(r.Key)] == nil {
			parts[string(r.Key)] = map[int32]bool{}
		}
		parts[string(r.Key)][r.Partition] = true
	})
	return latest, n, parts
}

// readCommitted hands each committed record of topic to each, in offset
// order per partition, up to the last stable offset.
func (h *harness) readCommitted(topic string, each func(*kgo.Record)) {
	h.t.Helper()
	adm := kadm.NewClient(h.client())
	// Read committed records only, up to the last stable offset; markers
	// are kept so the position passes a trailing commit marker.
	ends, err := adm.ListCommittedOffsets(context.Background(), topic)
	if err != nil {
		h.t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return
	}
	cl := h.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			h.t.Fatalf("reading %s: %v (still waiting for %v)", topic, ctx.Err(), want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
			if !r.Attrs.IsControl() {
				each(r)
			}
		})
	}
}

func equalTotals(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d products, want %d: %v", what, len(got), len(want), got)
	}
	for p, w := range want {
		if got[p] != w {
			t.Fatalf("%s: %s = %d, want %d", what, p, got[p], w)
		}
	}
}

// eachGuarantee runs fn as a subtest for each processing guarantee, on a
// harness of its own with the input topic created (3 partitions) and the
// guarantee set in h.cfg.
func eachGuarantee(t *testing.T, fn func(t *testing.T, h *harness)) {
	t.Helper()
	for _, g := range []string{config.ExactlyOnceV2, config.AtLeastOnce} {
		t.Run(g, func(t *testing.T) {
			h := newHarness(t)
			h.createInput(3)
			h.cfg.ProcessingGuarantee = g
			fn(t, h)
		})
	}
}

// startPairWithStandbys creates the input topic (3 partitions) and starts
// instances A and B with one standby replica each; A is ready before B
// starts.
func (h *harness) startPairWithStandbys() (cfgA, cfgB config.Config, a, b *instance) {
	h.t.Helper()
	h.createInput(3)
	h.cfg.NumStandbyReplicas = 1
	cfgA, cfgB = h.instanceCfg("a"), h.instanceCfg("b")
	a = h.start(cfgA)
	a.waitReady()
	b = h.start(cfgB)
	return cfgA, cfgB, a, b
}

// waitSpread waits until the three tasks run on A and B, each at least one.
func waitSpread(t testing.TB, a, b *instance) {
	t.Helper()
	th.WaitFor(t, 30*time.Second, "the tasks to spread over A and B", th.Holds(func() bool {
		na, nb := len(a.runningTasks()), len(b.runningTasks())
		return na >= 1 && nb >= 1 && na+nb == 3
	}))
}
