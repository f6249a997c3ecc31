package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
)

const stateUsage = `Usage: salesagg state inspect|verify|reset|export [--state.dir DIR] [--application.id ID] ...

  salesagg state inspect [--state.dir DIR] [--application.id ID] [--json]
  salesagg state verify  [--state.dir DIR] [--application.id ID] [--bootstrap.servers B] [--task 0_N ...]
  salesagg state reset   [--state.dir DIR] [--application.id ID] --task 0_N [--task ...]
  salesagg state export  [--state.dir DIR] [--task 0_N ...] [--format jsonl|csv] [--output FILE]
  salesagg state export  --from URL [--token-file F] [--ca-file F] [--format jsonl|csv] [--output FILE]

Each reads the configuration as salesagg run does (--config FILE, SALESAGG_<KEY>, the flags; the
same defaults) and takes the state dir's lock: it refuses to run while the service runs on that
state dir (export --from asks a running instance over HTTP instead).`

// runState implements "salesagg state inspect|verify|reset", offline tools
// on a stopped service's state dir.
func runState(args []string, in *os.File) error {
	if len(args) == 0 {
		return usageError{errors.New(stateUsage)}
	}
	switch args[0] {
	case "inspect":
		return runStateInspect(args[1:])
	case "verify":
		return runStateVerify(args[1:], os.Stdout)
	case "reset":
		return runStateReset(args[1:], in, os.Stdout)
	case "export":
		return runStateExport(args[1:], os.Stdout)
	case "help", "-h", "--help":
		fmt.Println(stateUsage)
		return nil
	default:
		return usageError{fmt.Errorf("unknown state command %q\n%s", args[0], stateUsage)}
	}
}

// stateFlags returns the flag set of "salesagg state <name>" with --config
// and the flags of the keys it uses: state.dir and application.id, and
// keys (verify's). The old --state-dir still works, hidden.
func stateFlags(name string, keys ...string) *pflag.FlagSet {
	fs := pflag.NewFlagSet("state "+name, pflag.ContinueOnError)
	config.RegisterKeyFlags(fs, append([]string{"state.dir", "application.id"}, keys...)...)
	config.AliasFlag(fs, "state-dir", "state.dir")
	return fs
}

// openTasks takes the lock of an existing state dir and selects the tasks
// named (0_N, or N; all of the dir's when none is named). A bad name is a
// usage error; a task the dir does not hold is an error naming those it
// does.
func openTasks(stateDir, appID string, names []string) (*state.Dir, []int32, error) {
	want, err := state.ParseTasks(names)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("--task %w", err)}
	}
	dir, err := state.OpenExistingDir(stateDir, appID)
	if err != nil {
		return nil, nil, err
	}
	parts, err := dir.Select(want)
	if err != nil {
		dir.Close()
		return nil, nil, err
	}
	return dir, parts, nil
}

func runStateInspect(args []string) error {
	fs := stateFlags("inspect")
	asJSON := fs.Bool("json", false, "print JSON")
	commandUsage(fs, "state inspect [--state.dir DIR] [--json]", "Shows each task's checkpoint, product count and sum of totals; the service must be stopped.")
	cfg, err := loadCommandConfig(fs, args)
	if err != nil {
		return err
	}
	dir, err := state.InspectExistingDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		return err
	}
	defer dir.Close()
	views, err := dir.Inspect()
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"state_dir": dir.Path(), "process_id": dir.ProcessID(), "tasks": views})
	}
	fmt.Printf("state dir:  %s\nprocess id: %s\n\n", dir.Path(), cmp.Or(dir.ProcessID(), "none"))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tCHECKPOINT\tINPUT OFFSET\tPRODUCTS\tSUM OF TOTALS\tERROR")
	for _, v := range views {
		cp, in := "none", "-"
		if v.ChangelogOffset != nil {
			cp = fmt.Sprint(*v.ChangelogOffset)
			if *v.InputOffset >= 0 {
				in = fmt.Sprint(*v.InputOffset)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", v.Task, cp, in, v.Products, v.SumOfTotals, v.Error)
	}
	return tw.Flush()
}

// runStateReset wipes the stores of the tasks named, so that the next start
// restores them from the changelog. Like reset it says what it removes
// and asks first (on a terminal; --yes otherwise); --dry-run only says.
func runStateReset(args []string, in *os.File, out io.Writer) error {
	fs := stateFlags("reset")
	tasks := fs.StringSlice("task", nil, "the task to wipe, 0_<partition> (repeat or separate with commas for several)")
	yes := fs.Bool("yes", false, "do not ask for confirmation (needed without a terminal)")
	dryRun := fs.Bool("dry-run", false, "print what would be removed, change nothing")
	commandUsage(fs, "state reset [--state.dir DIR] --task 0_N [--task ...] [--yes] [--dry-run]",
		"Wipes the stores of the tasks named: the next start restores them from their changelog. It asks\n"+
			"first (on a terminal; --yes otherwise); --dry-run prints what it would remove.")
	cfg, err := loadCommandConfig(fs, args)
	if err != nil {
		return err
	}
	if len(*tasks) == 0 {
		return usageError{errors.New("--task is required, e.g. --task 0_1 (salesagg state inspect lists the tasks)")}
	}
	dir, parts, err := openTasks(cfg.StateDir, cfg.ApplicationID, *tasks)
	if err != nil {
		return err
	}
	defer dir.Close()
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = state.TaskName(p)
	}
	fmt.Fprintf(out, "State reset in %s: the stores of tasks %s to remove (the next start restores them from the changelog)\n",
		dir.Path(), strings.Join(names, ", "))
	if *dryRun {
		fmt.Fprintln(out, "Dry run: nothing was changed.")
		return nil
	}
	if err := confirm(in, out, *yes, "Remove these stores?"); err != nil {
		return err
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
	fs := stateFlags("verify", append(config.ClientKeys(), "store.name")...)
	tasks := fs.StringSlice("task", nil, "verify only this task, 0_<partition> (repeatable; default: every task in the state dir)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up reading the changelog after this long")
	commandUsage(fs, "state verify [--state.dir DIR] [--bootstrap.servers B] [--task 0_N ...]",
		"Compares each task's store with its changelog partition, key by key, as of the store's checkpoint; exit 1 when any differs.")
	cfg, err := loadCommandConfig(fs, args)
	if err != nil {
		return err
	}
	dir, parts, err := openTasks(cfg.StateDir, cfg.ApplicationID, *tasks)
	if err != nil {
		return err
	}
	defer dir.Close()
	if len(parts) == 0 {
		return fmt.Errorf("no task stores in %s", dir.Path())
	}
	cl, err := newKafkaClient(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	servers := strings.Join(cfg.BootstrapServers, ",")
	v := changelog.Verifier{Client: cl.Opts(), Topic: cfg.ChangelogTopic()}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := checkKafka(ctx, cl, cfg, "changelog", v.Topic); err != nil {
		return err
	}
	if err := v.Prepare(ctx, kadm.NewClient(cl)); err != nil {
		return fmt.Errorf("%w (at %s)", err, servers)
	}
	fmt.Fprintf(out, "state dir %s, changelog %s at %s\n", dir.Path(), v.Topic, servers)
	failed := 0
	for _, p := range parts {
		rep := v.Verify(ctx, dir, p)
		printReport(out, rep)
		if !rep.OK() {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tasks differ from the changelog", failed, len(parts))
	}
	fmt.Fprintf(out, "all %d tasks match their changelog\n", len(parts))
	return nil
}

func printReport(out io.Writer, r changelog.Report) {
	cp := "none"
	if r.Checkpoint >= 0 {
		cp = strconv.FormatInt(r.Checkpoint, 10)
	}
	fmt.Fprintf(out, "task %s: checkpoint %s, changelog offsets %d..%d, %d products in the store",
		r.Task, cp, r.Start, r.End, r.Products)
	if r.Pending > 0 {
		fmt.Fprintf(out, ", %d changelog records past the checkpoint (the next start restores them)", r.Pending)
	}
	fmt.Fprintln(out)
	for _, p := range r.Problems {
		fmt.Fprintf(out, "  cannot verify: %s\n", p)
	}
	if len(r.Unverified) > 0 {
		fmt.Fprintf(out, "  not verifiable (their records up to the checkpoint were compacted away): %s\n", strings.Join(r.Unverified, ", "))
	}
	for _, d := range r.Diffs {
		fmt.Fprintf(out, "  DIFFERS %s\n", d)
	}
	if r.OK() {
		fmt.Fprintf(out, "  OK: every product matches the changelog as of the checkpoint\n")
	}
}
