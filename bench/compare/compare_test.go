package main

import (
	"encoding/binary"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/salesagg/salesagg/internal/sales"
)

func TestEventSourceCoversEveryProduct(t *testing.T) {
	const products, events = 1000, 2500
	seen := make([]int, products)
	a, b := newEventSource(7, products), newEventSource(7, products)
	for i := 0; i < events; i++ {
		p, v := a.next()
		q, w := b.next()
		if p != q || v != w {
			t.Fatalf("event %d: (%d, %d) and (%d, %d) from the same seed", i, p, v, q, w)
		}
		if p < 0 || p >= products || v < 1 || v > 1000 {
			t.Fatalf("event %d: product %d, value %d out of range", i, p, v)
		}
		seen[p]++
		if i == products-1 && slices.Contains(seen, 0) {
			t.Fatalf("after the first %d events a product is missing", products)
		}
	}
	c, d := newEventSource(7, products), newEventSource(8, products)
	same := true
	for i := 0; i < 20; i++ {
		p, _ := c.next()
		q, _ := d.next()
		same = same && p == q
	}
	if same {
		t.Error("seeds 7 and 8 draw the same products")
	}
}

func TestProductIndex(t *testing.T) {
	for key, want := range map[string]int{"p0": 0, "p7": 7, "p999": 999} {
		if n, ok := productIndex([]byte(key), 1000); !ok || n != want {
			t.Errorf("productIndex(%q) = %d, %v; want %d", key, n, ok, want)
		}
	}
	for _, key := range []string{"", "p", "p1000", "p01", "p-1", "q1", "p1a", "p99999999999"} {
		if n, ok := productIndex([]byte(key), 1000); ok {
			t.Errorf("productIndex(%q) = %d, true; want not a product", key, n)
		}
	}
}

func TestPlanAndVariants(t *testing.T) {
	o := options{systems: []string{sysCeiling, sysReference, sysSalesagg}, refThreads: []int{1, 2}, refCaches: []int64{cacheDefault, 64 << 20},
		refRocksDB: []string{rocksDefault}, refTxn: []bool{false}}
	var names []string
	for _, s := range o.plan(100, atLeastOnce) {
		names = append(names, s.name())
	}
	want := []string{"ceiling", "reference (threads 1, cache default)", "reference (threads 1, cache 64 MiB)",
		"reference (threads 2, cache default)", "reference (threads 2, cache 64 MiB)", "salesagg"}
	if !slices.Equal(names, want) {
		t.Errorf("plan = %q, want %q", names, want)
	}
	if s := (refVariant{threads: 2, cache: 67108864}).slug(); s != "reference-t2-c67108864" {
		t.Errorf("slug = %q", s)
	}
	for c, want := range map[int64]string{0: "0 B", 1000: "1000 B", 10 << 10: "10 KiB", 1 << 30: "1 GiB"} {
		if got := cacheName(c); got != want {
			t.Errorf("cacheName(%d) = %q, want %q", c, got, want)
		}
	}
	if _, err := parseCaches("default,-1"); err == nil {
		t.Error("parseCaches accepted -1")
	}
}

func TestTableBestReference(t *testing.T) {
	slow, fast := refVariant{threads: 1, cache: cacheDefault}, refVariant{threads: 2, cache: cacheDefault}
	rep := &report{Order: []string{sysCeiling, sysSalesagg, slow.name(), fast.name()}, Systems: map[string]*systemResult{
		sysCeiling:  {System: sysCeiling, Status: "ok", EventsPerSec: 400},
		sysSalesagg: {System: sysSalesagg, Status: "ok", EventsPerSec: 200, CPUPerEventUs: 5},
		slow.name(): {System: slow.name(), Status: "ok", EventsPerSec: 50, CPUPerEventUs: 40, Reference: slow.settings()},
		fast.name(): {System: fast.name(), Status: "ok", EventsPerSec: 100, CPUPerEventUs: 20, Reference: fast.settings()},
	}}
	rep.derive()
	if rep.BestReference != fast.name() {
		t.Fatalf("best = %q", rep.BestReference)
	}
	if v := rep.Systems[sysSalesagg].EventsPerSecVsCeiling; v != 0.5 {
		t.Errorf("salesagg vs ceiling = %v", v)
	}
	tab := rep.table()
	if !strings.Contains(tab, fast.name()+" **best**") {
		t.Errorf("best not marked:\n%s", tab)
	}
	for _, line := range strings.Split(tab, "\n") {
		if strings.HasPrefix(line, "| (a) **throughput, events/s") && !strings.Contains(line, "| 2.00× | 0.50× |") {
			t.Errorf("throughput ratios (vs best, vs ceiling) wrong: %s", line)
		}
		if strings.HasPrefix(line, "| **CPU per event") && !strings.Contains(line, "| 0.25× |") {
			t.Errorf("CPU ratio vs best wrong: %s", line)
		}
	}
}

func TestChangelogStateCompare(t *testing.T) {
	const partitions = 3
	be := func(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }
	part := func(k string) int32 { return sales.Partition([]byte(k), partitions) }
	expected := []int64{10, 20, 30, 40, 50}
	st := newChangelogState(len(expected))
	var vr verifyResult
	st.add(&vr, []byte("p0"), be(5), part("p0"))  // superseded below
	st.add(&vr, []byte("p0"), be(10), part("p0")) // ok
	st.add(&vr, []byte("p1"), be(21), part("p1")) // mismatch
	// p2 missing
	st.add(&vr, []byte("p3"), be(40), (part("p3")+1)%partitions) // wrong partition
	st.add(&vr, []byte("p4"), be(50), part("p4"))
	st.add(&vr, []byte("p4"), nil, part("p4"))   // tombstoned: missing
	st.add(&vr, []byte("p5"), be(1), part("p5")) // beyond the products: extra
	st.add(&vr, []byte("p01"), []byte{1}, 0)     // not canonical, bad value: not present
	st.compare(&vr, expected, partitions)
	want := verifyResult{ChangelogRecords: 8, Tombstones: 1, BadValues: 1, KeysChecked: 5, KeysFound: 4,
		Mismatches: 1, Missing: 2, Extra: 1, WrongPartition: 1}
	vr.Examples = nil
	if !reflect.DeepEqual(vr, want) {
		t.Errorf("got  %+v\nwant %+v", vr, want)
	}

	st = newChangelogState(1)
	vr = verifyResult{}
	st.add(&vr, []byte("p0"), be(1), 0)
	st.add(&vr, []byte("p0"), be(1), 1)
	st.compare(&vr, []int64{1}, 1)
	if vr.MultiPartition != 1 {
		t.Errorf("a key in two partitions: MultiPartition = %d", vr.MultiPartition)
	}
}

func TestPlanTuningsAndReferenceProducts(t *testing.T) {
	o := options{systems: []string{sysSalesagg, sysReference}, products: []int{100, 1000}, guarantees: []string{atLeastOnce, exactlyOnceV2},
		refThreads: []int{2}, refCaches: []int64{64 << 20}, refRocksDB: []string{rocksDefault, rocksTuned}, refTxn: []bool{false, true},
		refProducts: []int{1000}}
	names := func(ss []system) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.name())
		}
		return out
	}
	if got := names(o.plan(100, exactlyOnceV2)); !slices.Equal(got, []string{"salesagg"}) {
		t.Errorf("plan at 100 products = %q, want salesagg only (--reference-products 1000)", got)
	}
	wantALO := []string{"salesagg", "reference (threads 2, cache 64 MiB)", "reference (threads 2, cache 64 MiB, RocksDB tuned)"}
	if got := names(o.plan(1000, atLeastOnce)); !slices.Equal(got, wantALO) {
		t.Errorf("at-least-once plan = %q, want %q (no transactional stores)", got, wantALO)
	}
	wantEOS := []string{"salesagg", "reference (threads 2, cache 64 MiB)", "reference (threads 2, cache 64 MiB, transactional stores)",
		"reference (threads 2, cache 64 MiB, RocksDB tuned)", "reference (threads 2, cache 64 MiB, RocksDB tuned, transactional stores)"}
	if got := names(o.plan(1000, exactlyOnceV2)); !slices.Equal(got, wantEOS) {
		t.Errorf("exactly-once plan = %q, want %q", got, wantEOS)
	}
	// In the order first met: at-least-once's variants, then exactly-once's new ones.
	wantAll := append(slices.Clone(wantALO), wantEOS[2], wantEOS[4])
	if got := names(o.allSystems()); !slices.Equal(got, wantAll) {
		t.Errorf("allSystems = %q, want %q", got, wantAll)
	}
	v := refVariant{threads: 2, cache: cacheDefault, rocksdb: rocksTuned, txn: true}
	if s := v.slug(); s != "reference-t2-cdefault-rt-tx" {
		t.Errorf("slug = %q", s)
	}
	if st := v.settings(); st.RocksDB != rocksTuned || !st.TransactionalSS || st.CacheMaxBytes != nil {
		t.Errorf("settings = %+v", st)
	}
	if got, err := parseBools("false,true"); err != nil || !slices.Equal(got, []bool{false, true}) {
		t.Errorf("parseBools = %v, %v", got, err)
	}
	for _, bad := range []string{"", "yes", "true,true", "1"} {
		if _, err := parseBools(bad); err == nil {
			t.Errorf("parseBools(%q) accepted", bad)
		}
	}
	bad := options{events: 1, partitions: 3, commitInterval: 1, profileSeconds: 1, products: []int{100}, guarantees: []string{atLeastOnce},
		systems: []string{sysReference}, refThreads: []int{1}, refCaches: []int64{cacheDefault}, refRocksDB: []string{"fast"},
		refTxn: []bool{false}, refProducts: []int{200}, refTimeLimit: -1, windows: "1h,1h30m,1h", eventSpan: -1}
	err := bad.validate(nil)
	for _, want := range []string{"--reference-rocksdb: unknown setting", "--reference-products: 200 is not one of --products", "--reference-time-limit",
		`--windows: "1h30m" is not a size`, "--windows: 1h listed twice", "--event-span must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate: %v, want a problem %q", err, want)
		}
	}
}

func TestGrowthSideBySide(t *testing.T) {
	g := &growthReport{Guarantees: []string{atLeastOnce}, Series: []growthSeries{
		{System: sysSalesagg, Guarantee: atLeastOnce, Points: []growthPoint{
			{Products: 100, Status: "ok", EventsPerSec: 400000, FullRestoreStartToReadyMs: 500},
			{Products: 1000, Status: "ok", EventsPerSec: 100000, FullRestoreStartToReadyMs: 2000}}},
		{System: "reference (threads 1, cache default)", Guarantee: atLeastOnce, Points: []growthPoint{
			{Products: 1000, Status: "ok", EventsPerSec: 20000, FullRestoreStartToReadyMs: 8000, Cut: true}}},
		{System: "reference (threads 2, cache default)", Guarantee: atLeastOnce, Points: []growthPoint{
			{Products: 1000, Status: "ok", EventsPerSec: 25000, FullRestoreStartToReadyMs: 10000}}},
	}}
	got := g.sideBySide()
	want := "| 1,000 | 100,000 | 25,000 | 4.0 | 2.00 | 10.00 | 0.20 | reference (threads 2, cache default) |\n"
	if !strings.Contains(got, want) {
		t.Errorf("side by side:\n%s\nwant the row\n%s", got, want)
	}
	if strings.Contains(got, "| 100 |") {
		t.Errorf("a row without a reference point:\n%s", got)
	}
	g.Series[2].Points[0].Status = "failed"
	if got := g.sideBySide(); !strings.Contains(got, "20,000 (cut at the time limit") {
		t.Errorf("the cut variant is not marked:\n%s", got)
	}
}
