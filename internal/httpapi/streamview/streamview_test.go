package streamview

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/stream"
)

// allSet fails unless every field of v, through structs and pointers to
// structs, is set: a field stream adds to its status and the views miss
// then fails the JSON comparisons.
func allSet(t *testing.T, path string, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			t.Errorf("%s is nil in the sample", path)
			return
		}
		allSet(t, path, v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			allSet(t, path+"."+v.Type().Field(i).Name, v.Field(i))
		}
	default:
		if v.IsZero() {
			t.Errorf("%s is zero in the sample", path)
		}
	}
}

func sameJSON(t *testing.T, what string, want, got any) {
	t.Helper()
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if string(w) != string(g) {
		t.Errorf("%s:\nstream  %s\nhttpapi %s", what, w, g)
	}
}

func TestViewsServeTheRuntimesJSON(t *testing.T) {
	// Scenario: a task's and an instance's status, every field set and then the optional ones
	// absent, marshal to the same bytes (names, order, omissions) as httpapi's views of them.
	lag := int64(9)
	full := stream.TaskStatus{
		Task: "0_3", Partition: 3, Role: "standby", State: "running", Checkpoint: 40,
		Restore:  stream.RestoreStatus{From: 1, To: 50, Restored: 39, Done: true, DurationMs: 850},
		Position: 12, Lag: 7, TaskCounters: stream.TaskCounters{Processed: 1000, Duplicates: 4, BadEvents: 2, Forwarded: 990},
		Cache:     &stream.CacheStatus{Hits: 39, Misses: 1, Evictions: 3, Bytes: 4096},
		Waiting:   "stable committed offsets",
		Failing:   &stream.FailingStatus{Error: "producing: broker down", Attempts: 5, Since: "2026-12-01T12:00:00Z"},
		Unhealthy: true, ChangelogLag: &lag,
	}
	allSet(t, "TaskStatus", reflect.ValueOf(full))
	bare := stream.TaskStatus{Task: "0_0", Role: "active", State: "restoring", Checkpoint: -1, Position: -1}
	for _, ts := range []stream.TaskStatus{full, bare} {
		sameJSON(t, "task "+ts.Task, ts, taskView(ts))
	}
	sameJSON(t, "tasks", []stream.TaskStatus{full, bare}, []httpapi.TaskStatus{taskView(full), taskView(bare)})

	is := stream.InstanceStatus{Name: "salesagg-1", Server: "127.0.0.2:8080", Tasks: []string{"0_1"}, Standbys: []string{"0_2"}, Self: true}
	allSet(t, "InstanceStatus", reflect.ValueOf(is))
	empty := stream.InstanceStatus{Name: "salesagg-2", Tasks: []string{}, Standbys: []string{}}
	for _, s := range []stream.InstanceStatus{is, empty, {Name: "nil slices"}} {
		sameJSON(t, "instance "+s.Name, s, instanceView(s))
	}
}

func TestQueryErrorsAreAnsweredAsTheRuntimeMeansThem(t *testing.T) {
	// Scenario: the runtime's not-hosted error names the same task and owner to httpapi, its
	// not-ready and not-hosted sentinels are marked unavailable (503), any other error is left as
	// it is; the text the answer serves is the runtime's, and the runtime's error stays in the chain.
	nh := &stream.NotHostedError{Task: "0_1", Partition: 1, Owner: "salesagg-2", Server: "127.0.0.3:8080", Unroutable: "advertises nothing usable"}
	err := queryError(fmt.Errorf("querying: %w", nh))
	var got *httpapi.NotHostedError
	if !errors.As(err, &got) {
		t.Fatalf("%v (%T) is not an httpapi.NotHostedError", err, err)
	}
	want := httpapi.NotHostedError{Task: "0_1", Partition: 1, Owner: "salesagg-2", Server: "127.0.0.3:8080", Unroutable: "advertises nothing usable"}
	if g := *got; g.Task != want.Task || g.Partition != want.Partition || g.Owner != want.Owner || g.Server != want.Server || g.Unroutable != want.Unroutable {
		t.Errorf("not hosted: got %+v, want %+v", g, want)
	}
	if err.Error() != "querying: "+nh.Error() || !errors.Is(err, stream.ErrNotHosted) {
		t.Errorf("not hosted: text %q, or the runtime's error lost", err)
	}

	for _, e := range []error{stream.ErrNotReady, fmt.Errorf("%w: task 0_1 is restoring", stream.ErrNotReady), stream.ErrNotHosted} {
		got := queryError(e)
		if !errors.Is(got, httpapi.ErrUnavailable) || !errors.Is(got, e) || got.Error() != e.Error() {
			t.Errorf("%q: got %q, unavailable %v", e, got, errors.Is(got, httpapi.ErrUnavailable))
		}
	}
	other := errors.New("pebble: closed")
	if got := queryError(other); got != other {
		t.Errorf("other error became %q (%T)", got, got)
	}
	if queryError(nil) != nil {
		t.Error("no error became one")
	}
}
