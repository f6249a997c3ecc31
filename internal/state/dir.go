package state

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	lockFileName     = ".lock"
	metadataFileName = "process-metadata"
	// trashDirName holds task directories being deleted: a wipe renames
	// the directory here (one atomic step) before it deletes it, and
	// OpenDir empties it, so that a crash in the middle of a deletion
	// never leaves a half-deleted store where the task looks for one.
	trashDirName = "trash"
)

// ErrLocked is returned by OpenDir when another process holds the state dir.
var ErrLocked = errors.New("state: state dir is locked by another process")

// Dir is an application's state directory, locked for the life of the
// process. It is safe for concurrent use.
type Dir struct {
	path      string
	lock      *os.File
	processID string
}

// OpenDir creates <stateDir>/<appID> if needed, takes its lock and loads (or
// creates) the process id. It fails with an error wrapping ErrLocked, naming
// the lock file and its holder, when another process holds the lock.
//
// The state dir holds every total: <appID> and what it holds are the
// process user's alone (0700 directories, 0600 files), and nothing in it may
// be a symbolic link (one planted there would make this process write
// where it points). appID must be one path segment.
func OpenDir(stateDir, appID string) (*Dir, error) {
	if err := CheckSegment(appID); err != nil {
		return nil, fmt.Errorf("application.id %q: %w", appID, err)
	}
	path := filepath.Join(stateDir, appID)
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir %s: %w", stateDir, err)
	}
	if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating state dir %s: %w", path, err)
	}
	if err := checkPrivateDir(path); err != nil {
		return nil, err
	}
	lock, err := acquireLock(filepath.Join(path, lockFileName))
	if err != nil {
		return nil, err
	}
	d := &Dir{path: path, lock: lock}
	if d.processID, err = loadProcessID(filepath.Join(path, metadataFileName)); err != nil {
		_ = d.Close()
		return nil, err
	}
	// What a wipe left when the process died deleting it.
	if err := os.RemoveAll(filepath.Join(path, trashDirName)); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("emptying %s: %w", filepath.Join(path, trashDirName), err)
	}
	return d, nil
}

func acquireLock(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock file %s: %w", name, linkError(err))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(name)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			h := strings.TrimSpace(string(holder))
			if h == "" {
				h = "unknown holder"
			}
			return nil, fmt.Errorf("%w: lock file %s is held by %s; one process per state dir (stop it, or give this one another state.dir)", ErrLocked, name, h)
		}
		return nil, fmt.Errorf("locking %s: %w", name, err)
	}
	host, _ := os.Hostname()
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(fmt.Sprintf("pid=%d host=%s\n", os.Getpid(), host)), 0)
	}
	return f, nil
}

type processMetadata struct {
	ProcessID string `json:"processId"`
}

func loadProcessID(name string) (string, error) {
	b, err := readNoFollow(name)
	if err == nil {
		var md processMetadata
		if json.Unmarshal(b, &md) == nil && md.ProcessID != "" {
			return md.ProcessID, nil
		}
		// A corrupt metadata file only costs the old id: write a new one.
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("reading process metadata %s: %w", name, linkError(err))
	}
	md := processMetadata{ProcessID: newUUID()}
	b, _ = json.Marshal(md)
	if err := writeFileAtomic(name, append(b, '\n')); err != nil {
		return "", fmt.Errorf("writing process metadata %s: %w", name, err)
	}
	return md.ProcessID, nil
}

func newUUID() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:])
}

// writeFileAtomic writes data to name through a new temporary file (any
// file or link left at its name is removed first, never followed).
func writeFileAtomic(name string, data []byte) error {
	tmp := name + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return linkError(err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// readNoFollow reads a file that must not be a symbolic link.
func readNoFollow(name string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// ErrSymlink is returned for a symbolic link where the state dir expects a
// file or directory of its own.
var ErrSymlink = errors.New("state: refusing a symbolic link in the state dir")

// linkError turns the error of opening a symbolic link with O_NOFOLLOW
// (ELOOP) into ErrSymlink.
func linkError(err error) error {
	if errors.Is(err, syscall.ELOOP) {
		return fmt.Errorf("%w: %w", ErrSymlink, err)
	}
	return err
}

// checkPrivateDir checks that path is a directory, not a symbolic link,
// and makes it the owner's alone (0700) when it is not.
func checkPrivateDir(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s", ErrSymlink, path)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o700); err != nil {
			return fmt.Errorf("making %s private (0700): %w", path, err)
		}
	}
	return nil
}

// CheckSegment checks that s names one directory entry: not empty, not
// "." or "..", without a path separator or NUL.
func CheckSegment(s string) error {
	switch {
	case s == "":
		return errors.New("must not be empty")
	case s == "." || s == "..":
		return errors.New("must not be '.' or '..'")
	case strings.ContainsAny(s, "/\\\x00"):
		return errors.New("must not hold a path separator")
	}
	return nil
}

// Path returns <state.dir>/<application.id>.
func (d *Dir) Path() string { return d.path }

// ProcessID returns the stable id of this state dir's process, kept across
// restarts in the process-metadata file.
func (d *Dir) ProcessID() string { return d.processID }

// TaskName returns the name of the task (and of its directory) that owns the
// given partition of the single sub-topology: "0_<partition>".
func TaskName(partition int32) string { return "0_" + strconv.Itoa(int(partition)) }

// IsTaskName reports whether s is a task's name as TaskName writes it.
func IsTaskName(s string) bool {
	_, ok := ParseTaskName(s)
	return ok
}

// ParseTaskName returns the partition of the task named s, as TaskName
// writes it; ok is false for anything else.
func ParseTaskName(s string) (partition int32, ok bool) {
	rest, ok := strings.CutPrefix(s, "0_")
	if !ok {
		return 0, false
	}
	p, err := strconv.ParseInt(rest, 10, 32)
	if err != nil || p < 0 || strconv.FormatInt(p, 10) != rest {
		return 0, false
	}
	return int32(p), true
}

// TaskPath returns the directory of the task owning partition.
func (d *Dir) TaskPath(partition int32) string { return filepath.Join(d.path, TaskName(partition)) }

// Tasks returns the partitions that have a task directory, sorted.
func (d *Dir) Tasks() ([]int32, error) { return listTasks(d.path) }

func listTasks(path string) ([]int32, error) {
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("listing tasks in %s: %w", path, err)
	}
	var ps []int32
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "0_")
		if !ok {
			continue
		}
		p, err := strconv.ParseInt(rest, 10, 32)
		if err != nil || p < 0 {
			continue
		}
		ps = append(ps, int32(p))
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps, nil
}

// Wipe deletes the task directory of partition. The task's store must be
// closed.
//
// The wipe is atomic: the directory is first renamed into the state dir's
// trash (gone from where the task looks at once), then deleted; a crash in
// between leaves it in the trash, which the next OpenDir empties.
func (d *Dir) Wipe(partition int32) error {
	aside, err := d.moveToTrash(partition)
	if err != nil || aside == "" {
		return err
	}
	if err := os.RemoveAll(aside); err != nil {
		return fmt.Errorf("wiping task %s: %w", TaskName(partition), err)
	}
	return nil
}

// moveToTrash renames the task directory of partition into the trash and
// returns where it went ("" when there was none).
func (d *Dir) moveToTrash(partition int32) (string, error) {
	from := d.TaskPath(partition)
	if _, err := os.Lstat(from); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	trash := filepath.Join(d.path, trashDirName)
	if err := os.MkdirAll(trash, 0o700); err != nil {
		return "", fmt.Errorf("wiping task %s: %w", TaskName(partition), err)
	}
	to := filepath.Join(trash, TaskName(partition)+"-"+time.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Rename(from, to); err != nil {
		return "", fmt.Errorf("wiping task %s: %w", TaskName(partition), err)
	}
	if err := syncDir(d.path); err != nil {
		return "", fmt.Errorf("wiping task %s: %w", TaskName(partition), err)
	}
	return to, nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ErrUnwritable is returned by CheckWritable when a task's store cannot take
// writes: the disk is (nearly) full, read-only, or failing.
var ErrUnwritable = errors.New("state: store cannot be written")

// ErrNoFileDescriptors is returned by CheckWritable when the process is out
// of file descriptors (RLIMIT_NOFILE): the disk could not be checked, which
// is no reason to stall.
var ErrNoFileDescriptors = errors.New("state: out of file descriptors")

// MinFreeBytes is the free space below which a store counts as unwritable.
// Pebble treats a failed write to its log as fatal to the process, so the
// check is made before each write, with this margin.
const MinFreeBytes = 32 << 20

// CheckWritable tells whether the task directory of partition can take a
// write: it has MinFreeBytes free and a small probe file can be written and
// removed. It does not touch the store.
func (d *Dir) CheckWritable(partition int32) error {
	dir := d.TaskPath(partition)
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnwritable, dir, err)
	}
	if free := st.Bavail * uint64(st.Bsize); free < MinFreeBytes {
		return fmt.Errorf("%w: %s: %d bytes free, %d needed", ErrUnwritable, dir, free, MinFreeBytes)
	}
	probe := filepath.Join(dir, ".write-probe")
	_ = os.Remove(probe) // a leftover, or a planted link: never written through
	f, err := os.OpenFile(probe, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err == nil {
		_, err = f.Write([]byte("ok"))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		// Out of file descriptors says nothing of the disk: not a stall.
		return fmt.Errorf("%w: %s: %v", ErrNoFileDescriptors, dir, err)
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnwritable, dir, err)
	}
	if err := os.Remove(probe); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnwritable, dir, err)
	}
	return nil
}

// Quarantine moves the task directory of partition aside, to
// <app>/quarantine/0_<partition>-<time>, for an operator to inspect, and
// returns where it went. The task's store must be closed.
func (d *Dir) Quarantine(partition int32) (string, error) {
	qdir := filepath.Join(d.path, "quarantine")
	if err := os.MkdirAll(qdir, 0o700); err != nil {
		return "", fmt.Errorf("quarantining task %s: %w", TaskName(partition), err)
	}
	to := filepath.Join(qdir, TaskName(partition)+"-"+time.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Rename(d.TaskPath(partition), to); err != nil {
		return "", fmt.Errorf("quarantining task %s: %w", TaskName(partition), err)
	}
	return to, nil
}

// Close releases the lock. The lock file stays; its content names the last
// holder.
func (d *Dir) Close() error {
	if d.lock == nil {
		return nil
	}
	_ = syscall.Flock(int(d.lock.Fd()), syscall.LOCK_UN)
	err := d.lock.Close()
	d.lock = nil
	return err
}

// LockHolder returns the content of the lock file of <stateDir>/<appID>
// ("pid=N host=H"), or "" when there is none.
func LockHolder(stateDir, appID string) string {
	b, _ := os.ReadFile(filepath.Join(stateDir, appID, lockFileName))
	return string(bytes.TrimSpace(b))
}
