package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/state"
)

// runState implements "salesagg state inspect": an offline view of every
// task's checkpoint and store. It takes the state dir's lock, so it refuses
// to run beside the service.
func runState(args []string) error {
	if len(args) == 0 || args[0] != "inspect" {
		return usageError{errors.New("usage: salesagg state inspect --state-dir DIR [--application.id ID] [--json]")}
	}
	fs := pflag.NewFlagSet("state inspect", pflag.ContinueOnError)
	stateDir := fs.String("state-dir", "/tmp/salesagg", "the service's state.dir")
	appID := fs.String("application.id", "sales-aggregator", "the service's application.id")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError{err}
	}
	if _, err := os.Stat(filepath.Join(*stateDir, *appID)); err != nil {
		return fmt.Errorf("no state for application %s in %s: %w", *appID, *stateDir, err)
	}
	dir, err := state.OpenDir(*stateDir, *appID)
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
