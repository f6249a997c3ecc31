package stream

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestRewindMovesToTheOffsetsOfItsRequest(t *testing.T) {
	// Scenario (at-least-once): task 0_0 reported input offset 40 for commit, then a cycle fails
	// to produce and it asks for a rewind. Before the poll loop applies it, the task's goroutine
	// goes on (its ticker's flush reports offsets, here 99). The poll loop rewinds to 40, the
	// offsets of the request, read on the task goroutine: it never reads the task's fields
	// while the task writes them (run with -race).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLone(t, ctx)
	core, logs := observer.New(zap.InfoLevel)
	l.task.log = zap.New(core)
	reg := newRegistry()
	reg.mu.tasks[0] = l.task
	s := newSession(l.task.deps.env, reg, nil, nil, newLocalStores(), l.task.deps.topo, nil)
	s.client.Store(l.task.deps.client)
	a := s.g.(*atLeastOnce)
	l.task.deps.rewind = a.requestRewind
	l.running()

	l.task.reportOffsets(stalledBatch{report: true, inputNext: 40, repartNext: -1})
	l.task.rewind(errors.New("injected produce failure"), "folding again")
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-a.rewinds.kick
		a.applyRewinds()
	}()
	l.task.reportOffsets(stalledBatch{report: true, inputNext: 99, repartNext: -1})
	<-done

	lines := logs.FilterMessageSnippet("Rewinding to the last committed offsets").All()
	if len(lines) != 1 {
		t.Fatalf("%d rewind lines, want 1", len(lines))
	}
	if got := lines[0].ContextMap()["input_offset"]; got != int64(40) {
		t.Errorf("rewound the input to %v, want 40 (the offsets of the request)", got)
	}
}
