// Package kit is what the benchmarks (bench/compare, bench/failover) share:
// child processes with their output logged and watched (Proc), the Kafka
// broker of a run (StartBroker) and admin helpers, and what a report says
// about the machine and the versions, with its number formats.
//
// Each benchmark keeps its scenarios and its report; what is here does not
// know them. Progress goes to the Logf a benchmark passes in.
package kit

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Logf logs one progress line.
type Logf func(format string, args ...any)

// NewLogf returns a Logf writing "<time> <tool>: <line>" to standard error.
func NewLogf(tool string) Logf {
	return func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s %s: %s\n", time.Now().Format("15:04:05.000"), tool, fmt.Sprintf(format, args...))
	}
}

// FindRepo walks up from the working directory to the salesagg module root.
func FindRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/salesagg/salesagg\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the salesagg repository (no go.mod of github.com/salesagg/salesagg above the working directory)")
		}
		dir = parent
	}
}

// SplitList splits a comma-separated flag value, dropping empty items and
// the spaces around each.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// OneOf checks a list flag's values: not empty, each one of allowed, none
// listed twice. It returns one problem per fault, naming the flag.
func OneOf(flagName string, vs []string, allowed ...string) []string {
	var problems []string
	if len(vs) == 0 {
		problems = append(problems, flagName+" is empty")
	}
	seen := map[string]bool{}
	for _, v := range vs {
		if !slices.Contains(allowed, v) {
			problems = append(problems, fmt.Sprintf("%s: unknown value %q (allowed: %s)", flagName, v, strings.Join(allowed, ", ")))
		}
		if seen[v] {
			problems = append(problems, fmt.Sprintf("%s: %q listed twice", flagName, v))
		}
		seen[v] = true
	}
	return problems
}

// FreePort returns a free TCP port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FirstLine is s up to its first newline.
func FirstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// Short is s cut to 12 bytes (a commit hash in a table).
func Short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// GiB formats b bytes in GiB, one decimal.
func GiB(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// Group formats n with thousands separators: 1234567 → "1,234,567".
func Group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// WriteJSON writes v indented to path, creating its directory, through a
// .tmp file and a rename (a reader never sees half a file).
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrorLines counts the error lines of a process and keeps the first five.
// Its owner guards it.
type ErrorLines struct {
	Count int
	First []string
}

// Note counts line and keeps it, cut to max bytes, if it is among the
// first five.
func (e *ErrorLines) Note(line string, max int) {
	e.Count++
	if len(e.First) < 5 {
		if len(line) > max {
			line = line[:max] + "…"
		}
		e.First = append(e.First, line)
	}
}

// Run completes the options every benchmark has, then runs bench until it
// returns or SIGINT or SIGTERM cancels its context, and returns the exit
// code: 2 when the repository cannot be found (*repo "": found from the
// working directory), 1 when bench fails. *outDir "" becomes
// <repo>/bench/results.
func Run(tool string, repo, outDir *string, bench func(context.Context) error) int {
	if *repo == "" {
		r, err := FindRepo()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v (pass --repo)\n", tool, err)
			return 2
		}
		*repo = r
	}
	if *outDir == "" {
		*outDir = filepath.Join(*repo, "bench", "results")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := bench(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", tool, err)
		return 1
	}
	return 0
}

// Parse gives fs the usage line of bench/<tool> (quick: the flags of a
// quick run), parses the command line into it and reports whether the
// program goes on; when not, code is its exit code: 0 after --help, 2 after
// a bad flag or an argument.
func Parse(fs *flag.FlagSet, tool, quick string) (code int, ok bool) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./bench/%s [flags]    (quick run: %s)\n\n", tool, quick)
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: unexpected arguments %q\n", tool, fs.Args())
		return 2, false
	}
	return 0, true
}
