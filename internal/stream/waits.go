package stream

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Waiting on Kafka.
//
// While a broker fails over, the client keeps retrying: a fetch answers
// NOT_LEADER_OR_FOLLOWER until a new leader is elected, a join answers
// NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE until the group's
// coordinator has moved, a heartbeat goes unanswered. Each such condition
// is logged once when it begins, with what the service waits for, and once
// when Kafka answers again, with how long it took and how many attempts
// failed; meanwhile it shows in /readyz and in /v1/tasks. None of them is
// fatal: the client retries for as long as it takes.

// kafkaWaits is what the process waits on Kafka for. It is fed by the poll
// loop (fetch errors), the lease loop (heartbeats) and the assignment, and
// read by the status endpoints. A nil one records nothing (an env a test
// made by hand).
type kafkaWaits struct {
	log *zap.Logger
	now func() time.Time

	mu sync.Mutex // guards m and every *kafkaWait in it
	// m holds the open waits by key: "group", or "fetch <topic>-<p>".
	m map[string]*kafkaWait
}

// kafkaWait is one open wait; guarded by its kafkaWaits' mu.
type kafkaWait struct {
	what      string
	partition int32 // the task it holds back, -1: every task
	err       string
	since     time.Time
	failures  int
}

func newKafkaWaits(log *zap.Logger) *kafkaWaits {
	return &kafkaWaits{log: log, now: time.Now, m: map[string]*kafkaWait{}}
}

// groupWait is the key of the wait for the group coordinator.
const groupWait = "group"

// fetchWait is the key of the wait for a partition's fetches.
func fetchWait(topic string, p int32) string { return fmt.Sprintf("fetch %s-%d", topic, p) }

// failed records one failed attempt at key. The first one of a run logs
// what the process waits for; the others are counted.
func (w *kafkaWaits) failed(key, what string, partition int32, err error) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cur, ok := w.m[key]; ok {
		cur.failures++
		cur.err = err.Error()
		return
	}
	w.m[key] = &kafkaWait{what: what, partition: partition, err: err.Error(), since: w.now(), failures: 1}
	w.log.Warn("Waiting for Kafka: "+what+"; retrying until it answers", zap.String("wait", key), zap.Error(err))
}

// answered closes the wait at key, if open, with a line saying how long it
// lasted.
func (w *kafkaWaits) answered(key string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cur, ok := w.m[key]
	if !ok {
		return
	}
	delete(w.m, key)
	w.log.Info("Kafka answered again: "+cur.what,
		zap.String("wait", key), zap.Duration("waited", w.now().Sub(cur.since).Round(time.Millisecond)),
		zap.Int("failed_attempts", cur.failures), zap.String("last_error", cur.err))
}

// answeredPartitions closes the fetch waits of topic's partitions in ps.
func (w *kafkaWaits) answeredPartitions(topic string, ps map[int32]bool) {
	for p := range ps {
		w.answered(fetchWait(topic, p))
	}
}

// forPartition says what task p waits on Kafka for ("" when nothing): its
// own partitions' fetches and the group coordinator.
func (w *kafkaWaits) forPartition(p int32) string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, cur := range w.m {
		if cur.partition == p || cur.partition < 0 {
			out = append(out, cur.describe())
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// summary says everything the process waits on Kafka for, "" when nothing.
func (w *kafkaWaits) summary() string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, cur := range w.m {
		out = append(out, cur.describe())
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

func (k *kafkaWait) describe() string {
	return fmt.Sprintf("%s, since %s, %d failed attempts (%s)",
		k.what, k.since.UTC().Format("15:04:05Z"), k.failures, k.err)
}
