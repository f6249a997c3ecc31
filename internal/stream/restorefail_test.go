package stream_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/status"
	th "github.com/salesagg/salesagg/test/harness"
)

// failStableOffsets makes every OffsetFetch answer UNSTABLE_OFFSET_COMMIT
// (a transaction of the previous owner pending) while on is set.
func failStableOffsets(c *kfake.Cluster, on *atomic.Bool) {
	c.ControlKey(int16(kmsg.OffsetFetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		req := kreq.(*kmsg.OffsetFetchRequest)
		resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.ErrorCode = kerr.UnstableOffsetCommit.Code
		for _, g := range req.Groups {
			rg := kmsg.NewOffsetFetchResponseGroup()
			rg.Group = g.Group
			rg.ErrorCode = kerr.UnstableOffsetCommit.Code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp, nil, true
	})
}

// failListOffsets makes every ListOffsets of topic alone fail while on is
// set.
func failListOffsets(c *kfake.Cluster, topic string, on *atomic.Bool) {
	c.ControlKey(int16(kmsg.ListOffsets), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if !on.Load() || len(req.Topics) != 1 || req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range req.Topics {
			t := kmsg.NewListOffsetsResponseTopic()
			t.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				p := kmsg.NewListOffsetsResponseTopicPartition()
				p.Partition = rp.Partition
				p.ErrorCode = kerr.UnknownServerError.Code
				p.Offset, p.Timestamp = -1, -1
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp, nil, true
	})
}

// outOfRangeFetches answers OFFSET_OUT_OF_RANGE to every fetch of topic's
// partition p alone (a restore consumer's) while on is set.
func outOfRangeFetches(c *kfake.Cluster, topic string, p int32, on *atomic.Bool) {
	id := c.TopicInfo(topic).TopicID
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		if !on.Load() || len(req.Topics) != 1 || len(req.Topics[0].Partitions) != 1 {
			return nil, nil, false
		}
		rt := req.Topics[0]
		if (rt.Topic != topic && rt.TopicID != id) || rt.Partitions[0].Partition != p {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		t := kmsg.NewFetchResponseTopic()
		t.Topic, t.TopicID = rt.Topic, rt.TopicID
		fp := kmsg.NewFetchResponseTopicPartition()
		fp.Partition = p
		fp.ErrorCode = kerr.OffsetOutOfRange.Code
		fp.HighWatermark, fp.LastStableOffset, fp.LogStartOffset = -1, -1, -1
		t.Partitions = append(t.Partitions, fp)
		resp.Topics = append(resp.Topics, t)
		return resp, nil, true
	})
}

// health reads GET /healthz: its status code and reason.
func (in *instance) health() (int, string) {
	resp, err := http.Get(in.http.URL + "/healthz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body struct {
		Reason string `json:"reason"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Reason
}

// taskStatus returns task's active status from GET /v1/tasks.
func (in *instance) taskStatus(task string) (status.Task, bool) {
	for _, ts := range in.rt.Tasks() {
		if ts.Task == task && ts.Role == "active" {
			return ts, true
		}
	}
	return status.Task{}, false
}

func TestRestoreErrorsAreRetriedAndReported(t *testing.T) {
	// Scenario: a restore that keeps failing (stable offsets never stable,
	// the changelog's offsets unreadable, out of range at every fetch, a
	// store Pebble cannot open) neither dies nor stops silently: the task
	// retries, says why in /v1/tasks, /readyz and the status page, and past
	// task.timeout.ms /healthz answers 503; once the cause is gone it
	// restores exactly and the process is healthy again.
	cases := []struct {
		name string
		// block starts the fault (before the instance starts); lift ends it.
		block func(h *harness, cfg config.Config, on *atomic.Bool)
		lift  func(h *harness, cfg config.Config, on *atomic.Bool)
		// task is the task held back; want what its status shows.
		task    string
		waiting string // in Waiting ("" when Failing)
		failing string // in Failing.Error
	}{
		{
			name: "stable offsets never stable",
			block: func(h *harness, _ config.Config, on *atomic.Bool) {
				on.Store(true)
				failStableOffsets(h.cluster, on)
			},
			task: "0_1", waiting: "stable committed offsets",
		},
		{
			name: "changelog offsets unreadable",
			block: func(h *harness, cfg config.Config, on *atomic.Bool) {
				on.Store(true)
				failListOffsets(h.cluster, cfg.ChangelogTopic(), on)
			},
			task: "0_1", waiting: "the offsets of changelog",
		},
		{
			name: "out of range at every fetch",
			block: func(h *harness, cfg config.Config, on *atomic.Bool) {
				on.Store(true)
				outOfRangeFetches(h.cluster, cfg.ChangelogTopic(), 1, on)
			},
			task: "0_1", failing: "OFFSET_OUT_OF_RANGE",
		},
		{
			name: "store cannot be opened",
			block: func(_ *harness, cfg config.Config, _ *atomic.Bool) {
				dir := filepath.Join(cfg.StateDir, cfg.ApplicationID)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				// A file where the task's store directory goes, and one where
				// a store Pebble cannot open would be moved aside.
				for _, name := range []string{"0_1", "quarantine"} {
					if err := os.WriteFile(filepath.Join(dir, name), []byte("not a directory"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			},
			lift: func(_ *harness, cfg config.Config, _ *atomic.Bool) {
				for _, name := range []string{"0_1", "quarantine"} {
					if err := os.Remove(filepath.Join(cfg.StateDir, cfg.ApplicationID, name)); err != nil {
						t.Fatal(err)
					}
				}
			},
			task: "0_1", failing: "quarantining task 0_1",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.createInput(3)
			h.cfg.TransactionTimeoutSet = time.Second
			h.seedAndStop(t)
			cfg := h.instanceCfg("restorer") // no local state: every task restores
			cfg.TaskTimeout = time.Second
			var on atomic.Bool
			tc.block(h, cfg, &on)
			in := h.start(cfg)

			th.WaitFor(t, 60*time.Second, "the held task to show why", th.Holds(func() bool {
				ts, ok := in.taskStatus(tc.task)
				if !ok || ts.State == "running" {
					return false
				}
				if tc.waiting != "" {
					return strings.Contains(ts.Waiting, tc.waiting)
				}
				return ts.Failing != nil && strings.Contains(ts.Failing.Error, tc.failing)
			}))
			why := tc.waiting + tc.failing
			th.WaitFor(t, 30*time.Second, "/readyz to say why", th.Holds(func() bool {
				ready, reason := in.rt.Ready()
				if ready {
					t.Fatalf("ready while task %s cannot restore", tc.task)
				}
				return strings.Contains(reason, why)
			}))
			th.WaitFor(t, 60*time.Second, "/healthz to report the task", th.Holds(func() bool {
				code, reason := in.health()
				return code == http.StatusServiceUnavailable && strings.Contains(reason, why)
			}))
			code, reason := in.health()
			t.Logf("/healthz %d: %s", code, reason)
			page := func() string {
				resp, err := http.Get(in.http.URL + "/?part=main")
				if err != nil {
					return ""
				}
				defer resp.Body.Close()
				var b strings.Builder
				buf := make([]byte, 64<<10)
				for {
					n, err := resp.Body.Read(buf)
					b.Write(buf[:n])
					if err != nil {
						return b.String()
					}
				}
			}()
			if !strings.Contains(page, `data-role="trouble"`) || !strings.Contains(page, "unhealthy") {
				t.Errorf("the status page does not show the failing task:\n%s", taskRow(page, tc.task))
			}

			on.Store(false)
			if tc.lift != nil {
				tc.lift(h, cfg, &on)
			}
			in.waitReady()
			in.waitTotals(sampleTotals)
			th.WaitFor(t, 10*time.Second, "/healthz 200", th.Holds(func() bool {
				code, _ := in.health()
				return code == http.StatusOK
			}))
			if ts, _ := in.taskStatus(tc.task); ts.Failing != nil || ts.Waiting != "" {
				t.Fatalf("task %s still shows trouble once running: %+v", tc.task, ts)
			}
		})
	}
}
