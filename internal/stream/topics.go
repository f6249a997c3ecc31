package stream

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
)

// topology is what the runtime learned about its topics at start.
type topology struct {
	partitions             int32    // of the input, changelog and repartition topics
	notificationPartitions int32    // of the notification topic
	dlqPartitions          int32    // of the dead-letter topic, 0 when off
	changelogID            [16]byte // the changelog topic's id
	inputID                [16]byte // the input topic's id: per-product offsets refer to it
}

// topicInfo is what ensure learns of one topic.
type topicInfo struct {
	id         [16]byte
	partitions int32
}

// ensureTopics creates the topics that are missing (when topics.create is on)
// and checks the internal ones against the input: the changelog and the
// repartition topic must have as many partitions as the input, or a task
// would read another partition's state.
func ensureTopics(ctx context.Context, adm *kadm.Client, cfg config.Config, log *zap.Logger) (topology, error) {
	var topo topology
	input, err := ensure(ctx, adm, cfg, log, cfg.InputTopic, cfg.TopicsPartitions, nil)
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
		{cfg.RepartitionTopic(), nil},
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
		if it.name == cfg.ChangelogTopic() {
			topo.changelogID = info.id
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
		return topicInfo{}, fmt.Errorf("topic %s does not exist and topics.create is false: create it with %d partitions", topic, partitions)
	}
	resp, err := adm.CreateTopic(ctx, partitions, cfg.ReplicationFactor, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if errors.Is(err, kerr.TopicAlreadyExists) {
		// Created meanwhile by another instance: describe it again.
		return ensure(ctx, adm, cfg, log, topic, partitions, configs)
	}
	if err != nil {
		return topicInfo{}, fmt.Errorf("creating topic %s (%d partitions, replication %d): %w", topic, partitions, cfg.ReplicationFactor, err)
	}
	log.Info("Created topic", zap.String("topic", topic), zap.Int32("partitions", partitions), zap.Int16("replication", cfg.ReplicationFactor))
	n := resp.NumPartitions
	if n <= 0 {
		n = partitions
	}
	return topicInfo{id: resp.ID, partitions: n}, nil
}
