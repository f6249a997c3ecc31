// Command salesagg aggregates sales events from Kafka into per-product
// totals kept in local Pebble stores backed by a compacted changelog.
//
//	salesagg run                                   the service
//	salesagg broker --data-dir DIR --listen ADDR   the embedded dev broker
//	salesagg config check|print [--config FILE]    validate / show the configuration
//	salesagg produce --file FILE [--topic T]       send key:value lines
//	salesagg state inspect --state.dir DIR         offline view of the stores
//	salesagg state verify --state.dir DIR          compare the stores with the changelog
//	salesagg state reset --state.dir DIR --task T  wipe one task's store
//	salesagg health [--url URL] [--timeout D]      probe /readyz: exit 0 on 200, else 1
//	salesagg version                               the build: version, commit, Go version
//	salesagg consume --topic T [--from-beginning]  print a topic's records, decoded
//	salesagg reset --application.id A [--yes]      reset the application, as kafka-streams-application-reset
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
)

// exit codes
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError marks an error in the command line or the configuration.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

const usage = `salesagg: per-product sales totals from Kafka, in local Pebble stores backed by a changelog.

Usage:
  salesagg run [--config FILE] [--KEY VALUE ...]      run the service (salesagg run --help lists the keys)
  salesagg broker [--data-dir DIR] [--listen ADDR]   run the embedded dev broker
  salesagg config check [--config FILE] [--KEY VALUE ...]
                                                     validate the configuration without connecting; print it resolved
  salesagg config print [--config FILE] [--KEY VALUE ...]
                                                     every key, its value and where it came from (default, file, env, flag)
  salesagg produce --file FILE [--topic T]           send key:value lines to Kafka
  salesagg state inspect --state.dir DIR             show the local stores (the service must be stopped)
  salesagg state verify --state.dir DIR [--bootstrap.servers B]
                                                     compare each stopped task's store with its changelog, key by key
  salesagg state reset --state.dir DIR --task 0_N    wipe a task's store: the next start restores it from the changelog
  salesagg state export --state.dir DIR | --from URL every product's total as JSONL or CSV (--format), offline or over HTTP
  salesagg health [--url URL] [--timeout D]          probe the service (default /readyz at http.addr): exit 0 on 200, else 1
  salesagg version (or --version)                    the build: module version, commit, Go version
  salesagg consume --topic T [--from-beginning] [--max-messages N] [--timeout D]
                                                     print what the service wrote: notifications, the changelog (totals
                                                     decoded), dead letters (with their headers)
  salesagg reset --application.id A [--input.topic T] [--to-earliest | --to-datetime T | --to-latest] [--state.dir D] [--yes] [--dry-run]
                                                     with the application stopped: input offsets moved, internal topics
                                                     deleted, local state wiped (as kafka-streams-application-reset)

Every command but broker, health and version reads --config FILE, SALESAGG_<KEY> and the key flags as
run does; salesagg <command> --help lists its flags.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitUsage
	}
	// What the process creates (stores, state files, the dev broker's
	// data) is its own user's alone: the state dir holds every total.
	syscall.Umask(0o077)
	var err error
	switch args[0] {
	case "run":
		err = runService(args[1:])
	case "broker":
		err = runBroker(args[1:])
	case "produce":
		err = runProduce(args[1:])
	case "state":
		err = runState(args[1:], os.Stdin)
	case "consume":
		err = runConsume(args[1:])
	case "reset":
		err = runReset(args[1:], os.Stdin, os.Stdout)
	case "config":
		err = runConfig(args[1:], os.Stdout)
	case "log":
		// Not in the usage: a helper for scripts/dev.sh's own lines.
		err = runLog(args[1:])
	case "health":
		// Its own exit codes: Docker's HEALTHCHECK reserves 2.
		return healthMain(args[1:])
	case "version", "--version":
		err = runVersion(args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(os.Stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(os.Stderr, "salesagg: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	switch {
	case err == nil, errors.Is(err, pflag.ErrHelp):
		return exitOK
	case errors.As(err, new(usageError)):
		fmt.Fprintf(os.Stderr, "salesagg %s: %s\n", args[0], onePrefix(err))
		return exitUsage
	default:
		fmt.Fprintf(os.Stderr, "salesagg %s: %s\n", args[0], onePrefix(err))
		return exitError
	}
}

// onePrefix is err's message without the "config: " that each of the
// configuration's problems starts with (its package's prefix, for callers
// other than main): the command's own "salesagg <command>: " names the
// context once.
func onePrefix(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "config: ")
	}
	return strings.Join(lines, "\n")
}
