package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

const stateUsage = `usage:
  salesagg state inspect --state-dir DIR [--application.id ID] [--json]
  salesagg state verify  --state-dir DIR [--application.id ID] [--bootstrap.servers B] [--task 0_N ...]
  salesagg state reset   --state-dir DIR [--application.id ID] --task 0_N [--task ...]

Each takes the state dir's lock: it refuses to run while the service runs on that state dir.`

// runState implements "salesagg state inspect|verify|reset", offline tools
// on a stopped service's state dir.
func runState(args []string) error {
	if len(args) == 0 {
		return usageError{errors.New(stateUsage)}
	}
	switch args[0] {
	case "inspect":
		return runStateInspect(args[1:])
	case "verify":
		return runStateVerify(args[1:], os.Stdout)
	case "reset":
		return runStateReset(args[1:], os.Stdout)
	case "help", "-h", "--help":
		fmt.Println(stateUsage)
		return nil
	default:
		return usageError{fmt.Errorf("unknown state command %q\n%s", args[0], stateUsage)}
	}
}

// stateFlags registers the flags every state command has, defaulting to
// the service's own defaults.
func stateFlags(name string) (fs *pflag.FlagSet, stateDir, appID *string) {
	def := config.Default()
	fs = pflag.NewFlagSet("state "+name, pflag.ContinueOnError)
	stateDir = fs.String("state-dir", def.StateDir, "the service's state.dir")
	appID = fs.String("application.id", def.ApplicationID, "the service's application.id")
	return fs, stateDir, appID
}

// openStateDir takes the lock of an existing <stateDir>/<appID>.
func openStateDir(stateDir, appID string) (*state.Dir, error) {
	if _, err := os.Stat(filepath.Join(stateDir, appID)); err != nil {
		return nil, fmt.Errorf("no state for application %s in %s: %w", appID, stateDir, err)
	}
	dir, err := state.OpenDir(stateDir, appID)
	if errors.Is(err, state.ErrLocked) {
		return nil, fmt.Errorf("refusing while the service runs: %w", err)
	}
	return dir, err
}

// parseTasks turns task names (0_N, or N) into partitions.
func parseTasks(names []string) ([]int32, error) {
	var out []int32
	for _, n := range names {
		for _, one := range strings.Split(n, ",") {
			one = strings.TrimSpace(one)
			p, err := strconv.ParseInt(strings.TrimPrefix(one, "0_"), 10, 32)
			if err != nil || p < 0 {
				return nil, usageError{fmt.Errorf("--task %q: a task is 0_<partition>, e.g. 0_1", one)}
			}
			if !slices.Contains(out, int32(p)) {
				out = append(out, int32(p))
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

func runStateInspect(args []string) error {
	fs, stateDir, appID := stateFlags("inspect")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := config.ParseFlags(fs, args); err != nil {
		return usageError{err}
	}
	dir, err := openStateDir(*stateDir, *appID)
	if err != nil {
		return err
	}
	defer dir.Close()
	parts, err := dir.Tasks()
	if err != nil {
		return err
	}
	type taskView struct {
		Task             string `json:"task"`
		Checkpoint       *int64 `json:"checkpoint_changelog_offset"`
		InputOffset      *int64 `json:"checkpoint_input_offset,omitempty"`
		Products         int64  `json:"products"`
		SumOfTotals      int64  `json:"sum_of_totals"`
		Error            string `json:"error,omitempty"`
		ChangelogTopicID string `json:"changelog_topic_id,omitempty"`
	}
	var views []taskView
	for _, p := range parts {
		v := taskView{Task: state.TaskName(p)}
		s, err := state.Open(dir.TaskPath(p), zap.NewNop(), state.OpenOptions{ReadOnly: true})
		if err != nil {
			v.Error = err.Error()
			views = append(views, v)
			continue
		}
		if cp, ok, err := s.Checkpoint(); err != nil {
			v.Error = err.Error()
		} else if ok {
			v.Checkpoint, v.InputOffset = &cp.ChangelogOffset, &cp.InputOffset
			v.ChangelogTopicID = fmt.Sprintf("%x", cp.ChangelogTopicID)
		}
		if v.Products, v.SumOfTotals, err = s.Count(); err != nil {
			v.Error = err.Error()
		}
		_ = s.Close()
		views = append(views, v)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"state_dir": dir.Path(), "process_id": dir.ProcessID(), "tasks": views})
	}
	fmt.Printf("state dir:  %s\nprocess id: %s\n\n", dir.Path(), dir.ProcessID())
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tCHECKPOINT\tINPUT OFFSET\tPRODUCTS\tSUM OF TOTALS\tERROR")
	for _, v := range views {
		cp, in := "none", "-"
		if v.Checkpoint != nil {
			cp = fmt.Sprint(*v.Checkpoint)
			if *v.InputOffset >= 0 {
				in = fmt.Sprint(*v.InputOffset)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", v.Task, cp, in, v.Products, v.SumOfTotals, v.Error)
	}
	return tw.Flush()
}

// runStateReset wipes the stores of the tasks named, so that the next start
// restores them from the changelog.
func runStateReset(args []string, out io.Writer) error {
	fs, stateDir, appID := stateFlags("reset")
	tasks := fs.StringSlice("task", nil, "the task to wipe, 0_<partition> (repeat or separate with commas for several)")
	if err := config.ParseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if len(*tasks) == 0 {
		return usageError{errors.New("--task is required, e.g. --task 0_1 (salesagg state inspect lists the tasks)")}
	}
	parts, err := parseTasks(*tasks)
	if err != nil {
		return err
	}
	dir, err := openStateDir(*stateDir, *appID)
	if err != nil {
		return err
	}
	defer dir.Close()
	have, err := dir.Tasks()
	if err != nil {
		return err
	}
	for _, p := range parts {
		if !slices.Contains(have, p) {
			names := make([]string, len(have))
			for i, h := range have {
				names[i] = state.TaskName(h)
			}
			return fmt.Errorf("no task %s in %s (tasks: %s)", state.TaskName(p), dir.Path(), strings.Join(names, ", "))
		}
	}
	for _, p := range parts {
		if err := dir.Wipe(p); err != nil {
			return err
		}
		fmt.Fprintf(out, "task %s: store removed; the next start restores it from the start of its changelog partition %d\n", state.TaskName(p), p)
	}
	return nil
}

// runStateVerify compares each task's store with its changelog partition,
// key by key, as of the store's checkpoint. It returns an error (exit 1)
// when any differs.
func runStateVerify(args []string, out io.Writer) error {
	fs, stateDir, appID := stateFlags("verify")
	servers := fs.String("bootstrap.servers", defaultBootstrap(), "Kafka brokers, comma separated (env KAFKA_BOOTSTRAP_SERVERS)")
	storeName := fs.String("store.name", config.Default().StoreName, "the service's store.name (names the changelog)")
	tasks := fs.StringSlice("task", nil, "verify only this task, 0_<partition> (repeatable; default: every task in the state dir)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up reading the changelog after this long")
	if err := config.ParseFlags(fs, args); err != nil {
		return usageError{err}
	}
	dir, err := openStateDir(*stateDir, *appID)
	if err != nil {
		return err
	}
	defer dir.Close()
	parts, err := dir.Tasks()
	if err != nil {
		return err
	}
	if len(*tasks) > 0 {
		want, err := parseTasks(*tasks)
		if err != nil {
			return err
		}
		for _, p := range want {
			if !slices.Contains(parts, p) {
				return fmt.Errorf("no task %s in %s", state.TaskName(p), dir.Path())
			}
		}
		parts = want
	}
	if len(parts) == 0 {
		return fmt.Errorf("no task stores in %s", dir.Path())
	}
	topic := config.Config{ApplicationID: *appID, StoreName: *storeName}.ChangelogTopic()

	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*servers, ",")...), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("describing changelog %s at %s: %w", topic, *servers, err)
	}
	td, ok := details[topic]
	if !ok || td.Err != nil {
		return fmt.Errorf("changelog %s at %s: %v", topic, *servers, td.Err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("listing start offsets of %s: %w", topic, err)
	}
	// The last stable offset: the end of what read_committed returns.
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("listing end offsets of %s: %w", topic, err)
	}

	fmt.Fprintf(out, "state dir %s, changelog %s at %s\n", dir.Path(), topic, *servers)
	failed := 0
	for _, p := range parts {
		rep := verifyTask(ctx, cl, dir, p, topic, [16]byte(td.ID), starts, ends)
		rep.print(out)
		if len(rep.problems) > 0 || len(rep.diffs) > 0 {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tasks differ from the changelog", failed, len(parts))
	}
	fmt.Fprintf(out, "all %d tasks match their changelog\n", len(parts))
	return nil
}

// verifyReport is the outcome of one task's verification.
type verifyReport struct {
	task        string
	checkpoint  int64 // -1: none
	start, end  int64
	products    int
	pending     int      // changelog records past the checkpoint
	unverified  []string // products whose records up to the checkpoint were compacted away
	diffs       []string
	problems    []string // the comparison could not be made
	readRecords int
}

func (r verifyReport) print(out io.Writer) {
	cp := "none"
	if r.checkpoint >= 0 {
		cp = strconv.FormatInt(r.checkpoint, 10)
	}
	fmt.Fprintf(out, "task %s: checkpoint %s, changelog offsets %d..%d, %d products in the store",
		r.task, cp, r.start, r.end, r.products)
	if r.pending > 0 {
		fmt.Fprintf(out, ", %d changelog records past the checkpoint (the next start restores them)", r.pending)
	}
	fmt.Fprintln(out)
	for _, p := range r.problems {
		fmt.Fprintf(out, "  cannot verify: %s\n", p)
	}
	if len(r.unverified) > 0 {
		fmt.Fprintf(out, "  not verifiable (their records up to the checkpoint were compacted away): %s\n", strings.Join(r.unverified, ", "))
	}
	for _, d := range r.diffs {
		fmt.Fprintf(out, "  DIFFERS %s\n", d)
	}
	if len(r.problems) == 0 && len(r.diffs) == 0 {
		fmt.Fprintf(out, "  OK: every product matches the changelog as of the checkpoint\n")
	}
}

func verifyTask(ctx context.Context, cl *kgo.Client, dir *state.Dir, p int32, topic string, topicID [16]byte,
	starts, ends kadm.ListedOffsets) verifyReport {
	rep := verifyReport{task: state.TaskName(p), checkpoint: -1}
	if o, ok := starts.Lookup(topic, p); ok {
		rep.start = o.Offset
	}
	end, ok := ends.Lookup(topic, p)
	if !ok || end.Err != nil {
		rep.problems = append(rep.problems, fmt.Sprintf("changelog %s has no partition %d", topic, p))
		return rep
	}
	rep.end = end.Offset

	store, err := readStore(dir.TaskPath(p))
	if err != nil {
		rep.problems = append(rep.problems, err.Error())
		return rep
	}
	rep.products = len(store.totals)
	if store.hasCheckpoint {
		rep.checkpoint = store.checkpoint.ChangelogOffset
		if store.checkpoint.ChangelogTopicID != topicID {
			rep.diffs = append(rep.diffs, fmt.Sprintf("checkpoint: it is of changelog topic id %x, the changelog now is %x (recreated since): the next start wipes the store",
				store.checkpoint.ChangelogTopicID, topicID))
			return rep
		}
		if rep.checkpoint > rep.end {
			rep.diffs = append(rep.diffs, fmt.Sprintf("checkpoint %d is beyond the changelog's end %d", rep.checkpoint, rep.end))
			return rep
		}
	}
	cpOffset := max(rep.checkpoint, 0)
	log, err := readChangelog(ctx, cl, topic, p, rep.start, rep.end, cpOffset)
	if err != nil {
		rep.problems = append(rep.problems, err.Error())
		return rep
	}
	rep.readRecords = log.records
	rep.pending = log.pending
	rep.diffs, rep.unverified = compareStore(store.totals, log)
	return rep
}

type storeContent struct {
	totals        map[string]int64
	checkpoint    state.Checkpoint
	hasCheckpoint bool
}

func readStore(path string) (storeContent, error) {
	s, err := state.Open(path, zap.NewNop(), state.OpenOptions{ReadOnly: true})
	if err != nil {
		return storeContent{}, err
	}
	defer s.Close()
	c := storeContent{totals: map[string]int64{}}
	if c.checkpoint, c.hasCheckpoint, err = s.Checkpoint(); err != nil {
		return c, err
	}
	for after := ""; ; {
		page, err := s.Scan(after, 1000)
		if err != nil {
			return c, err
		}
		for _, t := range page {
			c.totals[t.Product] = t.Total
		}
		if len(page) < 1000 {
			return c, nil
		}
		after = page[len(page)-1].Product
	}
}

// changelogValue is a product's latest record in a changelog partition up
// to some offset.
type changelogValue struct {
	total     int64
	offset    int64
	tombstone bool
	bad       string // an undecodable value
}

// changelogContent is what one changelog partition says, split at a
// store's checkpoint.
type changelogContent struct {
	// atCheckpoint is each product's latest committed record below the
	// checkpoint.
	atCheckpoint map[string]changelogValue
	// later holds the products with a record at or past the checkpoint.
	later   map[string]bool
	records int
	pending int
}

// readChangelog reads partition p of topic from start to end (the last
// stable offset), committed records only. It also stops when a fetch of a
// few seconds brings nothing more (the last offsets were removed, e.g. a
// transaction marker by compaction).
func readChangelog(ctx context.Context, cl *kgo.Client, topic string, p int32, start, end, checkpoint int64) (changelogContent, error) {
	c := changelogContent{atCheckpoint: map[string]changelogValue{}, later: map[string]bool{}}
	if end <= start {
		return c, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().At(start)}})
	defer cl.RemoveConsumePartitions(map[string][]int32{topic: {p}})
	seen := 0
	for {
		pollCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		fs := cl.PollFetches(pollCtx)
		idle := pollCtx.Err() != nil && fs.NumRecords() == 0
		cancel()
		if err := ctx.Err(); err != nil {
			return c, fmt.Errorf("reading %s-%d up to offset %d: %w", topic, p, end, err)
		}
		if idle {
			if seen == 0 {
				return c, fmt.Errorf("reading %s-%d: no record of offsets %d..%d came within 5 s", topic, p, start, end)
			}
			return c, nil
		}
		var fetchErr error
		fs.EachError(func(t string, part int32, err error) {
			if t == topic && part == p && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				fetchErr = err
			}
		})
		if fetchErr != nil {
			return c, fmt.Errorf("reading %s-%d: %w", topic, p, fetchErr)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic != topic || r.Partition != p || done {
				return
			}
			seen++
			if r.Offset+1 >= end {
				done = true
			}
			if r.Attrs.IsControl() || r.Offset >= end {
				return
			}
			c.records++
			key := string(r.Key)
			if r.Offset >= checkpoint {
				c.pending++
				c.later[key] = true
				return
			}
			v := changelogValue{offset: r.Offset, tombstone: r.Value == nil}
			if !v.tombstone {
				if t, err := sales.DecodeTotal(r.Value); err != nil {
					v.bad = err.Error()
				} else {
					v.total = t
				}
			}
			c.atCheckpoint[key] = v
		})
		if done {
			return c, nil
		}
	}
}

// compareStore compares a store's totals with the changelog as of the
// store's checkpoint. It returns the differences, and the products that
// cannot be verified: in the store, with no record below the checkpoint but
// one past it (compaction removed the older ones).
func compareStore(store map[string]int64, log changelogContent) (diffs, unverified []string) {
	keys := map[string]bool{}
	for k := range store {
		keys[k] = true
	}
	for k, v := range log.atCheckpoint {
		if !v.tombstone {
			keys[k] = true
		}
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		s, inStore := store[k]
		v, inLog := log.atCheckpoint[k]
		switch {
		case inLog && v.bad != "":
			diffs = append(diffs, fmt.Sprintf("%q: the changelog record at offset %d is unreadable: %s", k, v.offset, v.bad))
		case inStore && (!inLog || v.tombstone):
			if !inLog && log.later[k] {
				unverified = append(unverified, strconv.Quote(k))
				continue
			}
			what := "no record"
			if inLog {
				what = fmt.Sprintf("a tombstone at offset %d", v.offset)
			}
			diffs = append(diffs, fmt.Sprintf("%q: store %d, changelog %s below the checkpoint", k, s, what))
		case !inStore:
			diffs = append(diffs, fmt.Sprintf("%q: not in the store, changelog %d at offset %d", k, v.total, v.offset))
		case s != v.total:
			diffs = append(diffs, fmt.Sprintf("%q: store %d, changelog %d at offset %d", k, s, v.total, v.offset))
		}
	}
	return diffs, unverified
}
