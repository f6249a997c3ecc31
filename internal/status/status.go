// Package status holds what an instance reports about itself to operators:
// its tasks (active, standby or warm-up copies) and the group's members.
// internal/stream produces these values, internal/httpapi serves them as
// JSON (GET /v1/tasks, GET /v1/instances) and renders the status page from
// them. Their JSON is part of the API: the field names, their order and
// their omissions.
//
// It imports nothing else of the project.
package status

// Task describes one task, active or standby copy. Its JSON is flat: the
// fields of the embedded Counters and Trouble are served beside the others,
// in the order declared.
type Task struct {
	Task      string `json:"task"`
	Partition int32  `json:"partition"`
	// Role is "active", "standby" or "warmup" (a standby built where the
	// task should move once it caught up).
	Role  string `json:"role"`
	State string `json:"state"`
	// Checkpoint is the next changelog offset the store reflects (-1: none yet).
	Checkpoint int64   `json:"checkpoint"`
	Restore    Restore `json:"restore"`
	Counters
	Trouble
	// ChangelogLag is, for a standby copy, how many changelog records it
	// is behind the last stable offset it saw (nil for an active task, or
	// while unknown).
	ChangelogLag *int64 `json:"changelog_lag,omitempty"`
	// Windows are an active task's window sizes (windows.sizes).
	Windows []Window `json:"windows,omitempty"`
}

// Window is one window size of an active task.
type Window struct {
	Size string `json:"size"`
	// StreamTime is the latest event time the store holds (ms; -1: none
	// yet): windows close and expire by it.
	StreamTime int64 `json:"stream_time"`
	// Checkpoint is the next offset of the size's changelog the store
	// reflects.
	Checkpoint int64 `json:"checkpoint"`
	// Late counts the events left out of a closed window, BadTime those
	// whose time field could not be read.
	Late    int64 `json:"late"`
	BadTime int64 `json:"bad_time"`
	// ChangelogLag, for a standby copy, is how many records of the size's
	// changelog it lacks (absent while unknown).
	ChangelogLag *int64 `json:"changelog_lag,omitempty"`
}

// Counters are a task's input position and what an active task has done
// since it started here.
type Counters struct {
	// Position is the next input offset to process (-1: none read yet);
	// Lag is the input high watermark minus it.
	Position   int64 `json:"position"`
	Lag        int64 `json:"lag"`
	Processed  int64 `json:"processed"`
	Duplicates int64 `json:"duplicates_skipped"`
	BadEvents  int64 `json:"bad_events"`
	Forwarded  int64 `json:"forwarded"`
	// Cache is the task's entry cache (nil: none).
	Cache *Cache `json:"cache,omitempty"`
}

// Trouble is what keeps a task back, if anything.
type Trouble struct {
	// Waiting says what the task waits for (stable committed offsets, the
	// changelog's offsets), "" when nothing.
	Waiting string `json:"waiting,omitempty"`
	// Failing is the failure the task retries with backoff (its restore,
	// or producing its cycle's records), nil while none.
	Failing *Failing `json:"failing,omitempty"`
	// Unhealthy: the wait or the failures lasted past task.timeout.ms;
	// GET /healthz answers 503.
	Unhealthy bool `json:"unhealthy,omitempty"`
}

// Failing is a task's failure, retried with backoff.
type Failing struct {
	Error    string `json:"error"`
	Attempts int    `json:"attempts"`
	// Since is when the failures began (RFC 3339, UTC).
	Since string `json:"since"`
}

// Cache is a task's entry cache.
type Cache struct {
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Evictions int64 `json:"evictions"`
	Bytes     int64 `json:"bytes"`
}

// Restore is a task's restore progress, in changelog offsets from From to
// To.
type Restore struct {
	From       int64 `json:"from"`
	To         int64 `json:"to"`
	Restored   int64 `json:"restored"`
	Done       bool  `json:"done"`
	DurationMs int64 `json:"duration_ms"`
}

// Instance is one member of the group as the latest assignment describes
// it.
type Instance struct {
	// Name is the member's group.instance.id (member id when dynamic).
	Name string `json:"instance"`
	// Server is its application.server ("" when it advertised none).
	Server string   `json:"server"`
	Tasks  []string `json:"tasks"`
	// Standbys are the tasks it keeps standby (or warm-up) copies of.
	Standbys []string `json:"standbys"`
	Self     bool     `json:"self"`
	// Member and MemberEpoch are its member id and epoch in a streams
	// group (group.protocol streams), as the group coordinator describes
	// them; empty under classic or when the coordinator did not answer.
	Member      string `json:"member,omitempty"`
	MemberEpoch int32  `json:"member_epoch,omitempty"`
	// Pending are the tasks the streams group's coordinator means for it
	// that it is not given yet (their previous owner has not let go).
	Pending []string `json:"pending_tasks,omitempty"`
}

// Peer is another instance: its name in the group and its application.server.
type Peer struct{ Name, Server string }
