package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// readsConfig is the paragraph of --help of a command that reads the
// configuration.
const readsConfig = "The configuration is read as salesagg run reads it: the YAML file (--config), then\n" +
	"SALESAGG_<KEY> (dots as underscores, upper case), then the flags."

// setHelp sets fs's --help, one layout for every command, to standard
// output: "Usage: salesagg <line>", what the command does (about), how
// the configuration is read when the command reads it, and the flags with
// their types and defaults.
func setHelp(fs *pflag.FlagSet, line, about string, config bool) {
	fs.SetOutput(os.Stdout)
	fs.Usage = func() { fmt.Fprint(fs.Output(), helpText(fs, line, about, config)) }
}

// helpText is the --help of setHelp.
func helpText(fs *pflag.FlagSet, line, about string, config bool) string {
	s := "Usage: salesagg " + line + "\n\n" + about + "\n\n"
	if config {
		s += readsConfig + "\n\n"
	}
	flags := fs.FlagUsages()
	if flags == "" {
		flags = "  none (-h, --help: this help)\n"
	}
	return s + "Flags:\n" + flags
}
