package httpapi

import (
	"errors"
	"fmt"
)

// The views: what the HTTP interface serves, in httpapi's own types, so
// that it reads the runtime at arm's length. The wiring adapts the
// runtime's status to them (internal/httpapi/streamview). Their JSON is
// what GET /v1/tasks and GET /v1/instances serve: the field names, their
// order and their omissions are part of the API.

// TaskStatus describes one task, active or standby copy, for operators.
// Its JSON is flat: the fields of the embedded TaskCounters and TaskTrouble
// are served beside the others, in the order declared.
type TaskStatus struct {
	Task      string `json:"task"`
	Partition int32  `json:"partition"`
	// Role is "active", "standby" or "warmup" (a standby built where the
	// task should move once it caught up).
	Role  string `json:"role"`
	State string `json:"state"`
	// Checkpoint is the next changelog offset the store reflects (-1: none yet).
	Checkpoint int64         `json:"checkpoint"`
	Restore    RestoreStatus `json:"restore"`
	TaskCounters
	TaskTrouble
	// ChangelogLag is, for a standby copy, how many changelog records it
	// is behind the last stable offset it saw (nil for an active task, or
	// while unknown).
	ChangelogLag *int64 `json:"changelog_lag,omitempty"`
}

// TaskCounters are a task's input position and counters.
type TaskCounters struct {
	// Position is the next input offset to process (-1: none read yet);
	// Lag is the input high watermark minus it.
	Position   int64 `json:"position"`
	Lag        int64 `json:"lag"`
	Processed  int64 `json:"processed"`
	Duplicates int64 `json:"duplicates_skipped"`
	BadEvents  int64 `json:"bad_events"`
	Forwarded  int64 `json:"forwarded"`
	// Cache is the task's entry cache (nil: none).
	Cache *CacheStatus `json:"cache,omitempty"`
}

// TaskTrouble is what keeps a task back, if anything.
type TaskTrouble struct {
	// Waiting says what the task waits for, "" when nothing.
	Waiting string `json:"waiting,omitempty"`
	// Failing is the failure the task retries with backoff, nil while none.
	Failing *FailingStatus `json:"failing,omitempty"`
	// Unhealthy: the wait or the failures lasted past task.timeout.ms;
	// GET /healthz answers 503.
	Unhealthy bool `json:"unhealthy,omitempty"`
}

// FailingStatus is a task's failure, retried with backoff.
type FailingStatus struct {
	Error    string `json:"error"`
	Attempts int    `json:"attempts"`
	// Since is when the failures began (RFC 3339, UTC).
	Since string `json:"since"`
}

// CacheStatus is a task's entry cache.
type CacheStatus struct {
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Evictions int64 `json:"evictions"`
	Bytes     int64 `json:"bytes"`
}

// RestoreStatus is a task's restore progress, in changelog offsets from
// From to To.
type RestoreStatus struct {
	From       int64 `json:"from"`
	To         int64 `json:"to"`
	Restored   int64 `json:"restored"`
	Done       bool  `json:"done"`
	DurationMs int64 `json:"duration_ms"`
}

// InstanceStatus is one member of the group as the latest assignment
// describes it.
type InstanceStatus struct {
	// Name is the member's group.instance.id (member id when dynamic).
	Name string `json:"instance"`
	// Server is its application.server ("" when it advertised none).
	Server string   `json:"server"`
	Tasks  []string `json:"tasks"`
	// Standbys are the tasks it keeps standby (or warm-up) copies of.
	Standbys []string `json:"standbys"`
	Self     bool     `json:"self"`
}

// Peer is another instance: its name in the group and its application.server.
type Peer struct{ Name, Server string }

// NotHostedError is the error of a query for a product whose task runs on
// another member, or on none yet. The product's query asks the owner at
// Server; an answer that cannot is 404 naming the owner, or 503 while no
// owner is known or it cannot be asked.
type NotHostedError struct {
	Task      string // "0_<partition>"
	Partition int32
	// Owner names the member running the task, "" when unknown (a
	// rebalance is in progress).
	Owner string
	// Server is the owner's application.server, "" when unknown.
	Server string
	// Unroutable, when set, says why the owner cannot be asked.
	Unroutable string
	// Err is the backend's error: its text is the answer's "error" (nil:
	// the text is made of the fields above).
	Err error
}

// Error is Err's text, or, without Err, one made of the fields.
func (e *NotHostedError) Error() string {
	switch {
	case e.Err != nil:
		return e.Err.Error()
	case e.Owner == "":
		return fmt.Sprintf("task %s (partition %d) has no known owner yet (a rebalance is in progress)", e.Task, e.Partition)
	case e.Unroutable != "":
		return fmt.Sprintf("task %s (partition %d) runs on member %s, which %s", e.Task, e.Partition, e.Owner, e.Unroutable)
	}
	return fmt.Sprintf("task %s (partition %d) runs on member %s", e.Task, e.Partition, e.Owner)
}

// Unwrap returns Err, so that the backend's error stays in the chain.
func (e *NotHostedError) Unwrap() error { return e.Err }

// ErrUnavailable marks a query's error as temporary here (the task is not
// ready, or not hosted by this instance, and no owner is named): it is
// answered 503 with Retry-After. Mark an error with Unavailable.
var ErrUnavailable = errors.New("httpapi: unavailable here for now")

// Unavailable returns err marked as ErrUnavailable; its text is err's.
func Unavailable(err error) error { return unavailableError{err} }

type unavailableError struct{ err error }

func (u unavailableError) Error() string        { return u.err.Error() }
func (u unavailableError) Unwrap() error        { return u.err }
func (u unavailableError) Is(target error) bool { return target == ErrUnavailable }
