package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/bench/kit"
	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/sales"
)

// dataset is the generated input: per-product expected totals and the end
// offsets of the input topic after producing.
type dataset struct {
	topic    string
	products int
	events   int
	// expected[n] is the expected total of product "p<n>"; every product
	// occurs at least once, so every total is positive.
	expected  []int64
	ends      map[int32]int64
	produceMs int64
	bytes     int64
}

// slug names the data set in topic, group and file names: "p<products>".
func (ds *dataset) slug() string { return datasetSlug(ds.products) }

func datasetSlug(products int) string { return "p" + strconv.Itoa(products) }

// distinct counts the products with at least one event.
func (ds *dataset) distinct() int {
	n := 0
	for _, t := range ds.expected {
		if t != 0 {
			n++
		}
	}
	return n
}

// eventSource draws a data set's events. The first products events go
// through a random permutation of all the products (so that every product
// occurs once there are at least as many events), the rest pick a product
// uniformly; every value is uniform in 1..1000. One PCG generator seeded with
// seed draws everything, in event order: same seed and counts, same data.
type eventSource struct {
	rng      *rand.Rand
	products int
	i        int
	// A Fisher–Yates shuffle done one step per event: perm[i] is final once
	// drawn. int32: 40 MB for 10 million products, dropped once used up.
	perm []int32
}

func newEventSource(seed uint64, products int) *eventSource {
	perm := make([]int32, products)
	for i := range perm {
		perm[i] = int32(i)
	}
	return &eventSource{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), products: products, perm: perm}
}

// next returns the next event's product number and value.
func (s *eventSource) next() (product int, value int64) {
	if s.i < s.products {
		j := s.i + s.rng.IntN(s.products-s.i)
		s.perm[s.i], s.perm[j] = s.perm[j], s.perm[s.i]
		product = int(s.perm[s.i])
		if s.i == s.products-1 {
			s.perm = nil
		}
	} else {
		product = s.rng.IntN(s.products)
	}
	s.i++
	return product, int64(1 + s.rng.IntN(1000))
}

// generate produces events events over products products (eventSource)
// into topic (created with the given partitions) with franz-go's default
// partitioner (murmur2 on the key, as the Java client) and returns the
// expected totals.
func generate(ctx context.Context, addr, topic string, events, products int, seed uint64, partitions int, span time.Duration, adm *kadm.Client) (*dataset, error) {
	if events < products {
		return nil, fmt.Errorf("%d events cannot cover %d products", events, products)
	}
	if err := kit.CreateTopic(ctx, adm, topic, partitions); err != nil {
		return nil, err
	}
	cl, err := kit.NewBulkProducer(addr, topic)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	ds := &dataset{topic: topic, products: products, events: events, expected: make([]int64, products)}
	src := newEventSource(seed, products)
	t0 := time.Now()
	first, step := t0.Add(-span), span/time.Duration(events)
	err = kit.ProduceAll(ctx, cl, events, func(i int) *kgo.Record {
		n, value := src.next()
		ds.expected[n] += value
		// key and value in one allocation: `p<n>` then `{"product":"p<n>","value":V}`
		buf := make([]byte, 0, 64)
		buf = strconv.AppendInt(append(buf, 'p'), int64(n), 10)
		k := len(buf)
		buf = append(buf, `{"product":"`...)
		buf = append(buf, buf[:k]...)
		buf = append(buf, `","value":`...)
		buf = strconv.AppendInt(buf, value, 10)
		buf = append(buf, '}')
		ds.bytes += int64(len(buf))
		r := &kgo.Record{Key: buf[:k:k], Value: buf[k:]}
		if span > 0 {
			r.Timestamp = first.Add(time.Duration(i) * step)
		}
		return r
	}, logf, "the events to "+topic, 0)
	if err != nil {
		return nil, err
	}
	ds.produceMs = time.Since(t0).Milliseconds()

	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of %s: %w", topic, err)
	}
	ds.ends = map[int32]int64{}
	var sum int64
	ends.Each(func(lo kadm.ListedOffset) {
		ds.ends[lo.Partition] = lo.Offset
		sum += lo.Offset
	})
	if len(ds.ends) != partitions || sum != int64(events) {
		return nil, fmt.Errorf("input topic %s holds %d records in %d partitions, want %d in %d", topic, sum, len(ds.ends), events, partitions)
	}
	return ds, nil
}

// productIndex returns n for a key "p<n>" in canonical form (decimal, no
// sign, no leading zero) with n < products.
func productIndex(key []byte, products int) (int, bool) {
	if len(key) < 2 || len(key) > 11 || key[0] != 'p' || (key[1] == '0' && len(key) > 2) {
		return 0, false
	}
	n := 0
	for _, c := range key[1:] {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n < products
}

// verifyResult is the comparison of a changelog with the expected totals.
type verifyResult struct {
	Changelog        string   `json:"changelog_topic"`
	ChangelogRecords int64    `json:"changelog_records"`
	Tombstones       int64    `json:"tombstones"`
	BadValues        int64    `json:"bad_values"`
	KeysExpected     int      `json:"keys_expected"`
	KeysFound        int      `json:"keys_found"`
	KeysChecked      int      `json:"keys_checked"`
	Mismatches       int      `json:"mismatches"`
	Missing          int      `json:"missing"`
	Extra            int      `json:"extra"`
	WrongPartition   int      `json:"keys_in_wrong_partition"`
	MultiPartition   int      `json:"keys_in_several_partitions"`
	Examples         []string `json:"examples,omitempty"`
	ReadMs           int64    `json:"read_ms"`
	OK               bool     `json:"ok"`
	Error            string   `json:"error,omitempty"`
}

// verifyChangelog reads the whole changelog topic (latest value per key) and
// compares every key with the expected totals (expected[n]: key "p<n>"). A
// key must live in partition murmur2(key) mod N, the partition the input
// producer put it in.
func verifyChangelog(ctx context.Context, addr, topic string, expected []int64, partitions int) verifyResult {
	vr := verifyResult{Changelog: topic, KeysExpected: len(expected)}
	t0 := time.Now()
	fail := func(err error) verifyResult {
		vr.Error = err.Error()
		vr.ReadMs = time.Since(t0).Milliseconds()
		return vr
	}
	cl, adm, err := kit.NewAdmin(addr)
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fail(fmt.Errorf("listing start offsets of %s: %w", topic, err))
	}
	ends, err := changelog.Ends(ctx, adm, topic)
	if err != nil {
		return fail(err)
	}
	if len(ends) != partitions {
		return fail(fmt.Errorf("changelog %s has %d partitions, want %d", topic, len(ends), partitions))
	}
	// Every partition read from its log start to its last stable offset
	// through the service's own changelog reader.
	st := newChangelogState(len(expected))
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for p, end := range ends {
		s, _ := starts.Lookup(topic, p)
		err := changelog.Scan(rctx, []kgo.Opt{kgo.SeedBrokers(addr)}, topic, p, s.Offset, end, func(r *kgo.Record) {
			st.add(&vr, r.Key, r.Value, r.Partition)
		})
		if err != nil {
			return fail(err)
		}
	}
	st.compare(&vr, expected, partitions)
	vr.ReadMs = time.Since(t0).Milliseconds()
	vr.OK = vr.Error == "" && vr.Mismatches == 0 && vr.Missing == 0 && vr.Extra == 0 &&
		vr.BadValues == 0 && vr.WrongPartition == 0 && vr.MultiPartition == 0
	return vr
}

const (
	keyPresent = 1 << iota // the latest record of the key is a value
	keyMulti               // records of the key in several partitions
)

// changelogState is the latest value of every key read from a changelog.
// Products of the data set ("p<n>", n < products) are kept in slices indexed
// by n (13 bytes each); only other keys go to a map.
type changelogState struct {
	got    []int64 // latest value
	part   []int32 // partition+1 of the latest record; 0: none yet
	flags  []uint8 // keyPresent, keyMulti
	others map[string]*otherKey
}

// otherKey is the state of a key that is no product of the data set.
type otherKey struct {
	total int64
	part  int32
	flags uint8
}

func newChangelogState(products int) *changelogState {
	return &changelogState{got: make([]int64, products), part: make([]int32, products), flags: make([]uint8, products),
		others: map[string]*otherKey{}}
}

// add applies one changelog record (value nil: a tombstone; a value must be
// an 8-byte big-endian int64) and counts it in vr.
func (st *changelogState) add(vr *verifyResult, key, value []byte, partition int32) {
	vr.ChangelogRecords++
	var (
		total *int64
		pp    *int32
		fl    *uint8
	)
	if n, ok := productIndex(key, len(st.got)); ok {
		total, pp, fl = &st.got[n], &st.part[n], &st.flags[n]
	} else {
		o := st.others[string(key)]
		if o == nil {
			o = &otherKey{}
			st.others[string(key)] = o
		}
		total, pp, fl = &o.total, &o.part, &o.flags
	}
	if *pp != 0 && *pp != partition+1 {
		*fl |= keyMulti
	}
	*pp = partition + 1
	switch {
	case value == nil:
		vr.Tombstones++
		*fl &^= keyPresent
	case len(value) != 8:
		vr.BadValues++
	default:
		*total = int64(binary.BigEndian.Uint64(value))
		*fl |= keyPresent
	}
}

// compare checks every product against expected, and every other key, into
// vr (up to ten examples).
func (st *changelogState) compare(vr *verifyResult, expected []int64, partitions int) {
	example := func(s string) {
		if len(vr.Examples) < 10 {
			vr.Examples = append(vr.Examples, s)
		}
	}
	key := []byte{'p'}
	for n, exp := range expected {
		vr.KeysChecked++
		key = strconv.AppendInt(key[:1], int64(n), 10)
		if st.flags[n]&keyMulti != 0 {
			vr.MultiPartition++
		}
		if st.flags[n]&keyPresent == 0 {
			vr.Missing++
			example(fmt.Sprintf("missing %s (want %d)", key, exp))
			continue
		}
		vr.KeysFound++
		if got := st.got[n]; got != exp {
			vr.Mismatches++
			example(fmt.Sprintf("%s: changelog %d, want %d (diff %+d)", key, got, exp, got-exp))
		}
		if p := sales.Partition(key, int32(partitions)); st.part[n]-1 != p {
			vr.WrongPartition++
			example(fmt.Sprintf("%s in changelog partition %d, want %d", key, st.part[n]-1, p))
		}
	}
	keys := make([]string, 0, len(st.others))
	for k := range st.others {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		o := st.others[k]
		if o.flags&keyMulti != 0 {
			vr.MultiPartition++
		}
		if o.flags&keyPresent != 0 {
			vr.KeysFound++
			vr.Extra++
			example(fmt.Sprintf("unexpected key %q = %d", k, o.total))
		}
	}
}
