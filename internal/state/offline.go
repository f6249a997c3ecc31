package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// This file holds what the offline tools (salesagg state inspect, verify
// and reset) do to a stopped service's state dir.

// OpenExistingDir takes the lock of <stateDir>/<appID>, which must exist: an
// offline tool never creates the state it was asked to look at, and never
// writes into a Kafka Streams application's (ErrKafkaStreamsDir). A dir locked
// by a running service is refused with an error that says so (and wraps
// ErrLocked).
func OpenExistingDir(stateDir, appID string) (*Dir, error) {
	if _, err := existingDir(stateDir, appID); err != nil {
		return nil, err
	}
	dir, err := OpenDir(stateDir, appID)
	if errors.Is(err, ErrLocked) {
		return nil, fmt.Errorf("refusing while the service runs: %w", err)
	}
	return dir, err
}

// InspectExistingDir opens <stateDir>/<appID> as OpenExistingDir does, for
// a tool that only reads it (state inspect): it changes nothing in the dir.
// It takes a shared lock on the lock file a service left, without creating
// it or writing its holder, so that a running service (which holds it
// exclusively) is still refused; it reads the process id without making
// one up, and leaves a wipe's trash where it is. A dir with no lock file
// (no service ever held it) is read unlocked.
func InspectExistingDir(stateDir, appID string) (*Dir, error) {
	if err := CheckSegment(appID); err != nil {
		return nil, fmt.Errorf("application.id %q: %w", appID, err)
	}
	path, err := existingDir(stateDir, appID)
	if err != nil {
		return nil, err
	}
	d := &Dir{path: path}
	name := filepath.Join(path, lockFileName)
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("opening lock file %s: %w", name, linkError(err))
	default:
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				h := LockHolder(stateDir, appID)
				if h == "" {
					h = "unknown holder"
				}
				return nil, fmt.Errorf("refusing while the service runs: %w: lock file %s is held by %s", ErrLocked, name, h)
			}
			return nil, fmt.Errorf("locking %s: %w", name, err)
		}
		d.lock = f
	}
	b, err := readNoFollow(filepath.Join(path, metadataFileName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		_ = d.Close()
		return nil, fmt.Errorf("reading process metadata %s: %w", filepath.Join(path, metadataFileName), linkError(err))
	}
	var md processMetadata
	if err == nil && json.Unmarshal(b, &md) == nil {
		d.processID = md.ProcessID
	}
	return d, nil
}

// existingDir returns <stateDir>/<appID> when it exists and is not a Kafka
// Streams application's state dir: what an offline tool may look at.
func existingDir(stateDir, appID string) (string, error) {
	path := filepath.Join(stateDir, appID)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("no state for application %s in %s: %w", appID, stateDir, err)
	}
	if kafkaStreamsLayout(path) {
		return "", fmt.Errorf("%s: this looks like a Kafka Streams state dir (RocksDB: rocksdb/, .checkpoint), not salesagg's (Pebble stores under 0_N): %w",
			path, ErrKafkaStreamsDir)
	}
	return path, nil
}

// ParseTasks turns task names (0_N or N, several in one name when separated
// by commas) into sorted distinct partitions.
func ParseTasks(names []string) ([]int32, error) {
	var out []int32
	for _, n := range names {
		for _, one := range strings.Split(n, ",") {
			one = strings.TrimSpace(one)
			p, err := strconv.ParseInt(strings.TrimPrefix(one, "0_"), 10, 32)
			if err != nil || p < 0 {
				return nil, fmt.Errorf("%q: a task is 0_<partition>, e.g. 0_1", one)
			}
			if !slices.Contains(out, int32(p)) {
				out = append(out, int32(p))
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// Select returns the tasks of the dir that want names, or all of them when
// want is empty. A task the dir does not hold is an error naming those it
// does.
func (d *Dir) Select(want []int32) ([]int32, error) {
	have, err := d.Tasks()
	if err != nil {
		return nil, err
	}
	if len(want) == 0 {
		return have, nil
	}
	for _, p := range want {
		if !slices.Contains(have, p) {
			names := make([]string, len(have))
			for i, h := range have {
				names[i] = TaskName(h)
			}
			return nil, fmt.Errorf("no task %s in %s (tasks: %s)", TaskName(p), d.path, strings.Join(names, ", "))
		}
	}
	return want, nil
}

// TaskSummary is what a task's store holds, as state inspect shows it.
type TaskSummary struct {
	Task string `json:"task"`
	// ChangelogOffset and InputOffset are the checkpoint's (absent without
	// one; InputOffset also when it is -1).
	ChangelogOffset  *int64 `json:"checkpoint_changelog_offset"`
	InputOffset      *int64 `json:"checkpoint_input_offset,omitempty"`
	Products         int64  `json:"products"`
	SumOfTotals      int64  `json:"sum_of_totals"`
	Error            string `json:"error,omitempty"`
	ChangelogTopicID string `json:"changelog_topic_id,omitempty"`
}

// Inspect summarizes the store of every task in the dir, reading each one
// read-only. A store that cannot be read has its error in its summary.
func (d *Dir) Inspect() ([]TaskSummary, error) {
	parts, err := d.Tasks()
	if err != nil {
		return nil, err
	}
	var out []TaskSummary
	for _, p := range parts {
		out = append(out, d.inspect(p))
	}
	return out, nil
}

func (d *Dir) inspect(p int32) TaskSummary {
	v := TaskSummary{Task: TaskName(p)}
	s, err := Open(d.TaskPath(p), zap.NewNop(), OpenOptions{ReadOnly: true})
	if err != nil {
		v.Error = err.Error()
		return v
	}
	defer s.Close()
	if cp, ok, err := s.Checkpoint(); err != nil {
		v.Error = err.Error()
	} else if ok {
		v.ChangelogOffset, v.InputOffset = &cp.ChangelogOffset, &cp.InputOffset
		v.ChangelogTopicID = fmt.Sprintf("%x", cp.ChangelogTopicID)
	}
	if v.Products, v.SumOfTotals, err = s.Count(); err != nil {
		v.Error = err.Error()
	}
	return v
}

// Totals reads every product's total from a store, read-only, with its
// checkpoint (found false when it has none).
func Totals(path string) (totals map[string]int64, cp Checkpoint, found bool, err error) {
	s, err := Open(path, zap.NewNop(), OpenOptions{ReadOnly: true})
	if err != nil {
		return nil, Checkpoint{}, false, err
	}
	defer s.Close()
	if cp, found, err = s.Checkpoint(); err != nil {
		return nil, cp, found, err
	}
	totals = map[string]int64{}
	if err := s.Each(1000, func(t Total) error { totals[t.Product] = t.Total; return nil }); err != nil {
		return nil, cp, found, err
	}
	return totals, cp, found, nil
}

// EachTotal calls fn with every product's total of partition's store, in
// product order, reading it read-only (Store.Each).
func (d *Dir) EachTotal(partition int32, fn func(Total) error) error {
	s, err := Open(d.TaskPath(partition), zap.NewNop(), OpenOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Each(1000, fn)
}

// EachWindow calls fn with every window of size in the store of task
// partition, opened read-only, by start and then product.
func (d *Dir) EachWindow(partition int32, size time.Duration, fn func(WindowTotal) error) error {
	s, err := Open(d.TaskPath(partition), zap.NewNop(), OpenOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Windows(size).Each(fn)
}

// PeekProcessID returns the process id kept in <stateDir>/<appID>'s
// process-metadata file, without taking the lock or writing anything: ""
// when there is none yet (the first start makes one).
func PeekProcessID(stateDir, appID string) (string, error) {
	b, err := readNoFollow(filepath.Join(stateDir, appID, metadataFileName))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading process metadata in %s: %w", filepath.Join(stateDir, appID), linkError(err))
	}
	var md processMetadata
	if json.Unmarshal(b, &md) != nil {
		return "", nil // the next start writes a new one
	}
	return md.ProcessID, nil
}

// ErrKafkaStreamsDir is OpenExistingDir's error for a Kafka Streams
// application's state dir (RocksDB stores), which salesagg cannot read.
var ErrKafkaStreamsDir = errors.New("state: a Kafka Streams state dir (RocksDB), not salesagg's")

// kafkaStreamsLayout reports whether the application dir path holds what
// Kafka Streams writes there: its kafka-streams-process-metadata file, or
// task dirs with a rocksdb/ dir or a .checkpoint file.
func kafkaStreamsLayout(path string) bool {
	if _, err := os.Lstat(filepath.Join(path, "kafka-streams-process-metadata")); err == nil {
		return true
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		for _, name := range []string{"rocksdb", ".checkpoint"} {
			if _, err := os.Lstat(filepath.Join(path, e.Name(), name)); err == nil {
				return true
			}
		}
	}
	return false
}
