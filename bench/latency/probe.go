package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/sales"
)

// A probe is one event of value 1 to a product only probes write: its
// product's total after the n-th probe is n, so a total T read anywhere says
// that probes 1..T are in it, and the first read that shows T dates them.

// probeKeys returns perPartition product names for each of the partitions,
// chosen so that murmur2 puts them there: every task is probed.
func probeKeys(prefix string, partitions, perPartition int) []string {
	var keys []string
	have := make([]int, partitions)
	for i := 0; len(keys) < partitions*perPartition && i < 1_000_000; i++ {
		k := prefix + "-probe-" + strconv.Itoa(i)
		p := sales.Partition([]byte(k), int32(partitions))
		if have[p] < perPartition {
			have[p]++
			keys = append(keys, k)
		}
	}
	return keys
}

// probeKey is the bookkeeping of one probe product. Its tracker's mutex
// guards every field.
type probeKey struct {
	produced []time.Time // produced[n-1]: when probe n was handed to the producer
	http     []time.Time // first time an HTTP answer showed probe n (zero: not yet)
	log      []time.Time // first time a read-committed changelog record showed it
	httpMax  int64       // largest total an HTTP answer showed
	logMax   int64       // largest total the changelog showed
	regress  int         // answers with a total below an earlier answer's
}

// tracker holds every probe key's bookkeeping. The prober, the HTTP pollers
// and the changelog reader write to it from their own goroutines.
type tracker struct {
	mu   sync.Mutex
	keys map[string]*probeKey
}

func newTracker(keys []string) *tracker {
	t := &tracker{keys: map[string]*probeKey{}}
	for _, k := range keys {
		t.keys[k] = &probeKey{}
	}
	return t
}

// produced notes that the next probe of key is handed to the producer at
// at, and returns its number.
func (t *tracker) produced(key string, at time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	pk := t.keys[key]
	pk.produced = append(pk.produced, at)
	pk.http = append(pk.http, time.Time{})
	pk.log = append(pk.log, time.Time{})
	return len(pk.produced)
}

// seen notes that a read at at showed total for key, over HTTP (changelog
// false) or in the changelog: every probe up to total not seen before is
// seen now. A total above the probes produced is a fault of the system
// under test; it is counted and the excess ignored.
func (t *tracker) seen(key string, total int64, at time.Time, changelog bool) (excess bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pk := t.keys[key]
	if pk == nil {
		return false
	}
	first, max := pk.http, &pk.httpMax
	if changelog {
		first, max = pk.log, &pk.logMax
	}
	if total < *max {
		pk.regress++
		return false
	}
	if total > int64(len(first)) {
		excess = true
		total = int64(len(first))
	}
	for n := *max; n < total; n++ {
		if first[n].IsZero() {
			first[n] = at
		}
	}
	*max = total
	return excess
}

// latencies returns, for probes produced within [from, to), the latencies
// of those seen over HTTP and in the changelog, and how many of each were
// never seen, plus the total regressions.
func (t *tracker) latencies(from, to time.Time) (httpL, logL []time.Duration, httpUnseen, logUnseen, regress int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, pk := range t.keys {
		regress += pk.regress
		for i, at := range pk.produced {
			if at.Before(from) || !at.Before(to) {
				continue
			}
			if s := pk.http[i]; s.IsZero() {
				httpUnseen++
			} else {
				httpL = append(httpL, s.Sub(at))
			}
			if s := pk.log[i]; s.IsZero() {
				logUnseen++
			} else {
				logL = append(logL, s.Sub(at))
			}
		}
	}
	return
}

// allSeen reports whether every probe produced before to was seen both ways.
func (t *tracker) allSeen(to time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, pk := range t.keys {
		for i, at := range pk.produced {
			if at.Before(to) && (pk.http[i].IsZero() || pk.log[i].IsZero()) {
				return false
			}
		}
	}
	return true
}

// dist is a latency distribution in milliseconds.
type dist struct {
	N      int     `json:"n"`
	Unseen int     `json:"unseen"`
	P50    float64 `json:"p50_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	P999   float64 `json:"p999_ms"`
	Max    float64 `json:"max_ms"`
	Mean   float64 `json:"mean_ms"`
}

// distOf sorts ls and returns its nearest-rank percentiles.
func distOf(ls []time.Duration, unseen int) dist {
	d := dist{N: len(ls), Unseen: unseen}
	if len(ls) == 0 {
		return d
	}
	slices.Sort(ls)
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	rank := func(q float64) float64 {
		i := int(q*float64(len(ls))+0.999999) - 1
		i = min(max(i, 0), len(ls)-1)
		return ms(ls[i])
	}
	var sum time.Duration
	for _, l := range ls {
		sum += l
	}
	d.P50, d.P90, d.P99, d.P999, d.Max = rank(0.50), rank(0.90), rank(0.99), rank(0.999), ms(ls[len(ls)-1])
	d.Mean = ms(sum / time.Duration(len(ls)))
	return d
}

// prober produces a probe every period, round robin over the keys, through
// cl (the same client as the steady input: the probes wait in its batches
// as any event does).
func prober(ctx context.Context, cl *kgo.Client, t *tracker, keys []string, period time.Duration, failed func(error)) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k := keys[i%len(keys)]
		at := time.Now()
		t.produced(k, at)
		// Not ctx: franz-go fails a whole batch whose first record's
		// context is done, the steady input's records in it too.
		cl.TryProduce(context.Background(), &kgo.Record{Key: []byte(k), Value: []byte(`{"product":"` + k + `","value":1}`), Timestamp: at},
			func(_ *kgo.Record, err error) {
				if err != nil {
					failed(err)
				}
			})
	}
}

// httpPoller asks base for key's total every period until ctx ends; an
// answer of 404 is a total of 0. It returns the number of failed asks.
func httpPoller(ctx context.Context, hc *http.Client, base, key string, t *tracker, period time.Duration, excess func()) (fails int) {
	u := base + "/v1/products/" + url.PathEscape(key)
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fails
		case <-tick.C:
		}
		total, err := ask(ctx, hc, u)
		at := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				fails++
			}
			continue
		}
		if t.seen(key, total, at, false) {
			excess()
		}
	}
}

func ask(ctx context.Context, hc *http.Client, u string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, err
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return 0, nil
	case http.StatusOK:
		var v struct {
			Total *int64 `json:"total"`
		}
		if err := json.Unmarshal(body, &v); err != nil || v.Total == nil {
			return 0, fmt.Errorf("GET %s: no total in %q", u, body)
		}
		return *v.Total, nil
	default:
		return 0, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
}

// changelogReader reads the changelog read committed from the offsets
// starts until ctx ends, and notes every probe key's total as seen when its
// record arrives. A value must be an 8-byte big-endian total.
func changelogReader(ctx context.Context, addr, topic string, starts map[int32]int64, t *tracker, excess func()) error {
	offs := map[int32]kgo.Offset{}
	for p, o := range starts {
		offs[p] = kgo.NewOffset().At(o)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offs}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		at := time.Now()
		if ctx.Err() != nil {
			return nil
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return fmt.Errorf("reading %s: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Value) != 8 {
				return
			}
			if t.seen(string(r.Key), int64(binary.BigEndian.Uint64(r.Value)), at, true) {
				excess()
			}
		})
	}
}
