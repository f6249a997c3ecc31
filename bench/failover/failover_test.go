package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseReferenceRestore(t *testing.T) {
	for line, want := range map[string]struct {
		task string
		n    int64
		ok   bool
	}{
		"REFERENCE RESTORE END store=PRODUCT_AGGREGATED_SALES partition=2 records=5":        {"0_2", 5, true},
		"REFERENCE RESTORE SUSPENDED store=PRODUCT_AGGREGATED_SALES partition=0 records=17": {"0_0", 17, true},
		"REFERENCE RESTORE START store=PRODUCT_AGGREGATED_SALES partition=2 from=0 to=8":    {"", 0, false},
		"REFERENCE RESTORE TOTAL records=9 ms=648":                                          {"", 0, false},
	} {
		task, n, ok := parseReferenceRestore(line)
		if task != want.task || n != want.n || ok != want.ok {
			t.Errorf("parseReferenceRestore(%q) = %q, %d, %t; want %q, %d, %t", line, task, n, ok, want.task, want.n, want.ok)
		}
	}
}

func TestReferenceRestoreLinesAreRestores(t *testing.T) {
	c := &cluster{sys: sysReference, t0: time.Now()}
	in := &instance{c: c, name: "bench-i1"}
	at := time.Now()
	c.onReferenceLine(in, "stdout", at, "REFERENCE RESTORE START store=PRODUCT_AGGREGATED_SALES partition=1 from=0 to=300")
	c.onReferenceLine(in, "stdout", at, "REFERENCE RESTORE END store=PRODUCT_AGGREGATED_SALES partition=1 records=300")
	c.onReferenceLine(in, "stdout", at, "REFERENCE RESTORE END store=PRODUCT_AGGREGATED_SALES partition=2 records=0")
	c.onReferenceLine(in, "stderr", at, "2026-12-02T05:36:49.296 [main] WARN StreamThread - something")
	c.onReferenceLine(in, "stderr", at, "2026-12-02T05:36:49.296 [main] ERROR StreamThread - broken")
	s := c.restoresBetween(at.Add(-time.Second), at.Add(time.Second), "")
	if s.Records != 300 || s.Restores != 1 || s.ByInstance["bench-i1"] != 300 {
		t.Errorf("restores = %+v, want 300 records in one restore by bench-i1", s)
	}
	c.onReferenceLine(in, "stdout", at, "REFERENCE STANDBY CATCHUP store=PRODUCT_AGGREGATED_SALES partition=0 from=10 behind=4000")
	c.onReferenceLine(in, "stdout", at, "REFERENCE STANDBY SUSPENDED store=PRODUCT_AGGREGATED_SALES partition=0 applied=4100 reason=PROMOTED")
	c.onReferenceLine(in, "stdout", at, "REFERENCE STANDBY SUSPENDED store=PRODUCT_AGGREGATED_SALES partition=2 applied=0 reason=MIGRATED")
	s = c.restoresBetween(at.Add(-time.Second), at.Add(time.Second), "")
	if s.CopyCatchups != 1 || s.CopyBehind != 4000 || s.CopyApplied != 4100 {
		t.Errorf("copies = %+v, want one catch-up of 4000 behind that applied 4100", s)
	}
	if ce := c.copyEvents(); len(ce) != 1 || ce[0].Task != "0_0" || ce[0].From != 10 || ce[0].ClosedMs < 0 {
		t.Errorf("copy events = %+v", ce)
	}
	if in.warnLines != 1 || in.errs.Count != 1 {
		t.Errorf("warn %d, error %d lines; want 1 and 1", in.warnLines, in.errs.Count)
	}
}

func TestNameMembers(t *testing.T) {
	c := &cluster{insts: []*instance{{name: "bench-i0", addr: "127.0.0.1:1000"}, {name: "bench-i1", addr: "127.0.0.1:1001"}}}
	v := []memberView{{Name: "bench-i0", Server: "127.0.0.1:1000", Self: true}, {Server: "127.0.0.1:1001", Tasks: []string{"0_1"}}, {Server: "127.0.0.1:9"}}
	c.nameMembers(v)
	if v[0].Name != "bench-i0" || v[1].Name != "bench-i1" || v[2].Name != "127.0.0.1:9" {
		t.Errorf("names = %q, %q, %q", v[0].Name, v[1].Name, v[2].Name)
	}
	if o := owners(v); o["0_1"] != "bench-i1" {
		t.Errorf("owners = %v", o)
	}
}

func TestSpecsPerSystem(t *testing.T) {
	var got []string
	for _, sp := range specs([]string{scKill}, []string{sysSalesagg, sysReference}) {
		got = append(got, sp.sys+":"+sp.name)
	}
	want := []string{"salesagg:kill-s0", "reference:kill-s0-ref", "salesagg:kill-s1", "reference:kill-s1-ref"}
	if !slices.Equal(got, want) {
		t.Errorf("specs = %q, want %q", got, want)
	}
	c := &cluster{e: &env{o: options{sessionTimeout: 10 * time.Second, commitInterval: 100 * time.Millisecond, refRocksDB: "default",
		refTxnStores: true, refProbingMs: 60000}}, sys: sysReference, app: "app", topic: "app-sales-events",
		set: settings{Standbys: 1, LeaveGroupOnClose: false, MaxWarmupReplicas: 1}}
	args := strings.Join(c.referenceArgs(&instance{name: "bench-i2", addr: "127.0.0.1:7", stateDir: "/s"}), " ")
	for _, w := range []string{"--instance-id bench-i2", "--http-addr 127.0.0.1:7", "--num-standby-replicas 1", "--leave-group-on-close false",
		"--transactional-state-stores true", "--prop session.timeout.ms=10000", "--prop max.warmup.replicas=1",
		"--processing-guarantee exactly_once_v2", "--commit-interval-ms 100"} {
		if !strings.Contains(args, w) {
			t.Errorf("reference args %q lack %q", args, w)
		}
	}
	if !c.exitOK(143) || (&cluster{sys: sysSalesagg}).exitOK(143) {
		t.Error("exit 143 is clean for the JVM only")
	}
}

func TestRatios(t *testing.T) {
	kill := func(sys, name string, active, restored int64) *runResult {
		return &runResult{System: sys, Name: name, Scenario: scKill, Status: "ok", Settings: settings{Label: "num.standby.replicas=0"},
			Kill: &killResult{MaxFirstAnswerMs: active, MaxActiveAnswerMs: active, KillToSurvivorsReadyMs: active,
				Restored: restoreSummary{Records: restored},
				Restart:  &restartResult{StartToServingMs: 1000, StartToSettledMs: 3000, RestoredUntilSettled: restoreSummary{Records: 0}}}}
	}
	rep := &report{Runs: []*runResult{
		kill(sysSalesagg, "kill-s0", 11000, 100), kill(sysReference, "kill-s0-ref", 22000, 400),
		kill(sysSalesagg, "kill-s1", 500, 0), {System: sysReference, Name: "kill-s1-ref", Scenario: scKill, Status: "failed"},
	}}
	table := rep.ratios()
	for _, w := range []string{
		"| kill-s0 | num.standby.replicas=0 | kill → 200 from an active owner, slowest task (s) | 11.00 | 22.00 | 0.5 |",
		"| kill-s0 | num.standby.replicas=0 | records restored by the survivors | 100 | 400 | 0.25 |",
		"| kill-s0 | num.standby.replicas=0 | records restored from the restart until settled | 0 | 0 | – (both 0) |",
	} {
		if !strings.Contains(table, w) {
			t.Errorf("ratios table lacks\n%s\n in\n%s", w, table)
		}
	}
	if strings.Contains(table, "kill-s1 ") {
		t.Errorf("a failed reference run has ratios:\n%s", table)
	}
	if len(rep.Ratios) != 7 {
		t.Errorf("%d ratio rows, want 7", len(rep.Ratios))
	}
}
