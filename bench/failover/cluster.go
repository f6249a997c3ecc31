package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/bench/kit"
)

// env is what every run shares.
type env struct {
	o      options
	tmp    string
	addr   string
	adm    *kadm.Client
	kc     *kgo.Client // adm's client
	bin    string      // the built salesagg
	refSh  string      // bench/kstreams-reference/run.sh
	prefix string      // of every topic and group of the benchmark
}

// settings are the group settings of one run.
type settings struct {
	Standbys          int    `json:"num_standby_replicas"`
	LeaveGroupOnClose bool   `json:"leave_group_on_close"`
	MaxWarmupReplicas int    `json:"max_warmup_replicas,omitempty"` // 0: the service's default, not passed
	Label             string `json:"label"`
}

func (s settings) flags() []string {
	f := []string{
		"--num.standby.replicas", strconv.Itoa(s.Standbys),
		"--leave.group.on.close", strconv.FormatBool(s.LeaveGroupOnClose),
	}
	if s.MaxWarmupReplicas > 0 {
		f = append(f, "--max.warmup.replicas", strconv.Itoa(s.MaxWarmupReplicas))
	}
	return f
}

// instance is one member of the group: a fixed name (group.instance.id),
// HTTP address and state dir; its process changes with each start.
type instance struct {
	c        *cluster
	name     string
	addr     string // 127.0.0.1:PORT, http.addr and so application.server
	stateDir string
	starts   int

	mu        sync.Mutex
	proc      *kit.Proc
	errs      kit.ErrorLines
	warnLines int
}

func (in *instance) p() *kit.Proc {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.proc
}

func (in *instance) running() bool {
	p := in.p()
	return p != nil && p.Alive()
}

// cluster is one run's group: its instances, topics and what their logs told.
type cluster struct {
	e     *env
	sys   string // sysSalesagg or sysReference
	name  string // run name, e.g. kill-s0
	app   string // application.id (= group)
	topic string // input topic
	set   settings
	dir   string // run dir: logs/, state/
	insts []*instance
	ctl   *http.Client // readyz, instances
	probe *http.Client // product probes
	t0    time.Time

	mu        sync.Mutex
	procs     []*kit.Proc
	restores  []*restoreEvent
	copies    []*copyEvent
	anomalies []string
}

func newCluster(e *env, sys, name string, set settings, n int) (*cluster, error) {
	c := &cluster{e: e, sys: sys, name: name, app: e.prefix + "-" + name, set: set, dir: filepath.Join(e.tmp, name),
		t0: time.Now()}
	c.topic = c.app + "-sales-events"
	tr := &http.Transport{
		Proxy:               nil, // loopback only, whatever the environment says
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}
	c.ctl = &http.Client{Transport: tr, Timeout: 3 * time.Second}
	c.probe = &http.Client{Transport: tr, Timeout: time.Second}
	for i := 0; i < n; i++ {
		port, err := kit.FreePort()
		if err != nil {
			return nil, err
		}
		c.insts = append(c.insts, &instance{c: c, name: fmt.Sprintf("bench-i%d", i), addr: fmt.Sprintf("127.0.0.1:%d", port),
			stateDir: filepath.Join(c.dir, "state", fmt.Sprintf("i%d", i))})
	}
	return c, nil
}

func (c *cluster) anomaly(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.anomalies = append(c.anomalies, msg)
	c.mu.Unlock()
	logf("%s: ANOMALY: %s", c.name, msg)
}

func (c *cluster) byName(name string) *instance {
	for _, in := range c.insts {
		if in.name == name {
			return in
		}
	}
	return nil
}

// start starts the instance's process (again): same name, port, state dir.
func (c *cluster) start(in *instance) error {
	if in.running() {
		return fmt.Errorf("%s is already running", in.name)
	}
	in.starts++
	if c.sys == sysReference {
		return c.startReference(in)
	}
	args := []string{"run",
		"--bootstrap.servers", c.e.addr,
		"--application.id", c.app,
		"--input.topic", c.topic,
		"--notification.topic", c.app + "-notifications",
		"--state.dir", in.stateDir,
		"--http.addr", in.addr,
		"--group.instance.id", in.name,
		"--session.timeout.ms", strconv.FormatInt(c.e.o.sessionTimeout.Milliseconds(), 10),
		"--processing.guarantee", guarantee,
		"--commit.interval.ms", strconv.FormatInt(c.e.o.commitInterval.Milliseconds(), 10),
		"--log.format", "json",
		"--group.protocol", c.e.o.groupProtocol,
	}
	args = append(args, c.set.flags()...)
	pname := fmt.Sprintf("%s-%s-%d", c.name, in.name, in.starts)
	p, err := kit.Start(kit.Spec{Name: pname, LogDir: filepath.Join(c.dir, "logs"), Path: c.e.bin, Args: args, Dir: c.e.o.repo,
		OnLine: func(stream string, at time.Time, line string) {
			if stream == "stderr" {
				c.onLogLine(in, at, line)
			}
		}})
	if err != nil {
		return err
	}
	c.adopt(in, p)
	logf("%s: started %s (pid %d, http %s, state %s)", c.name, in.name, p.PID, in.addr, in.stateDir)
	return nil
}

// referenceArgs are run.sh's arguments for one instance of the reference:
// the same application settings as salesagg's, static membership, an
// interactive-queries HTTP server on the instance's address.
func (c *cluster) referenceArgs(in *instance) []string {
	o := c.e.o
	args := []string{
		"--bootstrap", c.e.addr,
		"--application-id", c.app,
		"--input-topic", c.topic,
		"--notification-topic", c.app + "-notifications",
		"--state-dir", in.stateDir,
		"--http-addr", in.addr,
		"--processing-guarantee", guarantee,
		"--commit-interval-ms", strconv.FormatInt(o.commitInterval.Milliseconds(), 10),
		"--num-standby-replicas", strconv.Itoa(c.set.Standbys),
		"--leave-group-on-close", strconv.FormatBool(c.set.LeaveGroupOnClose),
		"--rocksdb", o.refRocksDB,
		"--transactional-state-stores", strconv.FormatBool(o.refTxnStores),
		"--prop", "probing.rebalance.interval.ms=" + strconv.Itoa(o.refProbingMs),
	}
	if o.groupProtocol == "streams" {
		// A streams group has no static membership, and runs the session
		// by the group's configuration (set by setStreamsGroup).
		args = append(args, "--prop", "group.protocol=streams")
	} else {
		args = append(args, "--instance-id", in.name,
			"--prop", "session.timeout.ms="+strconv.FormatInt(o.sessionTimeout.Milliseconds(), 10))
	}
	if c.set.MaxWarmupReplicas > 0 {
		args = append(args, "--prop", "max.warmup.replicas="+strconv.Itoa(c.set.MaxWarmupReplicas))
	}
	return args
}

func (c *cluster) startReference(in *instance) error {
	pname := fmt.Sprintf("%s-%s-%d", c.name, in.name, in.starts)
	p, err := kit.Start(kit.Spec{Name: pname, LogDir: filepath.Join(c.dir, "logs"), Path: c.e.refSh, Args: c.referenceArgs(in), Dir: c.e.o.repo,
		OnLine: func(stream string, at time.Time, line string) { c.onReferenceLine(in, stream, at, line) }})
	if err != nil {
		return err
	}
	c.adopt(in, p)
	logf("%s: started %s (reference, pid %d, http %s, state %s)", c.name, in.name, p.PID, in.addr, in.stateDir)
	return nil
}

// exitOK: salesagg exits 0 after SIGTERM; the JVM 143 after its shutdown hook.
func (c *cluster) exitOK(code int) bool {
	return code == 0 || (c.sys == sysReference && code == 143)
}

// kill9 SIGKILLs the instance's process and returns when the signal was sent.
func (c *cluster) kill9(in *instance) (time.Time, error) {
	p := in.p()
	if p == nil {
		return time.Time{}, fmt.Errorf("%s was never started", in.name)
	}
	return p.Kill()
}

// stopAll stops every process still running (SIGTERM, SIGKILL after the
// stop timeout), in parallel, and notes unclean exits.
func (c *cluster) stopAll() {
	c.mu.Lock()
	procs := append([]*kit.Proc(nil), c.procs...)
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		if !p.Alive() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, killed := p.Stop(c.e.o.stopTimeout)
			code, sig, _ := p.ExitInfo()
			switch {
			case killed:
				c.anomaly("%s: no exit within %s of SIGTERM at the end of the run; killed", p.Name, c.e.o.stopTimeout)
			case !c.exitOK(code):
				c.anomaly("%s: exit code %d%s after SIGTERM at the end of the run (%.2f s)", p.Name, code, sigText(sig), took.Seconds())
			}
		}()
	}
	wg.Wait()
}

func sigText(sig string) string {
	if sig == "" {
		return ""
	}
	return " (signal " + sig + ")"
}

// ---------------------------------------------------------------------------
// Logs: restores and error lines.

// restoreEvent is one restore of a task's store as the instance logged it:
// the "Finished restoring changelog … with a total number of N records" line
// (every restore), and with it, when the task came from another member,
// "task [0_N] Took over from X: restored N records in D", or, for a standby
// made active, "task [0_N] standby was N records behind; restored M records".
// Lines of one task on one instance within 2 s of each other form one event.
type restoreEvent struct {
	at              time.Time
	AtMs            int64  `json:"at_ms"` // since the run's start
	Instance        string `json:"instance"`
	Task            string `json:"task"`
	Records         int64  `json:"records"`
	Finished        bool   `json:"finished_line"`
	FinishedRecords int64  `json:"finished_records"`
	TookOverFrom    string `json:"took_over_from,omitempty"`
	TakeoverRecords int64  `json:"takeover_records,omitempty"`
	FromStandby     bool   `json:"from_standby,omitempty"`
	StandbyBehind   int64  `json:"standby_behind,omitempty"`
	StandbyRecords  int64  `json:"standby_records,omitempty"`
}

func (ev *restoreEvent) total() int64 {
	switch {
	case ev.Finished:
		return ev.FinishedRecords
	case ev.FromStandby:
		return ev.StandbyRecords
	default:
		return ev.TakeoverRecords
	}
}

// copyEvent is one catch-up of a standby or warm-up copy of a task (a
// store that tails the task's changelog on a member not running it): from
// "task [0_N] <kind> copy tailing changelog … from offset F (N behind)" to
// "task [0_N] Closed <kind> copy at changelog offset P" (field "applied").
type copyEvent struct {
	at       time.Time
	closedAt time.Time
	AtMs     int64  `json:"at_ms"` // since the run's start
	Instance string `json:"instance"`
	Task     string `json:"task"`
	Kind     string `json:"kind"` // standby or warmup (the latest)
	From     int64  `json:"from_offset"`
	Behind   int64  `json:"behind"`
	ClosedMs int64  `json:"closed_at_ms"` // -1: no Closed line (open at the end, or its process was SIGKILLed)
	Applied  int64  `json:"applied"`      // -1: not closed
}

var (
	copyTailRe   = regexp.MustCompile(`^task \[([^\]]+)\] (\S+) copy tailing changelog \S+ from offset (\d+) \((\d+) behind\)`)
	copyClosedRe = regexp.MustCompile(`^task \[([^\]]+)\] Closed (\S+) copy at changelog offset`)
	copyKindRe   = regexp.MustCompile(`^task \[([^\]]+)\] Copy is now a (\S+)`)
)

var (
	finishedRe = regexp.MustCompile(`^Finished restoring changelog (\S+) to store \S+ with a total number of (\d+) records`)
	takeoverRe = regexp.MustCompile(`^task \[([^\]]+)\] Took over from (.+): restored (\d+) records`)
	standbyRe  = regexp.MustCompile(`^task \[([^\]]+)\] standby was (\d+) records behind; restored (\d+) records`)
	tpSuffixRe = regexp.MustCompile(`-(\d+)$`)
)

func (c *cluster) onLogLine(in *instance, at time.Time, line string) {
	var rec struct {
		Level   string `json:"level"`
		Msg     string `json:"msg"`
		Task    string `json:"task"`
		Records *int64 `json:"records"`
		Applied *int64 `json:"applied"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil {
		if strings.Contains(line, "panic") || strings.Contains(line, "fatal") {
			in.noteError(line)
		}
		return
	}
	switch rec.Level {
	case "error", "dpanic", "panic", "fatal":
		in.noteError(line)
	case "warn":
		in.mu.Lock()
		in.warnLines++
		in.mu.Unlock()
	}
	if m := finishedRe.FindStringSubmatch(rec.Msg); m != nil {
		task := rec.Task
		if task == "" {
			if s := tpSuffixRe.FindStringSubmatch(m[1]); s != nil {
				task = "0_" + s[1]
			}
		}
		n, _ := strconv.ParseInt(m[2], 10, 64)
		if rec.Records != nil {
			n = *rec.Records
		}
		c.noteRestore(in.name, task, at, func(ev *restoreEvent) bool {
			if ev.Finished {
				return false
			}
			ev.Finished, ev.FinishedRecords = true, n
			return true
		})
	} else if m := takeoverRe.FindStringSubmatch(rec.Msg); m != nil {
		n, _ := strconv.ParseInt(m[3], 10, 64)
		c.noteRestore(in.name, m[1], at, func(ev *restoreEvent) bool {
			if ev.TookOverFrom != "" {
				return false
			}
			ev.TookOverFrom, ev.TakeoverRecords = m[2], n
			return true
		})
	} else if m := copyTailRe.FindStringSubmatch(rec.Msg); m != nil {
		from, _ := strconv.ParseInt(m[3], 10, 64)
		behind, _ := strconv.ParseInt(m[4], 10, 64)
		c.mu.Lock()
		c.copies = append(c.copies, &copyEvent{at: at, AtMs: at.Sub(c.t0).Milliseconds(), Instance: in.name, Task: m[1], Kind: m[2],
			From: from, Behind: behind, ClosedMs: -1, Applied: -1})
		c.mu.Unlock()
	} else if m := copyClosedRe.FindStringSubmatch(rec.Msg); m != nil {
		if ce := c.openCopy(in.name, m[1]); ce != nil {
			c.mu.Lock()
			ce.closedAt, ce.ClosedMs, ce.Kind = at, at.Sub(c.t0).Milliseconds(), m[2]
			if rec.Applied != nil {
				ce.Applied = *rec.Applied
			}
			c.mu.Unlock()
		}
	} else if m := copyKindRe.FindStringSubmatch(rec.Msg); m != nil {
		if ce := c.openCopy(in.name, m[1]); ce != nil {
			c.mu.Lock()
			ce.Kind = m[2]
			c.mu.Unlock()
		}
	} else if m := standbyRe.FindStringSubmatch(rec.Msg); m != nil {
		behind, _ := strconv.ParseInt(m[2], 10, 64)
		n, _ := strconv.ParseInt(m[3], 10, 64)
		c.noteRestore(in.name, m[1], at, func(ev *restoreEvent) bool {
			if ev.FromStandby {
				return false
			}
			ev.FromStandby, ev.StandbyBehind, ev.StandbyRecords = true, behind, n
			return true
		})
	}
}

var refRestoreEndRe = regexp.MustCompile(`^REFERENCE RESTORE (?:END|SUSPENDED) store=\S+ partition=(\d+) records=(\d+)`)

var (
	refStandbyCatchupRe   = regexp.MustCompile(`^REFERENCE STANDBY CATCHUP store=\S+ partition=(\d+) from=(\d+) behind=(\d+)`)
	refStandbySuspendedRe = regexp.MustCompile(`^REFERENCE STANDBY SUSPENDED store=\S+ partition=(\d+) applied=(\d+)`)
)

// onReferenceLine reads the reference's output: its restore listener's
// "REFERENCE RESTORE END store=S partition=N records=M" lines (stdout) are
// the restores (task 0_N; one sub-topology), its standby update listener's
// "REFERENCE STANDBY CATCHUP|SUSPENDED" lines the copies' catch-up, its
// SLF4J lines (stderr) the error and warning counts.
func (c *cluster) onReferenceLine(in *instance, stream string, at time.Time, line string) {
	if stream == "stderr" {
		switch {
		case strings.Contains(line, "] ERROR "):
			in.noteError(line)
		case strings.Contains(line, "] WARN "):
			in.mu.Lock()
			in.warnLines++
			in.mu.Unlock()
		}
		return
	}
	if strings.HasPrefix(line, "REFERENCE ERROR") {
		in.noteError(line)
		return
	}
	// Standby and warm-up copies (Kafka Streams runs both as standby tasks):
	// the reference's standby update listener.
	if m := refStandbyCatchupRe.FindStringSubmatch(line); m != nil {
		from, _ := strconv.ParseInt(m[2], 10, 64)
		behind, _ := strconv.ParseInt(m[3], 10, 64)
		c.mu.Lock()
		c.copies = append(c.copies, &copyEvent{at: at, AtMs: at.Sub(c.t0).Milliseconds(), Instance: in.name, Task: "0_" + m[1], Kind: "standby",
			From: from, Behind: behind, ClosedMs: -1, Applied: -1})
		c.mu.Unlock()
		return
	}
	if m := refStandbySuspendedRe.FindStringSubmatch(line); m != nil {
		if ce := c.openCopy(in.name, "0_"+m[1]); ce != nil {
			applied, _ := strconv.ParseInt(m[2], 10, 64)
			c.mu.Lock()
			ce.closedAt, ce.ClosedMs, ce.Applied = at, at.Sub(c.t0).Milliseconds(), applied
			c.mu.Unlock()
		}
		return
	}
	task, n, ok := parseReferenceRestore(line)
	if !ok {
		return
	}
	c.noteRestore(in.name, task, at, func(ev *restoreEvent) bool {
		if ev.Finished {
			return false
		}
		ev.Finished, ev.FinishedRecords = true, n
		return true
	})
}

// parseReferenceRestore reads a "REFERENCE RESTORE END|SUSPENDED" line.
func parseReferenceRestore(line string) (task string, records int64, ok bool) {
	m := refRestoreEndRe.FindStringSubmatch(line)
	if m == nil {
		return "", 0, false
	}
	n, _ := strconv.ParseInt(m[2], 10, 64)
	return "0_" + m[1], n, true
}

// openCopy returns the latest copy of (instance, task) not closed yet.
func (c *cluster) openCopy(inst, task string) *copyEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.copies) - 1; i >= 0; i-- {
		if ce := c.copies[i]; ce.Instance == inst && ce.Task == task {
			if ce.closedAt.IsZero() {
				return ce
			}
			return nil
		}
	}
	return nil
}

// noteRestore attaches a restore line to the latest event of (instance,
// task) if it is recent and lacks that line (set returns false when it
// already has it), else starts a new event.
func (c *cluster) noteRestore(inst, task string, at time.Time, set func(*restoreEvent) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.restores) - 1; i >= 0; i-- {
		ev := c.restores[i]
		if at.Sub(ev.at) > 2*time.Second {
			break
		}
		if ev.Instance == inst && ev.Task == task {
			if set(ev) {
				ev.Records = ev.total()
				return
			}
			break
		}
	}
	ev := &restoreEvent{at: at, AtMs: at.Sub(c.t0).Milliseconds(), Instance: inst, Task: task}
	set(ev)
	ev.Records = ev.total()
	c.restores = append(c.restores, ev)
}

func (in *instance) noteError(line string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.errs.Note(line, 400)
}

// restoreSummary sums the restore events of a time window.
type restoreSummary struct {
	Records           int64            `json:"records"`
	Restores          int              `json:"restores"` // events with at least one record
	TakeoverRecords   int64            `json:"takeover_records"`
	Takeovers         int              `json:"takeovers"`
	StandbyPromotions int              `json:"standby_promotions"`
	StandbyRecords    int64            `json:"standby_records"`
	StandbyBehind     int64            `json:"standby_behind_records"`
	ByInstance        map[string]int64 `json:"records_by_instance,omitempty"`
	// Standby and warm-up copies that started tailing in the window: how
	// many, how far behind the changelog end they started (their catch-up),
	// and what those closed in the window had applied.
	CopyCatchups int   `json:"copy_catchups"`
	CopyBehind   int64 `json:"copy_behind_records"`
	CopyApplied  int64 `json:"copy_applied_records"`
}

// restoresBetween sums the events read in [from, to]; only (instance filter)
// when only != "".
func (c *cluster) restoresBetween(from, to time.Time, only string) restoreSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := restoreSummary{ByInstance: map[string]int64{}}
	for _, ev := range c.restores {
		if ev.at.Before(from) || ev.at.After(to) || (only != "" && ev.Instance != only) {
			continue
		}
		s.Records += ev.Records
		if ev.Records > 0 {
			s.Restores++
			s.ByInstance[ev.Instance] += ev.Records
		}
		if ev.TookOverFrom != "" {
			s.Takeovers++
			s.TakeoverRecords += ev.TakeoverRecords
		}
		if ev.FromStandby {
			s.StandbyPromotions++
			s.StandbyRecords += ev.StandbyRecords
			s.StandbyBehind += ev.StandbyBehind
		}
	}
	for _, ce := range c.copies {
		if ce.at.Before(from) || ce.at.After(to) || (only != "" && ce.Instance != only) {
			continue
		}
		s.CopyCatchups++
		s.CopyBehind += ce.Behind
		if ce.Applied > 0 && !ce.closedAt.After(to) {
			s.CopyApplied += ce.Applied
		}
	}
	if len(s.ByInstance) == 0 {
		s.ByInstance = nil
	}
	return s
}

func (c *cluster) copyEvents() []copyEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]copyEvent, 0, len(c.copies))
	for _, ce := range c.copies {
		out = append(out, *ce)
	}
	return out
}

func (c *cluster) restoreEvents() []restoreEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]restoreEvent, 0, len(c.restores))
	for _, ev := range c.restores {
		out = append(out, *ev)
	}
	return out
}

// logGrace: a restore line is read a little after the instance logged it
// (pipe, scheduler); windows that end at an observed moment extend by this.
const logGrace = 500 * time.Millisecond

// ---------------------------------------------------------------------------
// HTTP

func (c *cluster) get(ctx context.Context, cl *http.Client, addr, path string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, nil, nil, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, body, err
}

func (c *cluster) ready(ctx context.Context, in *instance) (bool, string) {
	code, _, body, err := c.get(ctx, c.ctl, in.addr, "/readyz")
	if err != nil {
		return false, err.Error()
	}
	var v struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(body, &v)
	if v.Reason == "" {
		v.Reason = strings.TrimSpace(string(body))
	}
	return code == http.StatusOK, fmt.Sprintf("%d %s", code, v.Reason)
}

type memberView struct {
	Name   string   `json:"instance"`
	Server string   `json:"server"`
	Tasks  []string `json:"tasks"`
	Self   bool     `json:"self"`
}

func (c *cluster) view(ctx context.Context, in *instance) ([]memberView, error) {
	code, _, body, err := c.get(ctx, c.ctl, in.addr, "/v1/instances")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/instances on %s: %d", in.name, code)
	}
	var v struct {
		Instances []memberView `json:"instances"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("GET /v1/instances on %s: %w", in.name, err)
	}
	c.nameMembers(v.Instances)
	return v.Instances, nil
}

// nameMembers fills in the instance names the reference's view lacks (Kafka
// Streams' metadata has each member's application.server, not its
// group.instance.id; without static membership, under the streams
// protocol, it names itself by its address too) from the addresses the
// harness gave them.
func (c *cluster) nameMembers(v []memberView) {
	for i := range v {
		if v[i].Name == "" {
			v[i].Name = v[i].Server
		}
		v[i].Name = c.instanceName(v[i].Name)
	}
}

// instanceName returns the name of the instance at address name, or name.
func (c *cluster) instanceName(name string) string {
	for _, in := range c.insts {
		if in.addr == name {
			return in.name
		}
	}
	return name
}

// owners maps each task to its owner in a view.
func owners(v []memberView) map[string]string {
	m := map[string]string{}
	for _, mv := range v {
		for _, t := range mv.Tasks {
			m[t] = mv.Name
		}
	}
	return m
}

func selfTasks(v []memberView) []string {
	for _, mv := range v {
		if mv.Self {
			return mv.Tasks
		}
	}
	return nil
}

// answer is one product query's outcome.
type answer struct {
	code     int // 0: transport error
	instance string
	task     string
	standby  bool
	lag      int64 // X-Salesagg-Standby-Lag of a standby's answer (-1: none)
	err      string
}

func (a answer) String() string {
	if a.code == 0 {
		return "error: " + a.err
	}
	s := strconv.Itoa(a.code)
	if a.instance != "" {
		s += " from " + a.instance
	}
	if a.task != "" {
		s += " task=" + a.task
	}
	if a.standby {
		s += " (standby)"
	}
	if a.lag >= 0 {
		s += fmt.Sprintf(" lag %d", a.lag)
	}
	return s
}

// parseServedBy reads "X-Served-By: <instance>; task=0_N[; standby]".
func parseServedBy(h string) (inst, task string, standby bool) {
	for i, part := range strings.Split(h, ";") {
		part = strings.TrimSpace(part)
		switch {
		case i == 0:
			inst = part
		case strings.HasPrefix(part, "task="):
			task = strings.TrimPrefix(part, "task=")
		case part == "standby":
			standby = true
		}
	}
	return inst, task, standby
}

func (c *cluster) ask(ctx context.Context, in *instance, product string) answer {
	code, h, _, err := c.get(ctx, c.probe, in.addr, "/v1/products/"+product)
	if err != nil {
		return answer{err: err.Error(), lag: -1}
	}
	a := answer{code: code, lag: -1}
	a.instance, a.task, a.standby = parseServedBy(h.Get("X-Served-By"))
	a.instance = c.instanceName(a.instance)
	if v := h.Get("X-Salesagg-Standby-Lag"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			a.lag = n
		}
	}
	return a
}

// ---------------------------------------------------------------------------
// Waits: every one bounded by --timeout (or the given limit), naming what it
// waits for when it gives up.

// waitFor calls check every `every` until it reports done; it fails when
// check fails, ctx ends or limit passes.
func waitFor(ctx context.Context, limit, every time.Duration, what string, check func() (bool, string, error)) (time.Time, error) {
	t0 := time.Now()
	deadline := t0.Add(limit)
	lastLog := t0
	status := ""
	for {
		done, st, err := check()
		now := time.Now()
		if err != nil {
			return time.Time{}, fmt.Errorf("waiting for %s: %w", what, err)
		}
		if done {
			return now, nil
		}
		status = st
		if now.After(deadline) {
			return time.Time{}, fmt.Errorf("waiting for %s: not reached within %s (last: %s)", what, limit, status)
		}
		if now.Sub(lastLog) >= 10*time.Second {
			lastLog = now
			logf("waiting for %s (%.0f s): %s", what, now.Sub(t0).Seconds(), status)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for %s: %w (last: %s)", what, context.Cause(ctx), status)
		case <-time.After(every):
		}
	}
}

// alive fails when one of ins is not running.
func alive(ins []*instance) error {
	for _, in := range ins {
		p := in.p()
		if p == nil {
			return fmt.Errorf("%s was never started", in.name)
		}
		if !p.Alive() {
			return p.ExitError("unexpectedly")
		}
	}
	return nil
}

func names(ins []*instance) string {
	var s []string
	for _, in := range ins {
		s = append(s, in.name)
	}
	return strings.Join(s, ", ")
}

func (c *cluster) waitReady(ctx context.Context, ins []*instance, limit time.Duration) (time.Time, error) {
	return waitFor(ctx, limit, 20*time.Millisecond, "GET /readyz 200 on "+names(ins), func() (bool, string, error) {
		if err := alive(ins); err != nil {
			return false, "", err
		}
		var not []string
		for _, in := range ins {
			if ok, reason := c.ready(ctx, in); !ok {
				not = append(not, in.name+": "+reason)
			}
		}
		return len(not) == 0, strings.Join(not, "; "), nil
	})
}

func (c *cluster) waitCaughtUp(ctx context.Context, ends map[int32]int64, live []*instance) (time.Time, error) {
	var want int64
	for _, e := range ends {
		want += e
	}
	return waitFor(ctx, c.e.o.timeout, 100*time.Millisecond, fmt.Sprintf("the committed offsets of group %s to reach the input end (%d)", c.app, want), func() (bool, string, error) {
		if err := alive(live); err != nil {
			return false, "", err
		}
		at, sum, err := kit.CommittedAtEnd(ctx, c.e.adm, c.app, c.topic, ends)
		if err != nil {
			return false, err.Error(), nil
		}
		return at, fmt.Sprintf("%d of %d offsets committed", sum, want), nil
	})
}

// settledState reports whether every live instance is ready, all of them
// show the same task owners in /v1/instances, every task has an owner among
// them and the tasks are balanced (each live instance owns at least one when
// there are enough tasks, counts differ by at most one).
func (c *cluster) settledState(ctx context.Context, live []*instance) (bool, map[string]string, string) {
	var first map[string]string
	for _, in := range live {
		if ok, reason := c.ready(ctx, in); !ok {
			return false, nil, in.name + " not ready: " + reason
		}
		v, err := c.view(ctx, in)
		if err != nil {
			return false, nil, err.Error()
		}
		o := owners(v)
		if first == nil {
			first = o
		} else if !equalMaps(first, o) {
			return false, nil, fmt.Sprintf("views differ: %s says %v, %s says %v", live[0].name, first, in.name, o)
		}
	}
	count := map[string]int{}
	for _, in := range live {
		count[in.name] = 0
	}
	for p := 0; p < partitions; p++ {
		t := fmt.Sprintf("0_%d", p)
		o, ok := first[t]
		if !ok {
			return false, first, "task " + t + " has no owner"
		}
		if _, ok := count[o]; !ok {
			return false, first, "task " + t + " owned by " + o + ", not a live instance"
		}
		count[o]++
	}
	lo, hi := partitions, 0
	for _, n := range count {
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > 1 || (len(live) <= partitions && lo == 0) {
		return false, first, fmt.Sprintf("not balanced: %v", first)
	}
	return true, first, fmt.Sprintf("%v", first)
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// waitSettled waits until settledState holds, unchanged, for stable; it
// returns the start of that stretch and the owners.
func (c *cluster) waitSettled(ctx context.Context, live []*instance, stable time.Duration) (time.Time, map[string]string, error) {
	var (
		since time.Time
		last  map[string]string
	)
	_, err := waitFor(ctx, c.e.o.timeout, 50*time.Millisecond, "the group to settle (all of "+names(live)+" ready, tasks balanced, every view the same)", func() (bool, string, error) {
		if err := alive(live); err != nil {
			return false, "", err
		}
		ok, own, st := c.settledState(ctx, live)
		now := time.Now()
		if !ok {
			since, last = time.Time{}, nil
			return false, st, nil
		}
		if since.IsZero() || !equalMaps(own, last) {
			since, last = now, own
		}
		return now.Sub(since) >= stable, st, nil
	})
	return since, last, err
}

// chooseProbes finds, for every task, a preloaded product it owns: it asks in
// for product-0, product-1, … and reads the task from X-Served-By.
func (c *cluster) chooseProbes(ctx context.Context, in *instance) (map[string]string, error) {
	probes := map[string]string{}
	var last answer
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < c.e.o.products && i < 2000 && len(probes) < partitions && time.Now().Before(deadline); i++ {
		p := productKey(i)
		var a answer
		// A product query can answer 503 for a moment (a rebalance); retry.
		for try := 0; try < 50 && time.Now().Before(deadline); try++ {
			a = c.ask(ctx, in, p)
			if a.code == http.StatusOK || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		last = a
		if a.code != http.StatusOK || a.task == "" {
			continue
		}
		if _, ok := probes[a.task]; !ok {
			probes[a.task] = p
		}
	}
	if len(probes) < partitions {
		return probes, fmt.Errorf("choosing a probe product per task on %s: found only %v among product-0… within 1 min, last answer %s", in.name, probes, last)
	}
	return probes, nil
}

// sortedKeys returns the keys of a map, sorted.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// removeState deletes the run's state dirs (logs stay).
func (c *cluster) removeState() {
	if err := os.RemoveAll(filepath.Join(c.dir, "state")); err != nil && !errors.Is(err, os.ErrNotExist) {
		logf("%s: removing state dirs: %v", c.name, err)
	}
}

// adopt records p as in's process and as one the cluster stops at the end.
func (c *cluster) adopt(in *instance, p *kit.Proc) {
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	in.mu.Lock()
	in.proc = p
	in.mu.Unlock()
}

// setStreamsGroup sets the streams group's session timeout, standby
// replicas and (when the run sets them) warm-up replicas on the broker (IncrementalAlterConfigs on the group): under the
// streams protocol the coordinator runs them by the group's configuration,
// not by what a member asks. salesagg sets them itself from its keys; the
// reference cannot, so the run does it before the reference starts.
func (c *cluster) setStreamsGroup(ctx context.Context, cl *kgo.Client) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, c.app
	set := map[string]string{
		"streams.session.timeout.ms":   strconv.FormatInt(c.e.o.sessionTimeout.Milliseconds(), 10),
		"streams.num.standby.replicas": strconv.Itoa(c.set.Standbys),
	}
	if c.set.MaxWarmupReplicas > 0 {
		set["streams.num.warmup.replicas"] = strconv.Itoa(c.set.MaxWarmupReplicas)
	}
	for k, v := range set {
		rc := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		rc.Name, rc.Value = k, kmsg.StringPtr(v)
		res.Configs = append(res.Configs, rc)
	}
	req.Resources = append(req.Resources, res)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(cctx, cl)
	if err != nil {
		return fmt.Errorf("setting the streams group's configuration: %w", err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("setting the streams group's configuration: %w", err)
		}
	}
	return nil
}
