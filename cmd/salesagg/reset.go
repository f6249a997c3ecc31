package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"golang.org/x/term"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/internal/state"
)

const resetAbout = `Does for salesagg what kafka-streams-application-reset does, and the local part too: with every
instance of the application stopped, it moves the group's committed input offsets (to the start
by default), deletes the application's internal topics (<application.id>-*-changelog and
-repartition) with the group's offsets on them, and wipes the task stores under
<state.dir>/<application.id>. The next start restores nothing and reprocesses the input from
there. application.id and input.topic are read as run reads them (--config, SALESAGG_*, the
flags); application.id must be given. It refuses while the group has members, asks before it
acts (on a terminal; --yes otherwise) and --dry-run prints what it would do. An application
whose group is gone still has its internal topics deleted and its local state wiped.`

// resetOptions are the flags of `salesagg reset`.
type resetOptions struct {
	appID, servers, stateDir, toDatetime string
	cfg                                  config.Config // the brokers and their security
	inputs                               []string
	toEarliest, toLatest, yes, dryRun    bool
	at                                   time.Time // --to-datetime parsed
}

// resetPlan is what a reset does, found before anything is changed.
type resetPlan struct {
	target   string       // "the earliest offsets", ...
	current  kadm.Offsets // the group's committed input offsets (may lack partitions)
	offsets  kadm.Offsets // the input offsets to commit
	internal []string     // internal topics to delete
	dropped  kadm.TopicsSet
	dir      *state.Dir // the locked local state, nil when there is none
	tasks    []int32    // its task stores
	// noGroup: the broker knows no group of the application (deleted, or
	// it never committed): there are no offsets to move, and the internal
	// topics and the local state are cleaned up all the same.
	noGroup bool
}

// runReset implements `salesagg reset`.
func runReset(args []string, in *os.File, out io.Writer) error {
	o, err := parseReset(args)
	if err != nil {
		return err
	}
	cl, err := newKafkaClient(o.cfg)
	if err != nil {
		return fmt.Errorf("creating the client for %s: %w", o.servers, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	plan, err := planReset(ctx, adm, o)
	if plan.dir != nil {
		defer plan.dir.Close()
	}
	if err != nil {
		return err
	}
	printPlan(out, o, plan)
	if o.dryRun {
		fmt.Fprintln(out, "Dry run: nothing was changed.")
		return nil
	}
	if err := confirmReset(in, out, o); err != nil {
		return err
	}
	return applyReset(ctx, adm, o, plan, out)
}

// parseReset parses and checks the flags, every problem at once.
// application.id, input.topic, state.dir and the Kafka keys are read as
// run reads them; application.id must be set (by a flag, SALESAGG_* or the
// file): a reset of the default application by omission would be a
// surprise. The old --input-topics still works, hidden.
func parseReset(args []string) (resetOptions, error) {
	var o resetOptions
	fs := pflag.NewFlagSet("reset", pflag.ContinueOnError)
	config.RegisterKeyFlags(fs, append([]string{"application.id", "input.topic", "state.dir"}, config.ClientKeys()...)...)
	config.AliasFlag(fs, "input-topics", "input.topic")
	fs.BoolVar(&o.toEarliest, "to-earliest", false, "reset the input offsets to the start of each partition (the default)")
	fs.StringVar(&o.toDatetime, "to-datetime", "", "reset the input offsets to the first record at or after this RFC 3339 time, e.g. 2026-01-02T15:04:05Z")
	fs.BoolVar(&o.toLatest, "to-latest", false, "reset the input offsets to the end: skip what the input holds now")
	fs.BoolVar(&o.yes, "yes", false, "do not ask for confirmation (needed without a terminal)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print what would be done, change nothing")
	commandUsage(fs, "reset --application.id A [--input.topic T] [--to-earliest | --to-datetime RFC3339 | --to-latest] [--state.dir D] [--yes] [--dry-run]", resetAbout)
	var problems []error
	if err := config.ParseFlags(fs, args); errors.Is(err, pflag.ErrHelp) {
		return o, err
	} else if err != nil {
		problems = append(problems, err)
	}
	cfg, settings, err := config.Resolve(fs, os.Environ())
	if err != nil {
		problems = append(problems, err)
	}
	o.cfg, o.servers = cfg, strings.Join(cfg.BootstrapServers, ",")
	o.appID, o.stateDir, o.inputs = cfg.ApplicationID, cfg.StateDir, []string{cfg.InputTopic}
	for _, st := range settings {
		if st.Key == "application.id" && st.Origin.Source == config.FromDefault {
			problems = append(problems, errors.New("--application.id is required (the service's application.id, or SALESAGG_APPLICATION_ID or the file's; it names the group and the internal topics)"))
		}
	}
	targets := 0
	for _, set := range []bool{o.toEarliest, o.toDatetime != "", o.toLatest} {
		if set {
			targets++
		}
	}
	if targets > 1 {
		problems = append(problems, errors.New("--to-earliest, --to-datetime and --to-latest: give at most one"))
	}
	if o.toDatetime != "" {
		at, err := time.Parse(time.RFC3339, o.toDatetime)
		if err != nil {
			problems = append(problems, fmt.Errorf("--to-datetime = %q: not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z or 2026-01-02T15:04:05+01:00)", o.toDatetime))
		}
		o.at = at
	}
	if len(problems) > 0 {
		return o, usageError{errors.Join(problems...)}
	}
	return o, nil
}

// planReset finds what the reset does, refusing while the group has
// members or a process holds the local state. The local state's lock is
// taken (plan.dir) and held until the caller closes it, so that no service
// starts on it meanwhile.
func planReset(ctx context.Context, adm *kadm.Client, o resetOptions) (resetPlan, error) {
	var plan resetPlan
	exists, err := checkNoMembers(ctx, adm, o.appID, o.servers)
	if err != nil {
		return plan, err
	}
	if !exists {
		plan.noGroup = true
		if plan.internal, err = internalTopics(ctx, adm, o.appID); err != nil {
			return plan, err
		}
		plan.dir, plan.tasks, err = lockLocalState(o.stateDir, o.appID)
		return plan, err
	}
	var listed kadm.ListedOffsets
	switch {
	case o.toLatest:
		plan.target = "the latest offsets (the end: what the input holds now is skipped)"
		listed, err = adm.ListEndOffsets(ctx, o.inputs...)
	case o.toDatetime != "":
		plan.target = "the first offsets at or after " + o.at.Format(time.RFC3339)
		listed, err = adm.ListOffsetsAfterMilli(ctx, o.at.UnixMilli(), o.inputs...)
	default:
		plan.target = "the earliest offsets (the start: the input is reprocessed)"
		listed, err = adm.ListStartOffsets(ctx, o.inputs...)
	}
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return plan, fmt.Errorf("listing the offsets of %s at %s: %w", strings.Join(o.inputs, ", "), o.servers, err)
	}
	plan.offsets = listed.Offsets()
	fetched, err := adm.FetchOffsets(ctx, o.appID)
	if err == nil {
		err = fetched.Error()
	}
	if err != nil {
		return plan, fmt.Errorf("fetching the committed offsets of group %s: %w", o.appID, err)
	}
	plan.current = fetched.Offsets()
	if plan.internal, err = internalTopics(ctx, adm, o.appID); err != nil {
		return plan, err
	}
	plan.dropped = kadm.TopicsSet{}
	fetched.Each(func(r kadm.OffsetResponse) {
		if slices.Contains(plan.internal, r.Topic) {
			plan.dropped.Add(r.Topic, r.Partition)
		}
	})
	plan.dir, plan.tasks, err = lockLocalState(o.stateDir, o.appID)
	return plan, err
}

// checkNoMembers refuses while the group has members, naming them. It
// reports whether the group exists: a group the broker does not know
// (GROUP_ID_NOT_FOUND, or Kafka's Dead state) has no members either.
func checkNoMembers(ctx context.Context, adm *kadm.Client, group, servers string) (bool, error) {
	// The first request: bounded tighter, so that a broker that cannot be
	// reached is reported within seconds.
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	groups, err := adm.DescribeGroups(ctx, group)
	if err == nil {
		err = groups.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("describing group %s at %s: %w", group, servers, err)
	}
	g := groups[group]
	if g.State == "Dead" {
		return false, nil
	}
	if len(g.Members) == 0 {
		return true, nil
	}
	names := make([]string, 0, len(g.Members))
	for _, m := range g.Members {
		name := m.MemberID
		if m.InstanceID != nil {
			name = *m.InstanceID + " (member " + m.MemberID + ")"
		}
		names = append(names, name+" at "+m.ClientHost)
	}
	return true, fmt.Errorf("refusing: group %s has %d active members (state %s): %s; stop every instance of the application first",
		group, len(g.Members), g.State, strings.Join(names, ", "))
}

// internalTopics lists the application's internal topics, as
// kafka-streams-application-reset finds them: named <application.id>-...
// and ending in -changelog or -repartition.
func internalTopics(ctx context.Context, adm *kadm.Client, appID string) ([]string, error) {
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the topics: %w", err)
	}
	var out []string
	for _, name := range topics.Names() {
		if strings.HasPrefix(name, appID+"-") && (sales.IsChangelogTopic(name) || strings.HasSuffix(name, "-repartition")) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// lockLocalState takes the lock of <stateDir>/<appID> and lists its task
// stores; no state there is nothing to wipe (nil, nil, nil).
func lockLocalState(stateDir, appID string) (*state.Dir, []int32, error) {
	if _, err := os.Stat(filepath.Join(stateDir, appID)); errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	dir, err := state.OpenExistingDir(stateDir, appID)
	if err != nil {
		return nil, nil, err
	}
	tasks, err := dir.Tasks()
	return dir, tasks, err
}

// printPlan says what the reset does (or would do).
func printPlan(out io.Writer, o resetOptions, plan resetPlan) {
	fmt.Fprintf(out, "Reset of application %s (group %s at %s):\n", o.appID, o.appID, o.servers)
	if plan.noGroup {
		fmt.Fprintf(out, "  input offsets: none to move, group %s does not exist at %s (the next start reads %s from auto.offset.reset)\n",
			o.appID, o.servers, strings.Join(o.inputs, ", "))
	} else {
		fmt.Fprintf(out, "  input offsets to %s:\n", plan.target)
	}
	for _, off := range plan.offsets.Sorted() {
		was := "none"
		if cur, ok := plan.current.Lookup(off.Topic, off.Partition); ok {
			was = fmt.Sprint(cur.At)
		}
		fmt.Fprintf(out, "    %s partition %d: %s -> %d\n", off.Topic, off.Partition, was, off.At)
	}
	if len(plan.internal) == 0 {
		fmt.Fprintln(out, "  internal topics to delete: none")
	} else {
		fmt.Fprintln(out, "  internal topics to delete, with the group's offsets on them:")
		for _, t := range plan.internal {
			fmt.Fprintf(out, "    %s\n", t)
		}
	}
	switch {
	case plan.dir == nil:
		fmt.Fprintf(out, "  local state: none in %s\n", o.stateDir)
	case len(plan.tasks) == 0:
		fmt.Fprintf(out, "  local state to wipe: none (%s holds no task store)\n", plan.dir.Path())
	default:
		names := make([]string, len(plan.tasks))
		for i, p := range plan.tasks {
			names[i] = state.TaskName(p)
		}
		fmt.Fprintf(out, "  local state to wipe: the task stores %s in %s\n", strings.Join(names, ", "), plan.dir.Path())
	}
}

// confirmReset asks on a terminal; without one, --yes is required.
func confirmReset(in *os.File, out io.Writer, o resetOptions) error {
	return confirm(in, out, o.yes, fmt.Sprintf("Reset application %s as above?", o.appID))
}

// confirm asks question on a terminal (in) and needs y or yes; without a
// terminal, yes (--yes) is required. reset and state reset, which destroy
// what cannot be had back, share it.
func confirm(in *os.File, out io.Writer, yes bool, question string) error {
	if yes {
		return nil
	}
	if !term.IsTerminal(int(in.Fd())) {
		return usageError{errors.New("refusing without --yes: standard input is not a terminal to confirm on (--dry-run shows the plan)")}
	}
	fmt.Fprintf(out, "%s This cannot be undone. [y/N] ", question)
	answer, _ := bufio.NewReader(in).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		return errors.New("not confirmed: nothing was changed")
	}
	return nil
}

// applyReset does the plan: the group's offsets on the internal topics go
// first (they would otherwise outlive the topics on a broker that keeps
// them), then the input offsets are committed, the internal topics deleted
// (waiting until the metadata no longer lists them, so that a start right
// after creates them anew) and the task stores wiped.
func applyReset(ctx context.Context, adm *kadm.Client, o resetOptions, plan resetPlan, out io.Writer) error {
	if !plan.noGroup {
		if err := resetOffsets(ctx, adm, o, plan, out); err != nil {
			return err
		}
	}
	if len(plan.internal) > 0 {
		if err := deleteTopics(ctx, adm, plan.internal); err != nil {
			return err
		}
		fmt.Fprintf(out, "Deleted %s.\n", strings.Join(plan.internal, ", "))
	}
	for _, p := range plan.tasks {
		if err := plan.dir.Wipe(p); err != nil {
			return err
		}
	}
	if len(plan.tasks) > 0 {
		fmt.Fprintf(out, "Wiped %d task stores in %s.\n", len(plan.tasks), plan.dir.Path())
	}
	if plan.noGroup {
		fmt.Fprintf(out, "Done: the next start of %s restores nothing and reads the input from auto.offset.reset.\n", o.appID)
		return nil
	}
	fmt.Fprintf(out, "Done: the next start of %s restores nothing and processes the input from the offsets above.\n", o.appID)
	return nil
}

// resetOffsets deletes the group's offsets on the internal topics and
// commits the planned input offsets.
func resetOffsets(ctx context.Context, adm *kadm.Client, o resetOptions, plan resetPlan, out io.Writer) error {
	if len(plan.dropped) > 0 {
		resp, err := adm.DeleteOffsets(ctx, o.appID, plan.dropped)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			return fmt.Errorf("deleting group %s's offsets of %s: %w", o.appID, strings.Join(plan.dropped.Topics(), ", "), err)
		}
	}
	resp, err := adm.CommitOffsets(ctx, o.appID, plan.offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("committing group %s's input offsets: %w", o.appID, err)
	}
	fmt.Fprintf(out, "Committed the input offsets of group %s.\n", o.appID)
	return nil
}

// deleteTopics deletes topics and waits until the metadata lists none of
// them (a deletion is asynchronous on Kafka).
func deleteTopics(ctx context.Context, adm *kadm.Client, topics []string) error {
	resp, err := adm.DeleteTopics(ctx, topics...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("deleting topics %s: %w", strings.Join(topics, ", "), err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		listed, err := adm.ListTopics(ctx, topics...)
		if err == nil && !slices.ContainsFunc(topics, listed.Has) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for topics %s to be deleted: %w", strings.Join(topics, ", "), ctx.Err())
		case <-tick.C:
		}
	}
}
