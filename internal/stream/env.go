package stream

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

// env is what every part of the runtime shares for the life of the
// process: the configuration, the log, the state dir, the test hooks, the
// instruments, the block cache and the Kafka connection settings. It is made
// by Run before any session starts and not changed after; every field is
// read-only once set (the counters are atomic).
type env struct {
	cfg   config.Config
	log   *zap.Logger
	dir   *state.Dir
	knobs Knobs
	// eos is processing.guarantee=exactly_once_v2.
	eos bool
	// instanceID is the static group membership id.
	instanceID string
	metrics    *instruments
	// badEvents counts the bad events of every task since start.
	badEvents atomic.Int64
	// blockCache is the Pebble block cache of every store opened for
	// writing (nil before Run: each store then has its own).
	blockCache *state.BlockCache
	// bulkBudget is the memory the bulk loads of full restores share (nil
	// before Run: each load then has its own).
	bulkBudget *state.BulkBudget
	// secOpts are the TLS and SASL client options.
	secOpts []kgo.Opt
	// admin is the client for metadata, offsets and group requests, and
	// client the Kafka client under it (for requests kadm does not make).
	admin  *kadm.Client
	client *kgo.Client
	// kafkaDown is set while a transaction cannot be ended for want of
	// Kafka; the process is then not ready.
	kafkaDown atomic.Bool
	// reach is what every client's connect hook says of the brokers.
	reach *reachability
	// waits is what the process waits on Kafka for (waits.go).
	waits *kafkaWaits
	// names are the topic names derived from cfg, built once (once guards
	// them) for producedKind.
	names struct {
		once                   sync.Once
		changelog, repartition string
	}
	// kafkaLog limits the repeats of franz-go's warnings (quietDials).
	kafkaLog *logRepeats
}

// kafkaOpts are the options of every client the runtime makes: the brokers,
// the client id, the log, security.
func (e *env) kafkaOpts() []kgo.Opt {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(e.cfg.BootstrapServers...),
		kgo.ClientID(e.cfg.ApplicationID + "-" + e.dir.ProcessID()),
		kgo.WithLogger(quietDials{kzap.New(e.log.Named("kafka"), kzap.LevelFn(func() kgo.LogLevel {
			// franz-go logs one level below ours: its info is our debug.
			if e.log.Core().Enabled(zapcore.DebugLevel) {
				return kgo.LogLevelInfo
			}
			return kgo.LogLevelWarn
		})), e.kafkaLog}),
		kgo.WithHooks(e.reach),
	}, e.secOpts...)
	if e.knobs.Dial != nil {
		opts = append(opts, kgo.Dialer(e.knobs.Dial))
	}
	return opts
}

// crashPoint calls the test hook at a named point of a commit cycle.
func (e *env) crashPoint(name string) {
	if e.knobs.CrashPoint != nil {
		e.knobs.CrashPoint(name)
	}
}

// checkWritable tells whether partition's store can take a write.
func (e *env) checkWritable(partition int32) error {
	if e.knobs.StoreWritable != nil {
		return e.knobs.StoreWritable(partition)
	}
	return e.dir.CheckWritable(partition)
}

// storeOptions are the options of the stores opened for writing: they
// share the block cache.
func (e *env) storeOptions() state.OpenOptions {
	return state.OpenOptions{BlockCache: e.blockCache}
}

// topicsOf names the input and repartition partitions of tasks ps.
func (e *env) topicsOf(ps []int32) map[string][]int32 {
	return map[string][]int32{e.cfg.InputTopic: ps, e.cfg.RepartitionTopic(): ps}
}

// producedKind tells what a produced record was, from its topic. It runs
// for every record acknowledged, so the derived topic names are built once
// (building them took 7 % of the bytes allocated at 1M products).
func (e *env) producedKind(topic string) int {
	e.names.once.Do(func() { e.names.changelog, e.names.repartition = e.cfg.ChangelogTopic(), e.cfg.RepartitionTopic() })
	switch topic {
	case e.names.changelog:
		return producedChangelog
	case e.cfg.NotificationTopic:
		return producedNotification
	case e.names.repartition:
		return producedRepartition
	}
	if topic != e.cfg.DLQTopic && sales.IsChangelogTopic(topic) {
		return producedChangelog // a window changelog
	}
	return producedDeadLetter
}

// cacheBytesPerTask is each task's share of cache.max.bytes.
func (e *env) cacheBytesPerTask(partitions int32) int64 {
	return e.cfg.CacheMaxBytes / int64(max(1, partitions))
}

// openStore opens task p's store, quarantining it and opening an empty one
// when it is corrupted.
func (e *env) openStore(p int32, log *zap.Logger) (*state.Store, error) {
	store, err := state.Open(e.dir.TaskPath(p), log, e.storeOptions())
	if state.IsCorrupt(err) {
		store, err = e.quarantine(p, log, err)
	}
	return store, err
}

// quarantine moves task p's corrupted store aside, with a warning naming
// where, and opens an empty one in its place. The store must be closed.
func (e *env) quarantine(p int32, log *zap.Logger, cause error) (*state.Store, error) {
	to, err := e.dir.Quarantine(p)
	if err != nil {
		return nil, errors.Join(cause, err)
	}
	log.Warn(fmt.Sprintf("task [%s] Store is corrupted; moved it to %s and restoring it from the changelog", state.TaskName(p), to),
		zap.String("quarantined_to", to), zap.Error(cause))
	return state.Open(e.dir.TaskPath(p), log, e.storeOptions())
}
