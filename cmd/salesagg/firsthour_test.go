package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/salesagg/salesagg/test/harness"
)

// topicNames lists the topics of the broker at addr.
func topicNames(t *testing.T, addr string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listed, err := kadm.NewClient(harness.NewClient(t, addr)).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return listed.Names()
}

func TestMissingInputTopicStopsTheStart(t *testing.T) {
	// Scenario: input.topic is mistyped (sales-event-v1 where the broker has sales-events-v1). The
	// service does not create it and sit idle: it exits 1 naming the topic, the nearest existing
	// one and the key that would create it, and the broker still has no such topic. Asked with
	// topics.input.create, it creates the input topic and runs.
	broker := kfakeCluster(t, 3)
	p := startService(t, broker, t.TempDir(), nil, "--input.topic", "sales-event-v1")
	if !p.WaitExit(60 * time.Second) {
		t.Fatalf("the service still runs on a missing input topic:\n%s", p.Stderr())
	}
	if p.ExitCode() != exitError {
		t.Fatalf("exit: %s, want %d:\n%s", p.DescribeExit(), exitError, p.Stderr())
	}
	for _, want := range []string{"input topic sales-event-v1 does not exist", "did you mean sales-events-v1?", "topics.input.create"} {
		if !strings.Contains(p.Stderr(), want) {
			t.Errorf("standard error lacks %q:\n%s", want, p.Stderr())
		}
	}
	for _, name := range topicNames(t, broker) {
		if name == "sales-event-v1" {
			t.Errorf("the mistyped input topic was created")
		}
	}

	t.Run("asked", func(t *testing.T) {
		s := startService(t, broker, t.TempDir(), nil, "--application.id", "asked", "--input.topic", "brand-new-input", "--topics.input.create")
		s.WaitReady(t, 60*time.Second)
		names := topicNames(t, broker)
		if !strings.Contains(strings.Join(names, " "), "brand-new-input") {
			t.Errorf("topics.input.create did not create the input topic: %v", names)
		}
		s.Terminate(t)
	})
}

func TestDevBrokerHasTheInputTopic(t *testing.T) {
	// Scenario: the README's first steps on a fresh dev broker (make run, scripts/dev.sh): the dev
	// broker starts with the default input topic (3 partitions), so the service, which does not
	// create its input topic unless asked, becomes ready, and produce finds the topic.
	work := t.TempDir()
	addr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), addr)
	s := startService(t, addr, filepath.Join(work, "state"), nil)
	s.WaitReady(t, 60*time.Second)
	produceSample(t, addr)
	s.WaitTotals(t, harness.SampleTotals, 30*time.Second)
	s.Terminate(t)
	if s.ExitCode() != 0 {
		t.Fatal(errors.New(s.DescribeExit()))
	}
}

func TestFailedStartSaysNoShutdown(t *testing.T) {
	// Scenario: the start fails (here: the input topic is missing). The log ends with the error,
	// not with "Shutdown requested: flushing, checkpointing and leaving the group", which only a
	// signal's stop says.
	broker := kfakeCluster(t, 3)
	p := startService(t, broker, t.TempDir(), nil, "--input.topic", "nowhere-v1")
	if !p.WaitExit(60 * time.Second) {
		t.Fatalf("the service still runs on a missing input topic:\n%s", p.Stderr())
	}
	if !strings.Contains(p.Stderr(), "input topic nowhere-v1 does not exist") {
		t.Fatalf("no error naming the missing topic:\n%s", p.Stderr())
	}
	if strings.Contains(p.Stderr(), "Shutdown requested") {
		t.Errorf("a failed start logged a shutdown request:\n%s", p.Stderr())
	}
}
