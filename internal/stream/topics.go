package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/config"
)

// topology is what the runtime learned about its topics at start.
type topology struct {
	partitions             int32    // of the input, changelog and repartition topics
	notificationPartitions int32    // of the notification topic
	dlqPartitions          int32    // of the dead-letter topic, 0 when off
	changelogID            [16]byte // the changelog topic's id
	inputID                [16]byte // the input topic's id: per-product offsets refer to it
	repartitionID          [16]byte // the repartition topic's id
	// windowIDs are the ids of the window changelogs, one per size in
	// cfg.WindowSizes' order.
	windowIDs [][16]byte
}

// topicInfo is what ensure learns of one topic.
type topicInfo struct {
	id         [16]byte
	partitions int32
}

// ensureTopics creates the topics that are missing (the input topic when
// topics.input.create is on, the others when topics.create is) and checks the
// internal ones against the input: the changelog and the repartition topic
// must have as many partitions as the input, or a task would read another
// partition's state.
func ensureTopics(ctx context.Context, adm *kadm.Client, cfg config.Config, log *zap.Logger) (topology, error) {
	var topo topology
	input, err := ensureInput(ctx, adm, cfg, log)
	if err != nil {
		return topo, err
	}
	topo.partitions = input.partitions
	topo.inputID = input.id

	compact := "compact"
	internal := []struct {
		name    string
		configs map[string]*string
	}{
		{cfg.ChangelogTopic(), map[string]*string{"cleanup.policy": &compact}},
		{cfg.RepartitionTopic(), repartitionConfigs(cfg)},
	}
	// A window changelog is compacted only: expired windows are
	// tombstoned (see windowAgg.expire), so that no window still kept is
	// deleted by the broker's time retention, which goes by record
	// timestamps (event times) and would drop the windows of replayed
	// history while the store still holds them.
	for _, size := range cfg.WindowSizes() {
		internal = append(internal, struct {
			name    string
			configs map[string]*string
		}{cfg.WindowChangelogTopic(size), map[string]*string{"cleanup.policy": &compact}})
	}
	for _, it := range internal {
		info, err := ensure(ctx, adm, cfg, log, it.name, topo.partitions, it.configs)
		if err != nil {
			return topo, err
		}
		if info.partitions != topo.partitions {
			return topo, fmt.Errorf("topic %s has %d partitions but input topic %s has %d: they must match (each task reads the same partition of both); delete it or recreate it with %d",
				it.name, info.partitions, cfg.InputTopic, topo.partitions, topo.partitions)
		}
		switch it.name {
		case cfg.ChangelogTopic():
			topo.changelogID = info.id
		case cfg.RepartitionTopic():
			topo.repartitionID = info.id
		}
		for _, size := range cfg.WindowSizes() {
			if it.name == cfg.WindowChangelogTopic(size) {
				topo.windowIDs = append(topo.windowIDs, info.id)
			}
		}
	}

	notif, err := ensure(ctx, adm, cfg, log, cfg.NotificationTopic, topo.partitions, nil)
	if err != nil {
		return topo, err
	}
	topo.notificationPartitions = notif.partitions
	if cfg.DLQTopic != "" {
		dlq, err := ensure(ctx, adm, cfg, log, cfg.DLQTopic, topo.partitions, nil)
		if err != nil {
			return topo, err
		}
		topo.dlqPartitions = dlq.partitions
	}
	return topo, nil
}

// repartitionConfigs are the configs the repartition topic is created
// with: the broker's defaults under group.protocol classic; under streams
// Kafka Streams' (as its topology describes them, streamsTopology), so the
// topic is the same whichever member of a shared group creates it: its
// records are kept until an instance that committed them deletes them
// (repartition.purge.interval.ms), never by time, so a task far behind
// loses nothing forwarded to it.
func repartitionConfigs(cfg config.Config) map[string]*string {
	if !cfg.ForwardsAmounts() {
		return nil
	}
	out := map[string]*string{}
	for i := 0; i+1 < len(streamsRepartitionConfigs); i += 2 {
		out[streamsRepartitionConfigs[i]] = &streamsRepartitionConfigs[i+1]
	}
	return out
}

// errUnfoldedForwards stops a start under group.protocol streams while the
// repartition topic salesagg forwarded through under streams before it took
// Kafka Streams' topology holds events its group has not folded.
var errUnfoldedForwards = errors.New("unfolded forwarded events")

// checkEarlierRepartition looks for <application.id>-<store.name>-repartition,
// the topic an earlier salesagg forwarded through under group.protocol
// streams (this one forwards through Kafka Streams'
// <application.id>-EMPTY_KEY_BY_PRODUCT-repartition). Events forwarded in the
// last cycle before its instances stopped may still be in it, past the
// group's committed offsets, and nothing here reads them: the start stops
// naming where the first of them is and what to do, rather than lose them.
// Once none is left, its records are deleted (so that a later start, after
// the group's offsets of a topic it no longer commits expired, finds
// nothing to ask about) and it is named in the log as safe to delete.
// Missing or empty, it is nothing.
func checkEarlierRepartition(ctx context.Context, e *env) error {
	earlier := e.cfg
	earlier.GroupProtocol = config.GroupProtocolClassic
	topic := earlier.RepartitionTopic()
	starts, err := e.admin.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return nil
	case err != nil:
		return fmt.Errorf("reading the start of %s: %w", topic, err)
	case len(starts[topic]) == 0:
		return nil
	}
	// Committed records only: what a transaction aborted is nothing.
	ends, err := e.admin.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("reading the end of %s: %w", topic, err)
	}
	committed, err := e.admin.FetchOffsetsForTopics(ctx, e.cfg.ApplicationID, topic)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return fmt.Errorf("reading group %s's offsets of %s: %w", e.cfg.ApplicationID, topic, err)
	}
	var waiting []string
	purge := kadm.Offsets{}
	for p, end := range ends[topic] {
		from := int64(0)
		if st, ok := starts.Lookup(topic, p); ok {
			from = st.Offset
		}
		if end.Offset <= from {
			continue
		}
		purge.Add(kadm.Offset{Topic: topic, Partition: p, At: end.Offset, LeaderEpoch: -1})
		if c, ok := committed.Lookup(topic, p); ok && c.At > from {
			from = c.At
		}
		at, err := firstRecord(ctx, e, topic, p, from, end.Offset)
		if err != nil {
			return err
		}
		if at >= 0 {
			waiting = append(waiting, fmt.Sprintf("%d from offset %d", p, at))
		}
	}
	if len(waiting) > 0 {
		slices.Sort(waiting)
		return fmt.Errorf("%w: group.protocol is streams, and %s, the repartition topic salesagg forwarded through under streams before it took Kafka Streams' topology, holds events past group %s's committed offsets (partition %s); this version reads %s instead. Start the earlier version again with the input's producers paused until kafka-consumer-groups shows lag 0 on %s, then this one; or delete %s to drop them",
			errUnfoldedForwards, topic, e.cfg.ApplicationID, strings.Join(waiting, ", partition "), e.cfg.RepartitionTopic(), topic, topic)
	}
	if len(purge) > 0 {
		deleted, err := e.admin.DeleteRecords(ctx, purge)
		if err == nil {
			err = deleted.Error()
		}
		if err != nil {
			return fmt.Errorf("deleting the folded records of %s: %w", topic, err)
		}
	}
	e.log.Info("The repartition topic of an earlier version is drained: nothing reads it any more, it can be deleted",
		zap.String("topic", topic), zap.String("now", e.cfg.RepartitionTopic()))
	return nil
}

// firstRecord returns the offset of the first committed record of topic's
// partition p in [from, end), -1 when there is none (markers, aborted
// records).
func firstRecord(ctx context.Context, e *env, topic string, p int32, from, end int64) (int64, error) {
	r, err := changelog.Open(changelog.Options{Client: e.kafkaOpts(), Topic: topic, Partition: p, From: from, Log: e.log})
	if err != nil {
		return -1, err
	}
	defer r.Close()
	for r.Position() < end {
		b, err := r.Next(ctx)
		if err != nil {
			return -1, fmt.Errorf("reading %s-%d up to offset %d: %w", topic, p, end, err)
		}
		for _, rec := range b.Records {
			if rec.Offset < end {
				return rec.Offset, nil
			}
		}
	}
	return -1, nil
}

// ensureInput returns the input topic's id and partition count. A missing
// input topic is created only when topics.input.create is on: otherwise it
// is an error (not retried) naming the nearest existing topic, as Kafka
// Streams refuses a missing source topic, rather than a mistyped
// input.topic created empty and waited on forever.
func ensureInput(ctx context.Context, adm *kadm.Client, cfg config.Config, log *zap.Logger) (topicInfo, error) {
	create := cfg
	create.TopicsCreate = cfg.TopicsCreateInput
	info, err := ensure(ctx, adm, create, log, cfg.InputTopic, cfg.TopicsPartitions, nil)
	// A topic just created reaches the brokers' metadata one by one: the
	// broker asked may not know it yet while another does. Ask again, for
	// inputListedWait while the cluster lists it, inputMissingWait else.
	var names []string
	start, backoff := time.Now(), 100*time.Millisecond
	for errors.Is(err, errTopicMissing) {
		names = nil
		if listed, lerr := adm.ListTopics(ctx); lerr == nil {
			names = listed.Names()
		}
		wait := inputMissingWait
		if slices.Contains(names, cfg.InputTopic) {
			wait = inputListedWait
		}
		if time.Since(start) >= wait {
			break
		}
		select {
		case <-ctx.Done():
			return topicInfo{}, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
		info, err = ensure(ctx, adm, create, log, cfg.InputTopic, cfg.TopicsPartitions, nil)
	}
	if !errors.Is(err, errTopicMissing) {
		return info, err
	}
	if slices.Contains(names, cfg.InputTopic) {
		return topicInfo{}, fmt.Errorf("input topic %s is listed by the cluster at %s but its partitions were not found for %s: is it being created or deleted?",
			cfg.InputTopic, strings.Join(cfg.BootstrapServers, ","), inputListedWait)
	}
	return topicInfo{}, fmt.Errorf("input topic %s does not exist at %s%s; salesagg creates its input topic only when topics.input.create is true: fix input.topic, create the topic, or set topics.input.create",
		cfg.InputTopic, strings.Join(cfg.BootstrapServers, ","), MissingTopicHint(cfg.InputTopic, names))
}

// How long a missing input topic is asked for again: while the cluster
// lists it (its creation is still reaching the brokers), and while it does
// not (it may be created this very moment).
const (
	inputListedWait  = 30 * time.Second
	inputMissingWait = 2 * time.Second
)

// errTopicMissing is ensure's error for a missing topic it is not to create.
var errTopicMissing = errors.New("stream: topic does not exist")

// MissingTopicHint is the hint for a topic that does not exist, from the
// topics the broker has (Kafka's internal __ topics are left out): ": did
// you mean X?" when one is near (a typo), else those there are (up to 10),
// or that there are none.
func MissingTopicHint(topic string, names []string) string {
	var user []string
	for _, n := range names {
		if !strings.HasPrefix(n, "__") {
			user = append(user, n)
		}
	}
	slices.Sort(user)
	switch s := config.Suggest(topic, user); {
	case s != "":
		return ": did you mean " + s + "?"
	case len(user) == 0:
		return " (the broker has no topics yet)"
	case len(user) > 10:
		return fmt.Sprintf(" (it has %d topics: %s, ...)", len(user), strings.Join(user[:10], ", "))
	default:
		return " (its topics: " + strings.Join(user, ", ") + ")"
	}
}

// Waiting for a topic created here, or by another client meanwhile, to be
// described with its partitions led: describeFresh tries up to
// alreadyExistsAttempts times, backing off from
// alreadyExistsBackoff, doubling up to alreadyExistsMaxBackoff (about 1.4 s
// in all). On KRaft the controller answers TOPIC_ALREADY_EXISTS as soon as it
// knows the topic, and the broker's metadata has it some milliseconds later
// (up to about 100 ms measured on a one-node Apache Kafka 4.4); past the
// bound, ensure fails with a retriable error and prepareTopics starts over.
const (
	alreadyExistsAttempts   = 30
	alreadyExistsBackoff    = 10 * time.Millisecond
	alreadyExistsMaxBackoff = 50 * time.Millisecond
)

// ensure returns a topic's id and partition count, creating it (when
// topics.create is on) with the given partitions and configs if missing.
func ensure(ctx context.Context, adm *kadm.Client, cfg config.Config, log *zap.Logger, topic string, partitions int32, configs map[string]*string) (topicInfo, error) {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return topicInfo{}, fmt.Errorf("describing topic %s: %w", topic, err)
	}
	if d, ok := md.Topics[topic]; ok && d.Err == nil && len(d.Partitions) > 0 {
		return topicInfo{id: d.ID, partitions: int32(len(d.Partitions))}, nil
	} else if ok && d.Err != nil && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return topicInfo{}, fmt.Errorf("describing topic %s: %w", topic, d.Err)
	}
	if !cfg.TopicsCreate {
		return topicInfo{}, fmt.Errorf("topic %s does not exist and topics.create is false: create it with %d partitions: %w", topic, partitions, errTopicMissing)
	}
	resp, err := adm.CreateTopic(ctx, partitions, cfg.ReplicationFactor, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if errors.Is(err, kerr.TopicAlreadyExists) {
		// Created meanwhile by another instance: describe it again.
		return describeFresh(ctx, adm, log, topic, false)
	}
	if err != nil {
		return topicInfo{}, fmt.Errorf("creating topic %s (%d partitions, replication %d): %w", topic, partitions, cfg.ReplicationFactor, err)
	}
	log.Info("Created topic", zap.String("topic", topic), zap.Int32("partitions", partitions), zap.Int16("replication", cfg.ReplicationFactor))
	// Used only once the broker describes it with every partition led: a
	// group client whose first metadata misses a topic just created joins
	// without it, learns it a moment later and rejoins, and the tasks
	// then restart (their partitions come back as added), dropping the
	// first transaction's work (1.2-1.6M events folded twice at start-up
	// of a 10M-event backlog).
	return describeFresh(ctx, adm, log, topic, true)
}

// describeFresh describes a topic that CreateTopics just created (created)
// or said exists, asking the broker rather than the client's metadata
// cache, and retries a few times while the broker does not know it yet or
// a partition has no leader.
//
// adm.Metadata answers from kgo's cache (kadm metadata.go: RequestCachedMetadata
// with limit 0, that is MetadataMinAge, 5 s by default), and the cache keeps
// the UNKNOWN_TOPIC_OR_PARTITION that ensure's first look got: describing
// again through it would see the topic missing until that entry is 5 s old.
// kadm bypasses the cache when the context asks for authorized operations
// (WithAuthorizedOps), the only cache-less metadata request a kadm.Client
// issues; kgo stores its answer in the cache, so later cached looks see the
// topic too.
func describeFresh(ctx context.Context, adm *kadm.Client, log *zap.Logger, topic string, created bool) (topicInfo, error) {
	by := "created by another client"
	if created {
		by = "created here"
	}
	fresh := kadm.WithAuthorizedOps(ctx)
	backoff := alreadyExistsBackoff
	var last error
	for attempt := 1; ; attempt++ {
		md, err := adm.Metadata(fresh, topic)
		if err != nil {
			return topicInfo{}, fmt.Errorf("describing topic %s: %w", topic, err)
		}
		d, ok := md.Topics[topic]
		switch {
		case ok && d.Err == nil && len(d.Partitions) > 0 && allLed(d.Partitions):
			if attempt > 1 {
				log.Debug("Topic "+by+" is described now", zap.String("topic", topic), zap.Int("attempts", attempt))
			}
			return topicInfo{id: d.ID, partitions: int32(len(d.Partitions))}, nil
		case !ok:
			last = kerr.UnknownTopicOrPartition
		case d.Err != nil && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) && !kerr.IsRetriable(d.Err):
			return topicInfo{}, fmt.Errorf("describing topic %s: %w", topic, d.Err)
		case d.Err != nil:
			last = d.Err // unknown to this broker yet, or e.g. LEADER_NOT_AVAILABLE
		default:
			last = kerr.LeaderNotAvailable // no partitions yet, or one without a leader
		}
		if attempt == alreadyExistsAttempts {
			return topicInfo{}, fmt.Errorf("describing topic %s: it exists (%s) but the broker still does not describe it after %d attempts: %w", topic, by, attempt, last)
		}
		log.Debug("Topic exists ("+by+") but is not described yet; waiting",
			zap.String("topic", topic), zap.Int("attempt", attempt), zap.Duration("backoff", backoff), zap.NamedError("reason", last))
		select {
		case <-ctx.Done():
			return topicInfo{}, fmt.Errorf("describing topic %s: %w", topic, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, alreadyExistsMaxBackoff)
	}
}

// allLed reports whether every partition has a leader and no error.
func allLed(ps kadm.PartitionDetails) bool {
	for _, p := range ps {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

// watchTopology checks the input topic every few seconds and ends the group
// session (cancel with errTopologyChanged) when it was recreated (a new
// topic id) or its partition count changed. A missing topic is waited for:
// the operator is recreating it.
func watchTopology(ctx context.Context, e *env, topo topology, cancel context.CancelCauseFunc) {
	every := 5 * time.Second
	if e.knobs.TopologyCheckEvery > 0 {
		every = e.knobs.TopologyCheckEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	missing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		mctx, mcancel := context.WithTimeout(ctx, 10*time.Second)
		md, err := e.admin.Metadata(mctx, e.cfg.InputTopic)
		mcancel()
		if err != nil {
			continue // Kafka unreachable: the poll loop reports it
		}
		d, ok := md.Topics[e.cfg.InputTopic]
		if !ok || d.Err != nil || len(d.Partitions) == 0 {
			if !missing {
				e.log.Warn("Input topic is missing; waiting for it to be created again", zap.String("input", e.cfg.InputTopic))
			}
			missing = true
			continue
		}
		missing = false
		switch {
		case d.ID != topo.inputID:
			cancel(fmt.Errorf("%w: topic %s was recreated (topic id %s, was %s)", errTopologyChanged, e.cfg.InputTopic, d.ID, kadm.TopicID(topo.inputID)))
			return
		case int32(len(d.Partitions)) != topo.partitions:
			cancel(fmt.Errorf("%w: topic %s now has %d partitions, was %d", errTopologyChanged, e.cfg.InputTopic, len(d.Partitions), topo.partitions))
			return
		}
	}
}

// prepareTopics checks and creates the topics, retrying while Kafka cannot
// be reached.
func prepareTopics(ctx context.Context, e *env) (topology, error) {
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		attemptCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		topo, err := ensureTopics(attemptCtx, e.admin, e.cfg, e.log)
		if err == nil && e.cfg.ForwardsAmounts() {
			err = checkEarlierRepartition(attemptCtx, e)
		}
		cancel()
		if err == nil {
			return topo, nil
		}
		if ctx.Err() != nil {
			return topology{}, nil
		}
		if !retriable(err) {
			return topology{}, err
		}
		e.log.Warn("Waiting for Kafka", zap.Strings("bootstrap.servers", e.cfg.BootstrapServers), zap.Int("attempt", attempt), zap.Error(err))
		select {
		case <-ctx.Done():
			return topology{}, nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// retriable reports whether a start-up error can go away by waiting: Kafka
// unreachable or not ready, as opposed to a wrong topic layout.
func retriable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || kerr.IsRetriable(err) {
		return true
	}
	var netErr net.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &netErr) && netErr.Timeout(),
		errors.As(err, &opErr), errors.As(err, &dnsErr),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, kerr.CoordinatorNotAvailable), errors.Is(err, kerr.NotCoordinator),
		errors.Is(err, kerr.NotController), errors.Is(err, kerr.LeaderNotAvailable):
		return true
	}
	return false
}
