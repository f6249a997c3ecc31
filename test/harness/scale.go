package harness

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// What the multi-instance scenarios hold the group to. The group runs with
// the default session timeout (45 s), so each bound is one that only the
// intended membership behaviour can meet, with room for a loaded 2-core
// machine.
const (
	// StaticRejoinBound: a member SIGKILLed and restarted on the same state
	// dir comes back under the same group.instance.id (derived from the
	// state dir's process id) and replaces its dead self at once, with its
	// tasks; a dynamic member would wait for the dead one's 45 s session to
	// expire.
	StaticRejoinBound = 30 * time.Second
	// HandoverBound: a member stopped with SIGTERM sends LeaveGroup
	// (leave.group.on.close, default true), so the others take its task at
	// once; a static member that just went away would hold it for the 45 s
	// session timeout.
	HandoverBound = 30 * time.Second
	// SpreadBound: a rebalance onto a new member: heartbeats (3 s) tell the
	// others, two cooperative rounds, the moved task restores a small
	// changelog.
	SpreadBound = 60 * time.Second
	// ScalePartitions is the input topic's partition count in these
	// scenarios: tasks 0_0..0_2, one per member of three.
	ScalePartitions = 3
)

// ScaleSetup is the broker side of SeveralInstancesOneGroup.
type ScaleSetup struct {
	// Start starts an instance of the group on stateDir, with the default
	// group config (no group.instance.id, no session.timeout.ms).
	Start func(stateDir string) *Service
	// Bootstrap is the broker; Changelog the group's changelog topic.
	Bootstrap, Changelog string
	// Client produces Events to Input, Batch every Every; it partitions
	// with HeaderPartitioner.
	Client       *kgo.Client
	Input        string
	Events       []Event
	Batch        int
	Every        time.Duration
	ReadyTimeout time.Duration // of the first instance
	// Drain, when not 0, is how long the producer may take to send every
	// event once the group is back to three; with 0 it is stopped there,
	// and the totals are those of the events it sent.
	Drain time.Duration
}

// SeveralInstancesOneGroup: one group scales 1 → 3 → 2 → 3 while events
// flow (A; B and C join; C gets SIGTERM for good; D joins; B is SIGKILLed
// and restarted on its state dir): the tasks spread one per member, move
// within the bounds above, no two instances ever run one task (the
// ownership sampler), every instance answers every product with its exact
// total, served by the one running its task, and the changelog holds the
// same totals. A property that fails is reported and the scenario goes on.
func SeveralInstancesOneGroup(t *testing.T, s ScaleSetup) {
	work := t.TempDir()
	f := NewFleet(s.Start)
	start := func(name, dir string) *Member { return f.Start(name, filepath.Join(work, dir)) }
	p := NewProducer(s.Client, s.Input, s.Events).Start(t, s.Batch, s.Every)
	step := func(format string, args ...any) {
		t.Logf("%s (producer at %s events)", fmt.Sprintf(format, args...), p.Progress())
	}

	a := start("A", "a")
	a.WaitRestored(t, s.ReadyTimeout)
	step("A ready")
	sampler := f.Sample(t)

	b := start("B", "b")
	c := start("C", "c")
	if Expect(t, SpreadBound, "the 3 tasks spread over A, B, C (one running task each)", func() error {
		return RunEach([]*Member{a, b, c}, true, ScalePartitions)
	}) {
		step("tasks spread over A, B, C")
	}

	stopAt := time.Now()
	c.Terminate(t) // fails the test unless the exit is clean
	if Expect(t, HandoverBound, "A and B to run all 3 tasks after C's SIGTERM", func() error {
		return RunEach([]*Member{a, b}, false, ScalePartitions)
	}) {
		step("C stopped; A and B run all 3 tasks %s after the SIGTERM", time.Since(stopAt).Round(time.Millisecond))
	}

	d := start("D", "d")
	if Expect(t, SpreadBound, "the 3 tasks spread over A, B, D (one running task each)", func() error {
		return RunEach([]*Member{a, b, d}, true, ScalePartitions)
	}) {
		step("tasks spread over A, B, D")
	}

	Expect(t, 30*time.Second, "B to fold at least one event before its SIGKILL", b.Folded)
	b.Kill()
	restartAt := time.Now()
	b2 := f.Start("B2", b.Dir) // the same state dir, so the same group.instance.id
	if Expect(t, StaticRejoinBound, "B, restarted on its state dir after SIGKILL, to run a task again", func() error {
		if len(b2.Running()) == 0 {
			return errors.New("B2 runs no task")
		}
		return nil
	}) {
		step("B SIGKILLed and restarted: runs a task again %s after its restart", time.Since(restartAt).Round(time.Millisecond))
	}

	if s.Drain > 0 {
		p.Wait(t, s.Drain)
	} else if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	want := p.Totals()
	step("producer done")
	live := []*Member{a, b2, d}
	Expect(t, 60*time.Second, "every product answered by every instance with its exact total, from its owner", func() error {
		return ServedByOwner(live, want, ScalePartitions)
	})
	Expect(t, 30*time.Second, "the changelog's latest committed totals to be exact", func() error {
		return CheckChangelog(s.Bootstrap, s.Changelog, want)
	})
	ReportOwnership(t, sampler)
	for _, m := range live {
		m.Terminate(t)
	}
}
