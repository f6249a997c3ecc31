package stream

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestSettleWaitsForTheCycleInProgress(t *testing.T) {
	// Scenario (exactly-once): a task about to restore asks settle whether a transaction cycle of
	// this process is deciding. With none it goes on at once and says nothing; with one, it says
	// it waits and goes on only once the cycle ends; a stop (its context) ends the wait.
	e := newExactlyOnce(nil)
	core, logs := observer.New(zap.InfoLevel)
	tk := &task{name: "0_1", log: zap.New(core)}
	waiting := func() int { return logs.FilterMessageSnippet("Waiting for this process's transaction").Len() }

	if err := e.settle(context.Background(), tk); err != nil || waiting() != 0 {
		t.Fatalf("settle with no cycle in progress = %v, %d waiting lines; want nil at once, none", err, waiting())
	}

	e.cycle <- struct{}{} // a cycle begins (transact)
	done := make(chan error, 1)
	go func() { done <- e.settle(context.Background(), tk) }()
	deadline := time.Now().Add(10 * time.Second)
	for waiting() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("settle did not say it waits for the cycle in progress within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("settle returned (%v) while the cycle was in progress", err)
	default:
	}
	<-e.cycle // the cycle ends
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("settle after the cycle ended = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("settle did not return within 10 s of the cycle's end")
	}

	e.cycle <- struct{}{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.settle(ctx, tk); !errors.Is(err, context.Canceled) {
		t.Fatalf("settle of a stopped task during a cycle = %v, want context.Canceled", err)
	}
	<-e.cycle
}
