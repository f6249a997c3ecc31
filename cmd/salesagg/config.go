package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/state"
)

const configUsage = `Usage: salesagg config check|print [--config FILE] [--KEY VALUE ...]

  salesagg config check   validate the file, SALESAGG_* and the flags; print the resolved config
  salesagg config print   every key, its value and where it came from (default, derived, file, env, flag)

Neither connects to Kafka. Both exit 0 when the configuration is valid, 2 with its problems when not.`

// runConfig implements "salesagg config check|print": the configuration
// run would start with, read the same way (config.LoadArgs), without
// starting anything.
func runConfig(args []string, out io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New(configUsage)}
	}
	switch args[0] {
	case "check", "print":
	case "help", "-h", "--help":
		fmt.Fprintln(out, configUsage)
		return nil
	default:
		return usageError{fmt.Errorf("unknown config command %q\n%s", args[0], configUsage)}
	}
	fs := pflag.NewFlagSet("config "+args[0], pflag.ContinueOnError)
	config.RegisterFlags(fs)
	about := "Validates the configuration without connecting to anything and prints it resolved (secrets redacted); exit 2 with its problems when it is not valid."
	if args[0] == "print" {
		about = "Prints every key, its value (secrets redacted) and where it came from: default, file, env or flag."
	}
	commandUsage(fs, "config "+args[0]+" [--config FILE] [--KEY VALUE ...]", about)
	parseErr := config.ParseFlags(fs, args[1:])
	if errors.Is(parseErr, pflag.ErrHelp) {
		return parseErr
	}
	cfg, settings, err := config.Resolve(fs, os.Environ())
	err = errors.Join(parseErr, err)
	if err == nil && args[0] == "print" {
		deriveInstanceID(cfg, settings)
	}
	if args[0] == "print" {
		printSettings(out, settings)
	}
	if err != nil {
		return usageError{err}
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(os.Stderr, "warning: %s\n", w)
	}
	if args[0] == "check" {
		fmt.Fprintln(out, "# configuration valid; resolved (secrets redacted):")
		for _, s := range settings {
			fmt.Fprintf(out, "%s: %s\n", s.Key, yamlValue(s))
		}
	}
	return nil
}

// deriveInstanceID fills in the group.instance.id a service on cfg would
// use when none is given: derived from the process id in the state dir
// (read, never written), or said to be made at the first start.
func deriveInstanceID(cfg config.Config, settings []config.Setting) {
	for i, s := range settings {
		if s.Key != "group.instance.id" || s.Origin.Source != config.FromDerived {
			continue
		}
		pid, err := state.PeekProcessID(cfg.StateDir, cfg.ApplicationID)
		switch {
		case err != nil:
			settings[i].Value = "(from the process id in the state dir: " + err.Error() + ")"
		case pid == "":
			settings[i].Value = "(from the process id the first start writes in " + filepath.Join(cfg.StateDir, cfg.ApplicationID) + ")"
		default:
			settings[i].Value = cfg.DerivedInstanceID(pid)
		}
	}
}

// printSettings writes one line per key: its value and where it came from.
func printSettings(out io.Writer, settings []config.Setting) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tSOURCE")
	for _, s := range settings {
		v := s.Value
		if v == "" {
			v = `""`
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Key, v, s.Origin)
	}
	_ = tw.Flush()
}

// yamlValue is s's value as a YAML scalar that reads back the same: a
// number or a boolean as it is, anything else quoted.
func yamlValue(s config.Setting) string {
	switch s.Kind {
	case "int", "milliseconds":
		if _, err := strconv.ParseInt(s.Value, 10, 64); err == nil {
			return s.Value
		}
	case "boolean":
		if _, err := strconv.ParseBool(s.Value); err == nil {
			return s.Value
		}
	}
	return strconv.Quote(s.Value)
}

// commandUsage sets fs's --help (to standard output): the usage line of
// "salesagg <line>", what the command does, how the configuration is read,
// and the flags with their types and defaults.
func commandUsage(fs *pflag.FlagSet, line, about string) { setHelp(fs, line, about, true) }

// loadCommandConfig parses args into fs (config.RegisterKeyFlags' flags
// and the command's own) and loads the configuration as run does, so that
// a command and the service agree on every key and default. Problems are
// a usageError (exit 2); --help gives pflag.ErrHelp.
func loadCommandConfig(fs *pflag.FlagSet, args []string) (config.Config, error) {
	cfg, err := config.LoadArgs(fs, args, os.Environ())
	if errors.Is(err, pflag.ErrHelp) {
		return cfg, err
	}
	if err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}
