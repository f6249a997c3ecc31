package main

import (
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
)

func TestProbeKeysCoverEveryPartition(t *testing.T) {
	keys := probeKeys("lat-x", 3, 2)
	if len(keys) != 6 {
		t.Fatalf("keys = %v, want 6", keys)
	}
	per := map[int32]int{}
	for _, k := range keys {
		if !strings.HasPrefix(k, "lat-x-probe-") {
			t.Errorf("key %q lacks the prefix", k)
		}
		per[sales.Partition([]byte(k), 3)]++
	}
	for p := int32(0); p < 3; p++ {
		if per[p] != 2 {
			t.Errorf("partition %d has %d probe keys, want 2 (%v)", p, per[p], per)
		}
	}
}

func TestTrackerDatesEachProbeByTheFirstReadShowingIt(t *testing.T) {
	// Scenario: three probes of one key at 0, 10 and 20 ms; HTTP shows 2 at
	// 15 ms, then 1 (a regression), then 3 at 40 ms; the changelog shows 3
	// at 100 ms at once. Probe latencies are first sight minus produce.
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tr := newTracker([]string{"k"})
	for i, at := range []time.Time{ms(0), ms(10), ms(20)} {
		if n := tr.produced("k", at); n != i+1 {
			t.Fatalf("probe number %d, want %d", n, i+1)
		}
	}
	if tr.allSeen(ms(30)) {
		t.Fatal("all seen before any read")
	}
	tr.seen("k", 2, ms(15), false)
	tr.seen("k", 1, ms(16), false)
	tr.seen("k", 3, ms(40), false)
	tr.seen("other", 9, ms(40), false) // not a probe key: ignored
	if tr.allSeen(ms(30)) {
		t.Fatal("all seen before the changelog showed any")
	}
	if excess := tr.seen("k", 3, ms(100), true); excess {
		t.Fatal("a total equal to the probes produced counted as excess")
	}
	if !tr.allSeen(ms(30)) {
		t.Fatal("not all seen after both showed 3")
	}
	httpL, logL, hu, lu, regress := tr.latencies(ms(0), ms(30))
	want := []time.Duration{15 * time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}
	if len(httpL) != 3 || hu != 0 || lu != 0 || regress != 1 {
		t.Fatalf("http %v unseen %d/%d regress %d", httpL, hu, lu, regress)
	}
	for i := range want {
		if httpL[i] != want[i] {
			t.Errorf("http latency of probe %d = %v, want %v", i+1, httpL[i], want[i])
		}
	}
	if logL[0] != 100*time.Millisecond || logL[2] != 80*time.Millisecond {
		t.Errorf("changelog latencies %v", logL)
	}
	// The window selects by produce time; a total above the probes is excess.
	if h, _, _, _, _ := tr.latencies(ms(5), ms(15)); len(h) != 1 {
		t.Errorf("window [5, 15) ms holds %d probes, want 1", len(h))
	}
	if !tr.seen("k", 4, ms(120), true) {
		t.Error("a total of 4 after 3 probes was not reported as excess")
	}
	tr.produced("k", ms(200))
	if _, _, hu, lu, _ := tr.latencies(ms(0), ms(300)); hu != 1 || lu != 1 {
		// The excess 4 was clamped to the 3 probes then produced: the 4th,
		// produced later, is not dated by it.
		t.Errorf("after a 4th probe: unseen http %d changelog %d, want 1 and 1", hu, lu)
	}
}

func TestDistNearestRank(t *testing.T) {
	var ls []time.Duration
	for i := 100; i >= 1; i-- {
		ls = append(ls, time.Duration(i)*time.Millisecond)
	}
	d := distOf(ls, 2)
	if d.N != 100 || d.Unseen != 2 || d.P50 != 50 || d.P90 != 90 || d.P99 != 99 || d.P999 != 100 || d.Max != 100 || d.Mean != 50.5 {
		t.Errorf("dist = %+v", d)
	}
	if e := distOf(nil, 3); e.N != 0 || e.Unseen != 3 || e.Max != 0 {
		t.Errorf("empty dist = %+v", e)
	}
}

func TestEffectiveIntervalIsEachSystemsDefault(t *testing.T) {
	for _, c := range []struct {
		sys, g string
		ms     int64
		want   int64
	}{
		{sysSalesagg, guaranteeEOS, intervalDefault, 100},
		{sysReference, guaranteeEOS, intervalDefault, 100},
		{sysSalesagg, guaranteeALOS, intervalDefault, 1000},
		{sysReference, guaranteeALOS, intervalDefault, 30_000},
		{sysReference, guaranteeALOS, 250, 250},
	} {
		if got := effectiveInterval(c.sys, c.g, c.ms); got != c.want {
			t.Errorf("effectiveInterval(%s, %s, %d) = %d, want %d", c.sys, c.g, c.ms, got, c.want)
		}
	}
}
