package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/salesagg/salesagg/bench/kit"
	"github.com/salesagg/salesagg/internal/sales"
)

// settleStable is how long the group must stay settled (same owners, all
// ready) to count as settled; the time reported is the start of that stretch.
const settleStable = 2 * time.Second

// runResult is everything measured in one run (scenario × settings).
type runResult struct {
	System     string    `json:"system"` // salesagg or reference
	Scenario   string    `json:"scenario"`
	Name       string    `json:"name"`
	Settings   settings  `json:"settings"`
	AppID      string    `json:"application_id"`
	InputTopic string    `json:"input_topic"`
	Status     string    `json:"status"` // ok, failed
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	DurationMs int64     `json:"duration_ms"`

	Preload  *preloadResult  `json:"preload,omitempty"`
	Producer *kit.PacerStats `json:"producer,omitempty"`
	Kill     *killResult     `json:"kill,omitempty"`
	Rolling  *rollingResult  `json:"rolling,omitempty"`
	Scale    *scaleResult    `json:"scale,omitempty"`

	RestoreEvents []restoreEvent        `json:"restore_events"`
	CopyEvents    []copyEvent           `json:"copy_events"`
	LogLines      map[string]*logCounts `json:"log_lines"` // per instance, over all its starts
	Anomalies     []string              `json:"anomalies,omitempty"`
	Logs          string                `json:"logs"`
}

type logCounts struct {
	Errors      int      `json:"error"`
	Warns       int      `json:"warn"`
	FirstErrors []string `json:"first_errors,omitempty"`
}

type preloadResult struct {
	Products          int               `json:"products"`
	ProduceMs         int64             `json:"produce_ms"`
	Instances         int               `json:"instances"`
	StartToAllReadyMs int64             `json:"start_to_all_ready_ms"`
	StartToCaughtUpMs int64             `json:"start_to_committed_at_end_ms"`
	StartToSettledMs  int64             `json:"start_to_settled_ms"`
	Owners            map[string]string `json:"owners"`
	Probes            map[string]string `json:"probe_products"`
}

// runOne runs one scenario on a fresh group: topic, preload of every
// product, `initial` instances started and settled, steady events, then body.
// Whatever happens, the producer and every process are stopped, and the
// run's topics, group and state dirs are deleted.
func runOne(ctx context.Context, e *env, sys, scenario, name string, set settings, total, initial int,
	body func(ctx context.Context, c *cluster, res *runResult, probes map[string]string) error) *runResult {
	res := &runResult{System: sys, Scenario: scenario, Name: name, Settings: set, Status: "ok", StartedAt: time.Now()}
	logf("=== run %s: %s (%s) ===", name, sys, set.Label)
	c, err := newCluster(e, sys, name, set, total)
	if err != nil {
		res.Status, res.Error = "failed", err.Error()
		return res
	}
	res.AppID, res.InputTopic = c.app, c.topic
	res.Logs = filepath.Join(c.dir, "logs")
	var pc *kit.Pacer
	defer func() {
		if pc != nil {
			st := pc.Finish()
			res.Producer = &st
			if st.Failed > 0 {
				c.anomaly("steady producer: %d of %d events failed (first: %s)", st.Failed, st.Sent, st.FirstError)
			}
		}
		c.stopAll()
		res.RestoreEvents = c.restoreEvents()
		res.CopyEvents = c.copyEvents()
		res.LogLines = map[string]*logCounts{}
		for _, in := range c.insts {
			in.mu.Lock()
			res.LogLines[in.name] = &logCounts{Errors: in.errs.Count, Warns: in.warnLines, FirstErrors: in.errs.First}
			if in.errs.Count > 0 {
				c.mu.Lock()
				c.anomalies = append(c.anomalies, fmt.Sprintf("%s logged %d error lines, first: %s", in.name, in.errs.Count, in.errs.First[0]))
				c.mu.Unlock()
			}
			in.mu.Unlock()
		}
		c.mu.Lock()
		res.Anomalies = c.anomalies
		c.mu.Unlock()
		kit.DeleteRun(e.adm, c.app, []string{c.app}, logf)
		if !e.o.keepTmp {
			c.removeState()
		}
		res.DurationMs = time.Since(res.StartedAt).Milliseconds()
		if res.Status == "ok" {
			logf("=== run %s done in %.1f s ===", name, float64(res.DurationMs)/1000)
		} else {
			logf("=== run %s FAILED after %.1f s: %s ===", name, float64(res.DurationMs)/1000, kit.FirstLine(res.Error))
		}
	}()

	err = func() error {
		if err := kit.CreateTopic(ctx, e.adm, c.topic, partitions); err != nil {
			return err
		}
		if err := kit.WaitTopic(ctx, e.adm, c.topic, partitions); err != nil {
			return err
		}
		if sys == sysReference {
			// The broker does not auto-create topics; salesagg makes its own.
			if err := kit.CreateTopic(ctx, e.adm, c.app+"-notifications", partitions); err != nil {
				return err
			}
			if e.o.groupProtocol == "streams" {
				if err := c.setStreamsGroup(ctx, e.kc); err != nil {
					return err
				}
			}
		}
		logf("%s: preloading %d products into %s", name, e.o.products, c.topic)
		ends, took, err := preload(ctx, e.addr, c.topic, e.o.products, e.adm)
		if err != nil {
			return err
		}
		pr := &preloadResult{Products: e.o.products, ProduceMs: took.Milliseconds(), Instances: initial}
		res.Preload = pr
		logf("%s: preloaded in %.2f s; end offsets %v", name, took.Seconds(), ends)
		live := c.insts[:initial]
		for _, in := range live {
			if err := c.start(in); err != nil {
				return err
			}
		}
		t0 := live[0].p().Started
		readyAt, err := c.waitReady(ctx, live, e.o.timeout)
		if err != nil {
			return fmt.Errorf("preload: %w", err)
		}
		pr.StartToAllReadyMs = readyAt.Sub(t0).Milliseconds()
		caughtAt, err := c.waitCaughtUp(ctx, ends, live)
		if err != nil {
			return fmt.Errorf("preload: %w", err)
		}
		pr.StartToCaughtUpMs = caughtAt.Sub(t0).Milliseconds()
		settledAt, own, err := c.waitSettled(ctx, live, time.Second)
		if err != nil {
			return fmt.Errorf("preload: %w", err)
		}
		pr.StartToSettledMs = settledAt.Sub(t0).Milliseconds()
		pr.Owners = own
		logf("%s: %d instances ready %.2f s after start, input committed at %.2f s, settled at %.2f s: %v", name, initial,
			readyAt.Sub(t0).Seconds(), caughtAt.Sub(t0).Seconds(), settledAt.Sub(t0).Seconds(), own)
		probes, err := c.chooseProbes(ctx, live[0])
		if err != nil {
			return err
		}
		pr.Probes = probes
		for task, p := range probes {
			if want := fmt.Sprintf("0_%d", sales.Partition([]byte(p), partitions)); want != task {
				c.anomaly("X-Served-By names task %s for %s, but murmur2 mod %d says %s", task, p, partitions, want)
			}
		}
		h := fnv.New64a()
		_, _ = h.Write([]byte(name))
		pc, err = startPacer(e.addr, c.topic, e.o.rate, e.o.products, e.o.seed^h.Sum64())
		if err != nil {
			return err
		}
		logf("%s: producing %d events/s; %s of steady state", name, e.o.rate, e.o.steady)
		if err := kit.Sleep(ctx, e.o.steady); err != nil {
			return err
		}
		if _, _, err := c.waitSettled(ctx, live, 0); err != nil {
			return fmt.Errorf("before the measurement: %w", err)
		}
		return body(ctx, c, res, probes)
	}()
	if err != nil {
		res.Status, res.Error = "failed", err.Error()
	}
	return res
}

// ---------------------------------------------------------------------------
// kill -9

type taskFailover struct {
	Task  string `json:"task"`
	Probe string `json:"probe_product"`
	// From the SIGKILL to the first 200 for Probe from a survivor (any, also
	// a standby), and to the first 200 from an active owner; -1: never.
	FirstAnswerMs  int64  `json:"kill_to_first_200_ms"`
	FirstServedBy  string `json:"first_served_by,omitempty"`
	FirstStandby   bool   `json:"first_from_standby"`
	FirstLag       int64  `json:"first_standby_lag"` // X-Salesagg-Standby-Lag of that answer (-1: none)
	FirstAskedOn   string `json:"first_asked_on,omitempty"`
	ActiveAnswerMs int64  `json:"kill_to_first_200_from_active_ms"`
	ActiveServedBy string `json:"active_served_by,omitempty"`
	Probes         int    `json:"probes"`
	LastAnswer     string `json:"last_non_200,omitempty"`
}

type killResult struct {
	Victim       string            `json:"victim"`
	VictimTasks  []string          `json:"victim_tasks"`
	OwnersBefore map[string]string `json:"owners_before"`
	Tasks        []*taskFailover   `json:"tasks"`
	// Max over the victim's tasks.
	MaxFirstAnswerMs  int64 `json:"max_kill_to_first_200_ms"`
	MaxActiveAnswerMs int64 `json:"max_kill_to_first_200_from_active_ms"`
	// Until every survivor's /readyz is 200 again.
	KillToSurvivorsReadyMs int64             `json:"kill_to_survivors_ready_ms"`
	OwnersAfter            map[string]string `json:"owners_after_failover"`
	// Restore lines read from the kill until the survivors are ready.
	Restored restoreSummary `json:"restored_failover"`
	Restart  *restartResult `json:"restart,omitempty"`
}

type restartResult struct {
	StartToReadyMs   int64    `json:"start_to_ready_ms"`
	StartToServingMs int64    `json:"start_to_serving_ms"`
	ServingTasks     []string `json:"serving_tasks"`
	StartToSettledMs int64    `json:"start_to_settled_ms"`
	// Restores of the restarted instance until it served, and of every
	// instance until the group settled.
	RestoredByRestarted  restoreSummary    `json:"restored_by_restarted_until_serving"`
	RestoredUntilSettled restoreSummary    `json:"restored_until_settled"`
	OwnersAfter          map[string]string `json:"owners_after"`
}

func killScenario(ctx context.Context, c *cluster, res *runResult, probes map[string]string) error {
	o := c.e.o
	kr := &killResult{MaxFirstAnswerMs: -1, MaxActiveAnswerMs: -1}
	res.Kill = kr
	v, err := c.view(ctx, c.insts[0])
	if err != nil {
		return err
	}
	kr.OwnersBefore = owners(v)
	// The victim: the instance owning the most tasks; ties go to the highest
	// index (bench-i2 when each owns one).
	var victim *instance
	count := map[string]int{}
	for _, owner := range kr.OwnersBefore {
		count[owner]++
	}
	for _, in := range c.insts {
		if count[in.name] > 0 && (victim == nil || count[in.name] >= count[victim.name]) {
			victim = in
		}
	}
	if victim == nil {
		return fmt.Errorf("no instance owns a task: %v", kr.OwnersBefore)
	}
	kr.Victim = victim.name
	for _, t := range sortedKeys(kr.OwnersBefore) {
		if kr.OwnersBefore[t] == victim.name {
			kr.VictimTasks = append(kr.VictimTasks, t)
		}
	}
	var survivors []*instance
	for _, in := range c.insts {
		if in != victim {
			survivors = append(survivors, in)
		}
	}
	// Before the kill every survivor answers the victim's products (forwarded).
	if _, err := waitFor(ctx, 15*time.Second, 50*time.Millisecond, "every survivor to answer 200 for the products of "+victim.name+"'s tasks before the kill", func() (bool, string, error) {
		for _, s := range survivors {
			for _, t := range kr.VictimTasks {
				if a := c.ask(ctx, s, probes[t]); a.code != http.StatusOK {
					return false, fmt.Sprintf("%s answered %s for %s (task %s)", s.name, a, probes[t], t), nil
				}
			}
		}
		return true, "", nil
	}); err != nil {
		return err
	}

	logf("%s: kill -9 %s (tasks %v)", c.name, victim.name, kr.VictimTasks)
	killAt, err := c.kill9(victim)
	if err != nil {
		return err
	}
	limit := o.sessionTimeout + o.timeout
	tfs, err := c.awaitAnswers(ctx, survivors, kr.VictimTasks, probes, killAt, limit)
	kr.Tasks = tfs
	for _, tf := range tfs {
		kr.MaxFirstAnswerMs = max(kr.MaxFirstAnswerMs, tf.FirstAnswerMs)
		kr.MaxActiveAnswerMs = max(kr.MaxActiveAnswerMs, tf.ActiveAnswerMs)
		logf("%s: task %s answered again %.2f s after the kill (by %s%s), by an active owner after %.2f s", c.name, tf.Task,
			float64(tf.FirstAnswerMs)/1000, tf.FirstServedBy, map[bool]string{true: ", standby"}[tf.FirstStandby], float64(tf.ActiveAnswerMs)/1000)
	}
	if err != nil {
		return err
	}
	readyAt, err := c.waitReady(ctx, survivors, o.timeout)
	if err != nil {
		return fmt.Errorf("after the kill: %w", err)
	}
	kr.KillToSurvivorsReadyMs = readyAt.Sub(killAt).Milliseconds()
	if v, err := c.view(ctx, survivors[0]); err == nil {
		kr.OwnersAfter = owners(v)
	}
	if err := kit.Sleep(ctx, logGrace); err != nil {
		return err
	}
	kr.Restored = c.restoresBetween(killAt, readyAt.Add(logGrace), "")
	logf("%s: survivors ready %.2f s after the kill; %d records restored (take-over %d)", c.name,
		readyAt.Sub(killAt).Seconds(), kr.Restored.Records, kr.Restored.TakeoverRecords)
	for _, tf := range tfs {
		if tf.ActiveServedBy == victim.name || tf.FirstServedBy == victim.name {
			c.anomaly("task %s answered by the killed instance %s", tf.Task, victim.name)
		}
	}
	if c.sys == sysSalesagg && kr.Restored.Takeovers == 0 && c.set.Standbys == 0 {
		c.anomaly("no 'Took over from' line after the kill (tasks %v moved)", kr.VictimTasks)
	}

	// Restart the victim: same state dir, name and port.
	if err := kit.Sleep(ctx, time.Second); err != nil {
		return err
	}
	rr := &restartResult{StartToServingMs: -1, StartToSettledMs: -1}
	kr.Restart = rr
	logf("%s: restarting %s on its state dir", c.name, victim.name)
	if err := c.start(victim); err != nil {
		return err
	}
	t0 := victim.p().Started
	readyAt, err = c.waitReady(ctx, []*instance{victim}, o.timeout)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	rr.StartToReadyMs = readyAt.Sub(t0).Milliseconds()
	servingAt, tasks, err := c.waitServing(ctx, victim, probes)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	rr.StartToServingMs = servingAt.Sub(t0).Milliseconds()
	rr.ServingTasks = tasks
	settledAt, own, err := c.waitSettled(ctx, c.insts, settleStable)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	rr.StartToSettledMs = max(settledAt.Sub(t0), servingAt.Sub(t0)).Milliseconds()
	rr.OwnersAfter = own
	if err := kit.Sleep(ctx, logGrace); err != nil {
		return err
	}
	rr.RestoredByRestarted = c.restoresBetween(t0, servingAt.Add(logGrace), victim.name)
	rr.RestoredUntilSettled = c.restoresBetween(t0, settledAt.Add(logGrace), "")
	logf("%s: %s ready %.2f s after its restart, serving %v at %.2f s, settled at %.2f s; it restored %d records", c.name, victim.name,
		float64(rr.StartToReadyMs)/1000, tasks, float64(rr.StartToServingMs)/1000, float64(rr.StartToSettledMs)/1000, rr.RestoredByRestarted.Records)
	return nil
}

// awaitAnswers asks every instance of askOn for the probe product of each of
// tasks every --poll, from `after` on, until each task was answered 200 by an
// active owner (X-Served-By without "; standby"), or limit passes.
func (c *cluster) awaitAnswers(ctx context.Context, askOn []*instance, tasks []string, probes map[string]string, after time.Time, limit time.Duration) ([]*taskFailover, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu  sync.Mutex
		tfs []*taskFailover
		wg  sync.WaitGroup
	)
	taskCtx := map[string]context.Context{}
	for _, t := range tasks {
		tf := &taskFailover{Task: t, Probe: probes[t], FirstAnswerMs: -1, ActiveAnswerMs: -1, FirstLag: -1}
		tfs = append(tfs, tf)
		tctx, tcancel := context.WithCancel(ctx)
		defer tcancel()
		taskCtx[t] = tctx
		for _, in := range askOn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for tctx.Err() == nil {
					t0 := time.Now()
					a := c.ask(tctx, in, tf.Probe)
					now := time.Now()
					if tctx.Err() != nil {
						return
					}
					mu.Lock()
					tf.Probes++
					if a.code == http.StatusOK && t0.After(after) {
						if tf.FirstAnswerMs < 0 {
							tf.FirstAnswerMs = now.Sub(after).Milliseconds()
							tf.FirstServedBy, tf.FirstStandby, tf.FirstAskedOn, tf.FirstLag = a.instance, a.standby, in.name, a.lag
						}
						if !a.standby && tf.ActiveAnswerMs < 0 {
							tf.ActiveAnswerMs = now.Sub(after).Milliseconds()
							tf.ActiveServedBy = a.instance
							tcancel()
						}
					} else if a.code != http.StatusOK {
						tf.LastAnswer = in.name + ": " + a.String()
					}
					mu.Unlock()
					select {
					case <-tctx.Done():
						return
					case <-time.After(time.Until(t0.Add(c.e.o.poll))):
					}
				}
			}()
		}
	}
	defer wg.Wait()
	defer cancel()
	for {
		done := true
		for _, t := range tasks {
			if taskCtx[t].Err() == nil {
				done = false
			}
		}
		if done || ctx.Err() != nil {
			break
		}
		if err := alive(askOn); err != nil {
			return tfs, err
		}
		if time.Since(after) > limit {
			mu.Lock()
			defer mu.Unlock()
			var open []string
			for _, tf := range tfs {
				if tf.ActiveAnswerMs < 0 {
					open = append(open, fmt.Sprintf("%s (%s, last %s)", tf.Task, tf.Probe, tf.LastAnswer))
				}
			}
			return tfs, fmt.Errorf("waiting for a 200 from an active owner for tasks %s, asked on %s: not answered within %s of the kill", strings.Join(open, ", "), names(askOn), limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := ctx.Err(); err != nil {
		return tfs, fmt.Errorf("waiting for the tasks to be answered again: %w", context.Cause(ctx))
	}
	return tfs, nil
}

// waitServing waits until the instance is ready, lists tasks of its own in
// its /v1/instances, and answers a probe product of one of them itself.
func (c *cluster) waitServing(ctx context.Context, in *instance, probes map[string]string) (time.Time, []string, error) {
	var tasks []string
	at, err := waitFor(ctx, c.e.o.timeout, 50*time.Millisecond, in.name+" to serve (ready, tasks of its own in /v1/instances, a product of one answered by itself)", func() (bool, string, error) {
		if err := alive([]*instance{in}); err != nil {
			return false, "", err
		}
		if ok, reason := c.ready(ctx, in); !ok {
			return false, "not ready: " + reason, nil
		}
		v, err := c.view(ctx, in)
		if err != nil {
			return false, err.Error(), nil
		}
		tasks = selfTasks(v)
		if len(tasks) == 0 {
			return false, fmt.Sprintf("no task of its own yet (%v)", owners(v)), nil
		}
		a := c.ask(ctx, in, probes[tasks[0]])
		if a.code != http.StatusOK || a.instance != in.name || a.standby {
			return false, fmt.Sprintf("owns %v, but %s answered %s", tasks, probes[tasks[0]], a), nil
		}
		return true, "", nil
	})
	return at, tasks, err
}

// ---------------------------------------------------------------------------
// rolling restart

type rollStep struct {
	Instance       string         `json:"instance"`
	SigtermAtMs    int64          `json:"sigterm_at_ms"` // since the first SIGTERM
	StopMs         int64          `json:"sigterm_to_exit_ms"`
	Killed         bool           `json:"killed_after_stop_timeout"`
	ExitCode       int            `json:"exit_code"`
	ExitSignal     string         `json:"exit_signal,omitempty"`
	StartToReadyMs int64          `json:"start_to_ready_ms"`
	Restored       restoreSummary `json:"restored"` // from its SIGTERM to the next SIGTERM (the last: to settled)
}

type taskGaps struct {
	Task       string `json:"task"`
	Probe      string `json:"probe_product"`
	MaxGapMs   int64  `json:"max_unanswerable_ms"`
	TotalGapMs int64  `json:"total_unanswerable_ms"`
	Gaps       int    `json:"gaps"`
	OpenAtEnd  bool   `json:"unanswerable_at_end"`
	Answered   int    `json:"probes_200"`
	Unanswered int    `json:"probes_other"`
	Standby    int    `json:"probes_200_from_standby"`
	MaxLag     int64  `json:"max_standby_lag"` // largest X-Salesagg-Standby-Lag of those (-1: none)
}

type rollingResult struct {
	OwnersBefore map[string]string `json:"owners_before"`
	OwnersAfter  map[string]string `json:"owners_after"`
	Steps        []*rollStep       `json:"steps"`
	// From the first SIGTERM until the group settled after the last start.
	RollToSettledMs int64          `json:"first_sigterm_to_settled_ms"`
	Tasks           []*taskGaps    `json:"tasks"`
	MaxGapMs        int64          `json:"max_unanswerable_ms"`
	MaxGapTask      string         `json:"max_unanswerable_task,omitempty"`
	TotalGapMs      int64          `json:"total_unanswerable_ms"` // summed over tasks
	Probes          int            `json:"probes"`
	Restored        restoreSummary `json:"restored"`
}

func rollingScenario(ctx context.Context, c *cluster, res *runResult, probes map[string]string) error {
	o := c.e.o
	rr := &rollingResult{}
	res.Rolling = rr
	v, err := c.view(ctx, c.insts[0])
	if err != nil {
		return err
	}
	rr.OwnersBefore = owners(v)
	pr := c.startProber(ctx, c.insts, probes)
	defer pr.stop()
	if err := kit.Sleep(ctx, 500*time.Millisecond); err != nil {
		return err
	}
	rollAt := time.Now()
	var sigAts []time.Time
	for _, in := range c.insts {
		st := &rollStep{Instance: in.name}
		rr.Steps = append(rr.Steps, st)
		p := in.p()
		sigAt := time.Now()
		sigAts = append(sigAts, sigAt)
		st.SigtermAtMs = sigAt.Sub(rollAt).Milliseconds()
		logf("%s: SIGTERM %s", c.name, in.name)
		took, killed := p.Stop(o.stopTimeout)
		st.StopMs, st.Killed = took.Milliseconds(), killed
		st.ExitCode, st.ExitSignal, _ = p.ExitInfo()
		if killed {
			c.anomaly("%s: no exit within %s of SIGTERM; killed", in.name, o.stopTimeout)
		} else if !c.exitOK(st.ExitCode) {
			c.anomaly("%s: exit code %d%s after SIGTERM", in.name, st.ExitCode, sigText(st.ExitSignal))
		}
		if err := c.start(in); err != nil {
			return err
		}
		t0 := in.p().Started
		readyAt, err := c.waitReady(ctx, []*instance{in}, o.timeout)
		if err != nil {
			return fmt.Errorf("rolling restart of %s: %w", in.name, err)
		}
		st.StartToReadyMs = readyAt.Sub(t0).Milliseconds()
		logf("%s: %s exited %.2f s after SIGTERM, ready %.2f s after its start", c.name, in.name, took.Seconds(), readyAt.Sub(t0).Seconds())
	}
	settledAt, own, err := c.waitSettled(ctx, c.insts, settleStable)
	if err != nil {
		return fmt.Errorf("after the rolling restart: %w", err)
	}
	rr.OwnersAfter = own
	rr.RollToSettledMs = settledAt.Sub(rollAt).Milliseconds()
	end := time.Now()
	samples := pr.stop()
	rr.Tasks = computeGaps(samples, c.insts, probes, end)
	rr.MaxGapMs = -1
	for _, tg := range rr.Tasks {
		rr.TotalGapMs += tg.TotalGapMs
		rr.Probes += tg.Answered + tg.Unanswered
		if tg.MaxGapMs > rr.MaxGapMs {
			rr.MaxGapMs, rr.MaxGapTask = tg.MaxGapMs, tg.Task
		}
		if tg.OpenAtEnd {
			c.anomaly("task %s was still unanswerable at every instance when the group had settled", tg.Task)
		}
	}
	if err := kit.Sleep(ctx, logGrace); err != nil {
		return err
	}
	for i, st := range rr.Steps {
		to := settledAt.Add(logGrace)
		if i+1 < len(sigAts) {
			to = sigAts[i+1]
		}
		st.Restored = c.restoresBetween(sigAts[i], to, "")
	}
	rr.Restored = c.restoresBetween(rollAt, settledAt.Add(logGrace), "")
	logf("%s: rolling restart settled %.2f s after the first SIGTERM; longest a task was unanswerable everywhere: %.2f s (%s); %d records restored",
		c.name, float64(rr.RollToSettledMs)/1000, float64(rr.MaxGapMs)/1000, rr.MaxGapTask, rr.Restored.Records)
	return nil
}

// prober asks every instance for the probe product of every task, each pair
// every --poll, and keeps each answer.
type prober struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at      time.Time // when the answer (or error) came
	inst    string
	task    string
	ok      bool // 200
	standby bool
	lag     int64
}

func (c *cluster) startProber(ctx context.Context, ins []*instance, probes map[string]string) *prober {
	ctx, cancel := context.WithCancel(ctx)
	pr := &prober{cancel: cancel}
	for _, in := range ins {
		for task, product := range probes {
			pr.wg.Add(1)
			go func() {
				defer pr.wg.Done()
				for ctx.Err() == nil {
					t0 := time.Now()
					a := c.ask(ctx, in, product)
					if ctx.Err() != nil {
						return
					}
					pr.mu.Lock()
					pr.samples = append(pr.samples, sample{at: time.Now(), inst: in.name, task: task, ok: a.code == http.StatusOK, standby: a.standby, lag: a.lag})
					pr.mu.Unlock()
					select {
					case <-ctx.Done():
						return
					case <-time.After(time.Until(t0.Add(c.e.o.poll))):
					}
				}
			}()
		}
	}
	return pr
}

// stop ends the probing and returns the samples in time order.
func (pr *prober) stop() []sample {
	pr.once.Do(func() {
		pr.cancel()
		pr.wg.Wait()
	})
	pr.mu.Lock()
	defer pr.mu.Unlock()
	out := append([]sample(nil), pr.samples...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// computeGaps finds, per task, the stretches in which every instance's latest
// answer was not a 200: from the answer that made the last instance fail to
// the next 200 from any instance (or end).
func computeGaps(samples []sample, ins []*instance, probes map[string]string, end time.Time) []*taskGaps {
	var out []*taskGaps
	for _, task := range sortedKeys(probes) {
		tg := &taskGaps{Task: task, Probe: probes[task], MaxLag: -1}
		okNow := map[string]bool{}
		for _, in := range ins {
			okNow[in.name] = true // every instance answered before the measurement
		}
		var gapFrom time.Time
		anyOK := func() bool {
			for _, ok := range okNow {
				if ok {
					return true
				}
			}
			return false
		}
		closeGap := func(at time.Time) {
			d := at.Sub(gapFrom).Milliseconds()
			tg.Gaps++
			tg.TotalGapMs += d
			tg.MaxGapMs = max(tg.MaxGapMs, d)
			gapFrom = time.Time{}
		}
		for _, s := range samples {
			if s.task != task {
				continue
			}
			if s.ok {
				tg.Answered++
				if s.standby {
					tg.Standby++
					tg.MaxLag = max(tg.MaxLag, s.lag)
				}
			} else {
				tg.Unanswered++
			}
			okNow[s.inst] = s.ok
			switch {
			case gapFrom.IsZero() && !anyOK():
				gapFrom = s.at
			case !gapFrom.IsZero() && anyOK():
				closeGap(s.at)
			}
		}
		if !gapFrom.IsZero() {
			tg.OpenAtEnd = true
			closeGap(end)
		}
		out = append(out, tg)
	}
	return out
}

// ---------------------------------------------------------------------------
// scale 2 → 3

type scaleResult struct {
	NewInstance  string            `json:"new_instance"`
	OwnersBefore map[string]string `json:"owners_before"`
	OwnersAfter  map[string]string `json:"owners_after"`
	// Since the new instance's start.
	StartToReadyMs   int64    `json:"start_to_ready_ms"`
	StartToServingMs int64    `json:"start_to_serving_ms"` // ready and tasks of its own in its /v1/instances
	ServingTasks     []string `json:"serving_tasks"`
	StartToSettledMs int64    `json:"start_to_settled_ms"`
	// Restores of every instance from the new one's start until it served,
	// and until the group settled.
	RestoredBeforeServing restoreSummary `json:"restored_before_serving"`
	RestoredUntilSettled  restoreSummary `json:"restored_until_settled"`
	// Product availability meanwhile (as in the rolling restart).
	MaxGapMs   int64       `json:"max_unanswerable_ms"`
	MaxGapTask string      `json:"max_unanswerable_task,omitempty"`
	Tasks      []*taskGaps `json:"tasks"`
}

func scaleScenario(ctx context.Context, c *cluster, res *runResult, probes map[string]string) error {
	o := c.e.o
	sr := &scaleResult{StartToServingMs: -1, StartToSettledMs: -1, MaxGapMs: -1}
	res.Scale = sr
	newIn := c.insts[len(c.insts)-1]
	sr.NewInstance = newIn.name
	old := c.insts[:len(c.insts)-1]
	v, err := c.view(ctx, old[0])
	if err != nil {
		return err
	}
	sr.OwnersBefore = owners(v)
	pr := c.startProber(ctx, old, probes)
	defer pr.stop()
	if err := kit.Sleep(ctx, 500*time.Millisecond); err != nil {
		return err
	}
	logf("%s: starting %s (scale %d → %d)", c.name, newIn.name, len(old), len(c.insts))
	if err := c.start(newIn); err != nil {
		return err
	}
	t0 := newIn.p().Started
	readyAt, err := c.waitReady(ctx, []*instance{newIn}, o.timeout)
	if err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	sr.StartToReadyMs = readyAt.Sub(t0).Milliseconds()
	servingAt, err := waitFor(ctx, o.timeout, 50*time.Millisecond, newIn.name+" to serve (/readyz 200 and tasks of its own in its /v1/instances)", func() (bool, string, error) {
		if err := alive(c.insts); err != nil {
			return false, "", err
		}
		if ok, reason := c.ready(ctx, newIn); !ok {
			return false, "not ready: " + reason, nil
		}
		v, err := c.view(ctx, newIn)
		if err != nil {
			return false, err.Error(), nil
		}
		sr.ServingTasks = selfTasks(v)
		return len(sr.ServingTasks) > 0, fmt.Sprintf("no task of its own yet (%v)", owners(v)), nil
	})
	if err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	sr.StartToServingMs = servingAt.Sub(t0).Milliseconds()
	settledAt, own, err := c.waitSettled(ctx, c.insts, settleStable)
	if err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	sr.OwnersAfter = own
	sr.StartToSettledMs = max(settledAt.Sub(t0), servingAt.Sub(t0)).Milliseconds()
	end := time.Now()
	sr.Tasks = computeGaps(pr.stop(), old, probes, end)
	for _, tg := range sr.Tasks {
		if tg.MaxGapMs > sr.MaxGapMs {
			sr.MaxGapMs, sr.MaxGapTask = tg.MaxGapMs, tg.Task
		}
	}
	if err := kit.Sleep(ctx, logGrace); err != nil {
		return err
	}
	sr.RestoredBeforeServing = c.restoresBetween(t0, servingAt.Add(logGrace), "")
	sr.RestoredUntilSettled = c.restoresBetween(t0, settledAt.Add(logGrace), "")
	logf("%s: %s ready %.2f s after its start, serving %v at %.2f s (%d records restored by then), settled at %.2f s (%d records)", c.name, newIn.name,
		readyAt.Sub(t0).Seconds(), sr.ServingTasks, servingAt.Sub(t0).Seconds(), sr.RestoredBeforeServing.Records,
		float64(sr.StartToSettledMs)/1000, sr.RestoredUntilSettled.Records)
	return nil
}

// ---------------------------------------------------------------------------
// The runs of each scenario.

type runSpec struct {
	sys            string
	scenario, name string
	set            settings
	total, initial int
	body           func(ctx context.Context, c *cluster, res *runResult, probes map[string]string) error
}

// specs lists the runs: every scenario's settings, each once per system (in
// the order of systems), the reference's named <run>-ref.
func specs(scenarios, systems []string) []runSpec {
	var out []runSpec
	for _, sp := range scenarioSpecs(scenarios) {
		for _, sys := range systems {
			s := sp
			s.sys = sys
			if sys == sysReference {
				s.name += "-ref"
			}
			out = append(out, s)
		}
	}
	return out
}

func scenarioSpecs(scenarios []string) []runSpec {
	var out []runSpec
	for _, sc := range scenarios {
		switch sc {
		case scKill:
			for _, sb := range []int{0, 1} {
				out = append(out, runSpec{"", scKill, fmt.Sprintf("kill-s%d", sb),
					settings{Standbys: sb, LeaveGroupOnClose: true, Label: fmt.Sprintf("num.standby.replicas=%d", sb)},
					instances, instances, killScenario})
			}
		case scRolling:
			for _, sb := range []int{0, 1} {
				for _, leave := range []bool{true, false} {
					out = append(out, runSpec{"", scRolling, fmt.Sprintf("rolling-s%d-%s", sb, map[bool]string{true: "leave", false: "stay"}[leave]),
						settings{Standbys: sb, LeaveGroupOnClose: leave, Label: fmt.Sprintf("num.standby.replicas=%d leave.group.on.close=%t", sb, leave)},
						instances, instances, rollingScenario})
				}
			}
		case scScale:
			out = append(out,
				runSpec{"", scScale, "scale-default", settings{LeaveGroupOnClose: true, Label: "defaults (max.warmup.replicas=2, acceptable.recovery.lag=10000)"},
					instances, instances - 1, scaleScenario},
				runSpec{"", scScale, "scale-warmup1", settings{LeaveGroupOnClose: true, MaxWarmupReplicas: 1, Label: "max.warmup.replicas=1"},
					instances, instances - 1, scaleScenario})
		}
	}
	return out
}
