package stream

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"
)

// The periodic summary.
//
// Every log.summary.interval.ms (default 2 minutes, as Kafka Streams) the
// runtime logs at INFO what it did since the last summary, in Kafka
// Streams' words so that runbooks and greps keep working:
//
//	Processed 1500000 total records, ran 0 punctuators, and committed 412 total tasks since the last update
//
// with the fields records, rate (records a second over the interval),
// committed_tasks, lag (the input records of this member's tasks not
// processed yet, as salesagg_input_lag_records) and interval. Records are
// those taken from the input and repartition topics, whatever became of
// them (folded, forwarded, skipped); a committed task is a task's commit
// cycle that wrote its store (Kafka Streams counts the tasks each commit
// commits). There are no punctuators.
//
// An interval that read nothing while the lag is 0 logs nothing: an idle
// service would otherwise repeat the same line every interval on every
// instance, and its liveness is what /healthz and the metrics are for. An
// interval with lag and nothing read still logs: a member that is behind
// and makes no progress is what an operator tails the log for. Commits of
// unlogged intervals count in the next line.

// summaryState is what the last summary logged, owned by the summary
// goroutine.
type summaryState struct {
	records, commits int64
	at               time.Time
}

// runSummary logs the summary every interval until done is closed.
func (rt *Runtime) runSummary(every time.Duration, done <-chan struct{}) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	s := summaryState{at: time.Now()}
	for {
		select {
		case <-done:
			return
		case now := <-ticker.C:
			logged := rt.summarize(&s, now)
			if rt.env.knobs.AfterSummary != nil {
				rt.env.knobs.AfterSummary(logged)
			}
		}
	}
}

// summarize logs the interval ending at now, unless it was idle, and
// reports whether it logged.
func (rt *Runtime) summarize(s *summaryState, now time.Time) bool {
	m := rt.env.metrics
	records, commits := m.records.Load(), m.taskCommits.Load()
	var lag int64
	for _, t := range rt.reg.tasks() {
		lag += t.inputLag()
	}
	n, elapsed := records-s.records, now.Sub(s.at)
	s.at = now
	if n == 0 && lag == 0 {
		return false
	}
	k := commits - s.commits
	s.records, s.commits = records, commits
	rate := math.Round(float64(n)/max(elapsed.Seconds(), 1e-9)*10) / 10
	rt.env.log.Info(fmt.Sprintf("Processed %d total records, ran 0 punctuators, and committed %d total tasks since the last update", n, k),
		zap.Int64("records", n), zap.Float64("rate", rate), zap.Int64("committed_tasks", k), zap.Int64("lag", lag),
		zap.Duration("interval", elapsed))
	return true
}
