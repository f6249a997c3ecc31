package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
)

// readmeText is a part of README.md: its prose (code blocks left out) and
// its fenced code blocks, in order.
type readmeText struct {
	prose  string // whitespace collapsed to single spaces
	blocks []codeBlock
}

// codeBlock is one fenced block of the README.
type codeBlock struct {
	lang  string   // "sh", or "" for shown output
	lines []string // as written
	after string   // the prose before it, collapsed, for finding it
}

// readmePart returns the part of README.md under heading (a line such as
// "## Walkthrough") up to the next heading of the same or a higher level;
// without, it stops at the first of the headings listed there instead.
func readmePart(t *testing.T, heading string, without ...string) readmeText {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	level := headingLevel(heading)
	var part []string
	in, fence := false, false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(l, "#") {
			switch {
			case l == heading:
				in = true
				continue
			case in && (headingLevel(l) <= level || contains(without, l)):
				in = false
			}
		}
		if in {
			part = append(part, l)
		}
	}
	if len(part) == 0 {
		t.Fatalf("README.md has no %q section", heading)
	}
	return splitReadme(part)
}

// splitReadme separates prose and fenced blocks.
func splitReadme(lines []string) readmeText {
	var r readmeText
	var prose []string
	var cur *codeBlock
	for _, l := range lines {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &codeBlock{lang: strings.TrimPrefix(l, "```"), after: collapse(strings.Join(prose, " "))}
		case cur != nil && strings.HasPrefix(l, "```"):
			r.blocks = append(r.blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		default:
			prose = append(prose, l)
		}
	}
	r.prose = collapse(strings.Join(prose, " "))
	return r
}

// headingLevel is the number of #s a markdown heading starts with.
func headingLevel(l string) int { return len(l) - len(strings.TrimLeft(l, "#")) }

func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// blockAfter returns the first block of language lang whose preceding prose
// holds anchor: the test finds each step by the README's own words, and
// fails naming them when they change.
func (r readmeText) blockAfter(t *testing.T, lang, anchor string) codeBlock {
	t.Helper()
	for _, b := range r.blocks {
		if b.lang == lang && strings.Contains(b.after, anchor) {
			return b
		}
	}
	t.Fatalf("README.md: no ```%s block after the words %q: the walkthrough changed; change this test with it", lang, anchor)
	return codeBlock{}
}

// find returns the submatches of re in the prose.
func (r readmeText) find(t *testing.T, re string) []string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(r.prose)
	if m == nil {
		t.Fatalf("README.md: the walkthrough no longer says what %q matches: it changed; change this test with it", re)
	}
	return m
}

// codeSpans returns the `code spans` of s, in order.
func codeSpans(s string) []string {
	var out []string
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// readmeCommand is one command of a shell block, as a user pastes it.
type readmeCommand struct {
	line    string // the command, continuation lines joined, without its comment
	comment string // its trailing comment ("# ..." after it), the output it promises
	alt     bool   // introduced by a "# or ..." line: another way to do the previous command
}

// commands splits a shell block into its commands.
func (b codeBlock) commands() []readmeCommand {
	var out []readmeCommand
	alt, cont := false, ""
	for _, l := range b.lines {
		l = strings.TrimSpace(l)
		if cont != "" {
			l, cont = cont+" "+l, ""
		}
		if strings.HasSuffix(l, "\\") {
			cont = strings.TrimSuffix(l, "\\")
			continue
		}
		if l == "" {
			continue
		}
		if strings.HasPrefix(l, "#") {
			alt = alt || strings.HasPrefix(l, "# or ")
			continue
		}
		line, comment := splitComment(l)
		out = append(out, readmeCommand{line: line, comment: comment, alt: alt})
		alt = false
	}
	return out
}

// splitComment cuts a shell line at its comment: a # that starts a word
// outside quotes.
func splitComment(l string) (string, string) {
	var quote rune
	for i, c := range l {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t'):
			return strings.TrimSpace(l[:i]), strings.TrimSpace(l[i+1:])
		}
	}
	return strings.TrimSpace(l), ""
}

// program returns the command's program and its arguments, environment
// assignments before it left out (quotes are not interpreted: only the
// words that decide how the test runs the command are looked at).
func (c readmeCommand) program() (string, []string) {
	words := strings.Fields(c.line)
	for len(words) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
		words = words[1:]
	}
	if len(words) == 0 {
		return "", nil
	}
	return words[0], words[1:]
}

// longRunning reports whether the command runs until it is stopped (in a
// terminal of its own): `make run`, the service, the dev broker.
func (c readmeCommand) longRunning() bool {
	prog, args := c.program()
	first := ""
	if len(args) > 0 {
		first = args[0]
	}
	switch {
	case prog == "make" && first == "run":
		return true
	case strings.HasSuffix(prog, "salesagg") && (first == "run" || first == "broker"):
		return true
	}
	return false
}

// external lists the programs of the README's commands that are other
// projects' tools, optional for a user (the README says how to do the same
// without them): the test does not run them. Any other program must run.
var external = map[string]string{
	"kcat":                      "kcat",
	"kafka-consumer-groups.sh":  "a Kafka distribution",
	"kafka-topics.sh":           "a Kafka distribution",
	"kafka-console-producer.sh": "a Kafka distribution",
	"java":                      "Kafka's jars from Maven Central",
}

func (c readmeCommand) String() string {
	if c.comment == "" {
		return c.line
	}
	return fmt.Sprintf("%s  # %s", c.line, c.comment)
}

// The addresses the walkthrough's commands name: `make run`'s defaults.
const (
	readmeBroker = "127.0.0.1:9092"
	readmeHTTP   = "127.0.0.1:8080"
)

// walkthroughLock names the abstract unix socket that lets one walkthrough
// at a time run on this machine. Every checkout's walkthrough binds the same
// fixed addresses above, so two at once (several worktrees, or CI beside a
// developer, each running `make test`) answer each other's commands: one
// took the other's /readyz for its own service while it was still building,
// and ran `bin/salesagg produce` before its binary existed. An abstract
// socket has the scope of those addresses (the network namespace), needs no
// file whatever TMPDIR is, and is released when its holder exits, even by
// SIGKILL.
const walkthroughLock = "@salesagg-readme-walkthrough"

// walkthroughWait bounds the wait for another checkout's walkthrough to end
// (one takes one to three minutes on a loaded 2-core machine).
const walkthroughWait = 5 * time.Minute

// lockWalkthrough holds walkthroughLock for the rest of the test, waiting up
// to walkthroughWait for another walkthrough to release it; the test is
// skipped when it does not.
func lockWalkthrough(t *testing.T) {
	t.Helper()
	var l net.Listener
	err := harness.Poll(walkthroughWait, func() error {
		var err error
		l, err = net.Listen("unix", walkthroughLock)
		return err
	})
	if err != nil {
		t.Skipf("another walkthrough on this machine holds %s (it names the same fixed addresses) after %s: %v", walkthroughLock, walkthroughWait, err)
	}
	t.Cleanup(func() { l.Close() })
}

func TestReadmeWalkthrough(t *testing.T) {
	// Scenario: README.md's Walkthrough and "Offline state tools", run as a new user pastes them
	// into a fresh checkout: the commands are read from the README (none is written here), and
	// what the README says comes out (the totals, the restore lines, the shutdown order, the state
	// tools' view) is what comes out. `make run` builds the binary and starts the dev broker and
	// the service; Ctrl-C is SIGINT to its process group, as a terminal sends it.
	walk := readmePart(t, "## Walkthrough", "### Offline state tools")
	offline := readmePart(t, "### Offline state tools")
	u := newReadmeUser(t)

	first := walk.blockAfter(t, "sh", "")
	run := u.runBlock(first)
	totals := u.checkTotals(walk)
	u.checkAPI(totals)
	u.checkNotifications(walk)
	u.ctrlC(walk, run)

	// The dev broker alone, as for the state tools: the last cycle was committed.
	b := harness.StartDevBroker(t, u.bin(), filepath.Join(u.dir, "data", "broker"), readmeBroker)
	u.checkCommitted(walk)
	u.offlineTools(walk, offline, totals)
	b.Terminate(t)

	// "Stop with Ctrl-C and run `make run` again": each task restores nothing.
	again := walk.blockAfter(t, "", "run `make run` again")
	run = u.start(first.commands()[0])
	u.expectLines(run, again.lines)
	u.waitTotals(totals)
	u.ctrlC(walk, run)

	// `state reset --task T`: T alone restores, from the start of its changelog partition.
	reset := offline.find(t, "`state reset --task (\\d+_\\d+)` \\(repeatable\\) deletes that task's store: the next start finds no checkpoint for it and restores it from the start of its changelog partition, the other tasks restoring nothing")
	u.run(u.commandWith(offline, "state reset"))
	run = u.start(first.commands()[0])
	u.expectRestored(run, map[string]bool{reset[1]: true})
	u.waitTotals(totals)
	u.ctrlC(walk, run)

	// "delete the state (`rm -rf data/state`) and start again": every task restores all.
	wipe := walk.find(t, "delete the state \\(`([^`]+)`\\) and start again: each task logs `([^`]+)`, restores every changelog record of its partition, and the totals are the same")
	u.run(readmeCommand{line: wipe[1]})
	run = u.start(first.commands()[0])
	u.expectRestored(run, map[string]bool{"0_0": true, "0_1": true, "0_2": true})
	u.expectLogged(run, wipe[2], 3)
	u.waitTotals(totals)
	u.ctrlC(walk, run)
}

// readmeUser is a new user in a fresh checkout.
type readmeUser struct {
	t       *testing.T
	dir     string // the checkout
	api     *harness.API
	outputs map[string]string // command → what it printed
}

// newReadmeUser copies the repository's files (tracked and new, as the
// working tree has them) into a temp dir. The walkthrough names fixed
// addresses: when another process holds them, the test is skipped.
func newReadmeUser(t *testing.T) *readmeUser {
	t.Helper()
	for _, tool := range []string{"bash", "make", "curl", "git", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the walkthrough needs %s: %v", tool, err)
		}
	}
	lockWalkthrough(t)
	for _, addr := range []string{readmeBroker, readmeHTTP} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("the walkthrough's commands name %s, which is taken: %v", addr, err)
		}
		l.Close()
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Skipf("listing the repository's files (git ls-files): %v", err)
	}
	dir := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if err := copyFile(filepath.Join(root, f), filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// dev.sh runs the broker and the service in process groups of their
		// own: kill whatever is left of them if the test stopped early.
		for _, pid := range processesWith(dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return &readmeUser{t: t, dir: dir, api: harness.NewAPI(readmeHTTP), outputs: map[string]string{}}
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	st, err := os.Stat(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, st.Mode().Perm())
}

// bin is the binary `make run` built in the checkout.
func (u *readmeUser) bin() string { return filepath.Join(u.dir, "bin", "salesagg") }

// runBlock runs the commands of a shell block in order: the long-running
// one (terminal 1) as a job, the others to their end, each checked against
// the output its comment promises. It returns the job.
func (u *readmeUser) runBlock(b codeBlock) *harness.Proc {
	t := u.t
	var job *harness.Proc
	for _, c := range b.commands() {
		prog, _ := c.program()
		switch {
		case c.alt:
			t.Logf("not run (another way to do the line before): %s", c)
		case external[prog] != "":
			t.Logf("not run (needs %s): %s", external[prog], c)
		case c.longRunning() && job != nil:
			t.Fatalf("README.md: a second long-running command in one block (%s): change this test to run it", c)
		case c.longRunning():
			job = u.start(c)
		default:
			u.runChecked(c)
		}
	}
	if job == nil {
		t.Fatalf("README.md: the walkthrough's first block starts nothing (no `make run`)")
	}
	return job
}

// start runs a long-running command as a job, as in a terminal of its
// own, and waits for the service to be ready (`make run` builds first).
func (u *readmeUser) start(c readmeCommand) *harness.Proc {
	u.t.Helper()
	p := harness.Start(u.t, harness.Spec{Name: "make-run", Path: "bash", Args: []string{"-c", c.line}, Dir: u.dir, Job: true})
	harness.WaitFor(u.t, 5*time.Minute, fmt.Sprintf("%q to build and serve %s/readyz", c.line, readmeHTTP), func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		// Only this job's service counts: an answer at the fixed address
		// before it logged its start comes from another process.
		if !strings.Contains(p.Stderr(), "Starting salesagg") {
			return errors.New("the service of this job has not started yet")
		}
		return u.api.Ready()
	})
	return p
}

// run runs a command to its end in the checkout and returns its output; a
// command that fails fails the test.
func (u *readmeUser) run(c readmeCommand) string {
	u.t.Helper()
	out, err := u.exec(c)
	if err != nil {
		u.t.Fatalf("README command %q: %v\n%s", c.line, err, out)
	}
	return out
}

func (u *readmeUser) exec(c readmeCommand) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", c.line)
	cmd.Dir = u.dir
	cmd.Env = harness.ChildEnv()
	out, err := cmd.CombinedOutput()
	u.outputs[c.line] = string(out)
	return string(out), err
}

// runChecked runs c; when its comment promises an output, it runs it again
// until that comes (as a user retries a query while the service catches
// up), failing after a minute.
func (u *readmeUser) runChecked(c readmeCommand) {
	u.t.Helper()
	check := outputCheck(c)
	if check == nil {
		out := u.run(c)
		u.t.Logf("ran %s:\n%s", c, out)
		return
	}
	harness.WaitFor(u.t, time.Minute, fmt.Sprintf("README command %q to print what its comment says", c.line), func() error {
		out, err := u.exec(c)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return check(out)
	})
}

// outputCheck returns how to check c's output against its comment: a
// JSON comment is the output; "sorted by product" promises a page of the
// product list. Nil when the comment promises nothing checkable.
func outputCheck(c readmeCommand) func(string) error {
	switch {
	case strings.HasPrefix(c.comment, "{"):
		return func(out string) error { return sameJSON(out, c.comment) }
	case strings.Contains(c.comment, "sorted by product"):
		return func(out string) error { return checkPage(c.line, out) }
	}
	return nil
}

func sameJSON(got, want string) error {
	var g, w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		return fmt.Errorf("%w: the README's comment %s is not JSON: %v", harness.ErrGiveUp, want, err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		return fmt.Errorf("output %q is not JSON: %v", got, err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		return fmt.Errorf("output %s, the README says %s", gb, wb)
	}
	return nil
}

// checkPage checks a page of GET /v1/products?limit=N: N products sorted
// by name, and "next" naming the last.
func checkPage(cmd, out string) error {
	m := regexp.MustCompile(`limit=(\d+)`).FindStringSubmatch(cmd)
	if m == nil {
		return fmt.Errorf("%w: %q names no limit", harness.ErrGiveUp, cmd)
	}
	limit, _ := strconv.Atoi(m[1])
	var page struct {
		Products []struct{ Product string }
		Next     string
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		return fmt.Errorf("output %q: %v", out, err)
	}
	var names []string
	for _, p := range page.Products {
		names = append(names, p.Product)
	}
	if limit == 0 || len(names) != limit || !sort.StringsAreSorted(names) || page.Next != names[len(names)-1] {
		return fmt.Errorf("output %s: want the first %d products sorted, with next naming the last", out, limit)
	}
	return nil
}

// checkTotals reads the totals the walkthrough lists, checks that they are
// the ones the other tests assert (harness.SampleTotals), and waits for
// the service to serve them. It returns them.
func (u *readmeUser) checkTotals(walk readmeText) map[string]int64 {
	t := u.t
	m := walk.find(t, `their totals are ((?:product\d+ \d+, )+product\d+ \d+) \((\d+) in all\)`)
	totals := map[string]int64{}
	var sum int64
	for _, pair := range strings.Split(m[1], ", ") {
		name, v, _ := strings.Cut(pair, " ")
		totals[name], _ = strconv.ParseInt(v, 10, 64)
		sum += totals[name]
	}
	if all, _ := strconv.ParseInt(m[2], 10, 64); all != sum {
		t.Errorf("README.md: the totals listed add up to %d, not the %d it says", sum, all)
	}
	if err := harness.DiffTotals("README's totals", totals, harness.SampleTotals); err != nil {
		t.Errorf("README.md and harness.SampleTotals disagree: %v", err)
	}
	u.waitTotals(totals)
	return totals
}

func (u *readmeUser) waitTotals(totals map[string]int64) {
	u.t.Helper()
	harness.WaitFor(u.t, time.Minute, "the README's totals over HTTP", func() error { return u.api.CheckTotals(totals) })
}

// checkAPI checks what a user tries next, beyond the README's lines: a
// longer page, an unknown product, the tasks.
func (u *readmeUser) checkAPI(totals map[string]int64) {
	t := u.t
	names := make([]string, 0, len(totals))
	for p := range totals {
		names = append(names, p)
	}
	sort.Strings(names)
	var page struct {
		Products []struct{ Product string }
		Next     string
	}
	if code, err := u.api.GetJSON("/v1/products?limit=4", &page); err != nil || len(page.Products) != 4 || page.Next != names[3] {
		t.Errorf("GET /v1/products?limit=4 = %d %v %+v, want 4 products and next %q", code, err, page, names[3])
	}
	if code, body, _, _ := u.api.Get("/v1/products/nope"); code != 404 {
		t.Errorf("unknown product: %d %s", code, body)
	}
	if code, body, _, _ := u.api.Get("/v1/tasks"); code != 200 || strings.Count(string(body), `"state":"running"`) != 3 {
		t.Errorf("GET /v1/tasks = %d %s, want 3 running tasks", code, body)
	}
}

// ctrlC stops the job as Ctrl-C does and checks what the walkthrough says
// of it: the service stops first (the lines it names, in order), then the
// dev broker; every line is in the service's log format; nothing is
// logged at error level and the service never lost the broker.
func (u *readmeUser) ctrlC(walk readmeText, p *harness.Proc) {
	t := u.t
	t.Helper()
	para := walk.find(t, "Ctrl-C on `make run` stops the service first.*?`scripts/dev.sh`")[0]
	walk.find(t, "Its own lines are in the service's log format")
	var want []string
	for _, m := range regexp.MustCompile(`\(([^()]*)\)`).FindAllStringSubmatch(para, -1) {
		want = append(want, codeSpans(m[1])...)
	}
	if len(want) < 3 {
		t.Fatalf("README.md: the Ctrl-C paragraph names %q, want the service's and the broker's lines", want)
	}
	if err := p.SignalGroup(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !p.WaitExit(time.Minute) {
		t.Fatal("make run did not exit within a minute of Ctrl-C")
	}
	var msgs []string
	for _, l := range p.StderrLines() {
		if strings.HasPrefix(l, "make: ") || strings.TrimSpace(l) == "" {
			continue // make's own report of the interrupt
		}
		es := harness.JSONLines([]string{l})
		if len(es) != 1 {
			t.Errorf("not a line in the service's log format: %q", l)
			continue
		}
		if lv := es[0]["level"]; lv == "error" || lv == "fatal" || lv == "panic" {
			t.Errorf("error line on a normal run: %s", l)
		}
		if m := es[0].Msg(); strings.Contains(m, "unable to open connection") || strings.Contains(m, "connection refused") {
			t.Errorf("the service lost the broker before it stopped: %q", m)
		}
		msgs = append(msgs, es[0].Msg())
	}
	inOrder(t, msgs, "Dev broker ready; starting the service")
	inOrder(t, msgs, want...)
	inOrder(t, msgs, "Shutdown requested: flushing, checkpointing and leaving the group", "Left the group", "Stopped",
		"Stopping embedded dev broker", "Embedded dev broker stopped")
}

// inOrder fails unless msgs holds each of want, in that order.
func inOrder(t *testing.T, msgs []string, want ...string) {
	t.Helper()
	at := 0
	for _, w := range want {
		i := at
		for i < len(msgs) && msgs[i] != w {
			i++
		}
		if i == len(msgs) {
			t.Errorf("no %q line after %q (want %q in order)", w, msgs[max(at-1, 0)], want)
			return
		}
		at = i + 1
	}
}

// checkCommitted checks that the input offsets the group committed cover
// every event of the sample file.
func (u *readmeUser) checkCommitted(walk readmeText) {
	t := u.t
	events, _ := strconv.ParseInt(walk.find(t, "`sample_events.txt` holds (\\d+) events")[1], 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offsets, err := kadm.NewClient(harness.NewClient(t, readmeBroker)).FetchOffsets(ctx, "sales-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	var committed int64
	offsets.Each(func(o kadm.OffsetResponse) {
		if o.Topic == "sales-events-v1" {
			committed += o.At
		}
	})
	for line, out := range u.outputs {
		if strings.Contains(line, "salesagg produce") && !strings.Contains(out, fmt.Sprintf("sent %d records to sales-events-v1", events)) {
			t.Errorf("%s said %q, want it to have sent the %d events", line, out, events)
		}
	}
	if committed != events {
		t.Errorf("committed input offsets add up to %d, want the %d events of the sample file", committed, events)
	}
}

// offlineTools runs the state tools the README shows (the walkthrough's
// prose and the "Offline state tools" block) with the service stopped and
// the broker up, all but `state reset`, which the caller runs.
func (u *readmeUser) offlineTools(walk, offline readmeText, totals map[string]int64) {
	t := u.t
	var cmds []readmeCommand
	for _, s := range codeSpans(walk.prose) {
		if strings.HasPrefix(s, "bin/salesagg state ") {
			cmds = append(cmds, readmeCommand{line: s})
		}
	}
	cmds = append(cmds, offline.blockAfter(t, "sh", "").commands()...)
	var sum int64
	for _, v := range totals {
		sum += v
	}
	for _, c := range cmds {
		switch {
		case strings.Contains(c.line, "state reset"):
			continue
		case strings.Contains(c.line, "state inspect"):
			if err := checkInspect(u.run(c), len(totals), sum); err != nil {
				t.Errorf("%s: %v", c, err)
			}
		case strings.Contains(c.line, "state verify"):
			if out := u.run(c); strings.Contains(out, "DIFFERS") {
				t.Errorf("%s: %s", c, out)
			}
		default:
			t.Logf("ran %s:\n%s", c, u.run(c))
		}
	}
}

// checkInspect checks `state inspect`'s table: three tasks holding the
// products and their sum.
func checkInspect(out string, products int, sum int64) error {
	var head []string
	var gotTasks, gotProducts int
	var gotSum int64
	for _, l := range strings.Split(out, "\n") {
		cols := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1)
		switch {
		case len(cols) > 1 && cols[0] == "TASK":
			head = cols
		case head != nil && regexp.MustCompile(`^\d+_\d+$`).MatchString(cols[0]):
			gotTasks++
			for i, h := range head {
				if i >= len(cols) {
					break
				}
				n, _ := strconv.ParseInt(cols[i], 10, 64)
				switch h {
				case "PRODUCTS":
					gotProducts += int(n)
				case "SUM OF TOTALS":
					gotSum += n
				}
			}
		}
	}
	if gotTasks != 3 || gotProducts != products || gotSum != sum {
		return fmt.Errorf("%d tasks, %d products, sum %d; want 3, %d, %d:\n%s", gotTasks, gotProducts, gotSum, products, sum, out)
	}
	return nil
}

// commandWith returns the block's command that holds s.
func (u *readmeUser) commandWith(r readmeText, s string) readmeCommand {
	for _, b := range r.blocks {
		for _, c := range b.commands() {
			if strings.Contains(c.line, s) {
				return c
			}
		}
	}
	u.t.Fatalf("README.md: no command with %q", s)
	return readmeCommand{}
}

// expectLines waits for the lines a README block shows a start logging. A
// line naming one task (`task [0_1]`, `changelog-1`) is logged by each task
// of the block's "for all tasks [...]" list; a duration (`12 ms`) is any.
func (u *readmeUser) expectLines(p *harness.Proc, lines []string) {
	t := u.t
	var tasks []string
	for _, l := range lines {
		if m := regexp.MustCompile(`for all tasks \[([^]]+)\]`).FindStringSubmatch(l); m != nil {
			tasks = strings.Split(m[1], ", ")
		}
	}
	if len(tasks) == 0 {
		t.Fatalf("README.md: the restart's lines name no \"for all tasks [...]\": %q", lines)
	}
	one := regexp.MustCompile(`\[(\d+)_(\d+)\]|changelog-(\d+) `)
	var want []*regexp.Regexp
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		m := one.FindStringSubmatch(l)
		if m == nil || strings.Contains(l, "for all tasks") {
			want = append(want, linePattern(l))
			continue
		}
		example := m[2] + m[3] // the partition of the task the README shows
		for _, task := range tasks {
			part := task[strings.Index(task, "_")+1:]
			inst := strings.NewReplacer("_"+example+"]", "_"+part+"]", "changelog-"+example+" ", "changelog-"+part+" ").Replace(l)
			want = append(want, linePattern(inst))
		}
	}
	harness.WaitFor(t, time.Minute, fmt.Sprintf("the lines the README shows: %q", lines), func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		var missing []string
		for _, re := range want {
			if !logged(p, re) {
				missing = append(missing, re.String())
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not logged: %q", missing)
		}
		return nil
	})
}

// linePattern matches a log message the README shows, its durations aside.
func linePattern(l string) *regexp.Regexp {
	q := regexp.QuoteMeta(strings.TrimSpace(l))
	return regexp.MustCompile("^" + regexp.MustCompile(`\d+ ms\b`).ReplaceAllString(q, `\d+ ms`) + "$")
}

func logged(p *harness.Proc, re *regexp.Regexp) bool {
	for _, e := range p.Logs() {
		if re.MatchString(e.Msg()) {
			return true
		}
	}
	return false
}

// expectRestored checks a start's restore: each task in full restored its
// whole changelog partition, having found no checkpoint; every other task
// restored nothing.
func (u *readmeUser) expectRestored(p *harness.Proc, full map[string]bool) {
	t := u.t
	t.Helper()
	harness.WaitFor(t, time.Minute, "a restore line from each task", func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		if n := p.Restored(t).Lines; n < 3 {
			return fmt.Errorf("%d restore lines", n)
		}
		return nil
	})
	content, err := harness.ReadTopic(readmeBroker, changelogTopic, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	inChangelog := map[int]int64{}
	for _, r := range content.Records {
		inChangelog[int(r.Partition)]++
	}
	restored := p.Restored(t).Partitions
	for part := 0; part < 3; part++ {
		task := fmt.Sprintf("0_%d", part)
		noCheckpoint := len(p.LogsWith(fmt.Sprintf("task [%s] State store PRODUCT_AGGREGATED_SALES did not find checkpoint offset", task))) > 0
		switch {
		case full[task] && (!noCheckpoint || restored[part] != inChangelog[part] || restored[part] == 0):
			t.Errorf("task %s: restored %d records (its changelog partition holds %d), no-checkpoint line %v; want all of them, from no checkpoint",
				task, restored[part], inChangelog[part], noCheckpoint)
		case !full[task] && (noCheckpoint || restored[part] != 0):
			t.Errorf("task %s: restored %d records, no-checkpoint line %v; want 0 from its checkpoint", task, restored[part], noCheckpoint)
		}
	}
}

// expectLogged checks that tasks tasks each logged the line the README
// quotes, "..." standing for what varies.
func (u *readmeUser) expectLogged(p *harness.Proc, quoted string, tasks int) {
	t := u.t
	pieces := strings.Split(quoted, "...")
	seen := map[any]bool{}
	for _, e := range p.Logs() {
		rest, ok := e.Msg(), true
		for _, piece := range pieces {
			i := strings.Index(rest, strings.TrimSpace(piece))
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(strings.TrimSpace(piece)):]
		}
		if ok {
			seen[e["task"]] = true
		}
	}
	if len(seen) != tasks {
		t.Errorf("%d tasks logged %q, want %d", len(seen), quoted, tasks)
	}
}

// readmeMaxLines bounds README.md: the user's path, read in about ten
// minutes; internals go to docs/ pages it links. (745: the faults tested on
// a Kafka cluster and the production settings they rely on.)
const readmeMaxLines = 745

// mdLink is a markdown link to a .md file of the repository: [text](path#anchor).
var mdLink = regexp.MustCompile(`\]\(([^)\s]*?\.md)(#[^)\s]*)?\)`)

// markdownAnchors returns the anchors GitHub gives the headings of a
// markdown file (code blocks left out): lowercase, punctuation dropped,
// spaces as hyphens.
func markdownAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}

func TestReadmeDocsLinks(t *testing.T) {
	// Scenario: README.md keeps the user's path (the two commands first, a bounded length) and
	// links the docs/ pages the rest moved to: every docs/*.md link of the README (and every .md
	// link of those pages) names a file and a heading that exist, and every docs page is linked.
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move internals to a docs/ page it links", n, readmeMaxLines)
	}
	two := readmePart(t, "## The two commands")
	if h := strings.Index(string(readme), "\n## "); h < 0 || !strings.HasPrefix(string(readme)[h:], "\n## The two commands\n") {
		t.Errorf("README.md: the first section is not \"## The two commands\"")
	}
	if len(two.blocks) == 0 {
		t.Fatal("README.md: \"## The two commands\" has no command block")
	}
	var progs []string
	for _, c := range two.blocks[0].commands() {
		progs = append(progs, c.line)
	}
	if len(progs) != 2 || !strings.HasPrefix(progs[0], "make run") || !strings.HasPrefix(progs[1], "make test") {
		t.Errorf("README.md: the two commands are %q, want `make run` and `make test`", progs)
	}

	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no docs/*.md pages: the README's internals have nowhere to be")
	}
	linked := map[string]bool{}
	// checkLinks checks the .md links of file (a path relative to root).
	checkLinks := func(file, text string) {
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target, anchor := m[1], strings.TrimPrefix(m[2], "#")
			if strings.Contains(target, "://") {
				continue
			}
			rel := filepath.ToSlash(filepath.Join(filepath.Dir(file), target))
			b, err := os.ReadFile(filepath.Join(root, rel))
			if err != nil {
				t.Errorf("%s links %s: %v", file, m[0], err)
				continue
			}
			linked[rel] = linked[rel] || file == "README.md"
			if anchor != "" && !markdownAnchors(string(b))[anchor] {
				t.Errorf("%s links %s: %s has no heading with the anchor #%s", file, m[0], rel, anchor)
			}
		}
	}
	checkLinks("README.md", string(readme))
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		checkLinks(filepath.ToSlash(filepath.Join("docs", filepath.Base(p))), string(b))
	}
	for _, p := range pages {
		rel := "docs/" + filepath.Base(p)
		if !linked[rel] {
			t.Errorf("README.md does not link %s: every docs page is reached from the README", rel)
		}
	}
}

func TestReadmeMakeRunArgsAndClean(t *testing.T) {
	// Scenario: what the README says of `make run` and `make clean` is what the Makefile and
	// scripts/dev.sh do, run in a copy of the two: the README's `make run ARGS=...` passes its
	// flags to `salesagg run`; a dev broker that cannot listen makes the script exit 1 and make 2,
	// as the README says; the DATA dir of that run (./data2) is recorded and `make clean` removes
	// it, `make clean DATA=dir` removes the one it names; .gitignore covers such dirs.
	for _, tool := range []string{"bash", "make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	root := filepath.Join("..", "..")
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Makefile", filepath.Join("scripts", "dev.sh")} {
		if err := copyFile(filepath.Join(root, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	// make runs in dir: the copy's Makefile and dev.sh, the test's binary.
	mk := func(args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", args...)
		cmd.Dir = dir
		cmd.Env = harness.ChildEnv("MAKEFLAGS=", "MAKELEVEL=")
		out, err := cmd.CombinedOutput()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), code
	}
	walk := readmePart(t, "## Walkthrough", "### Offline state tools")

	// ARGS: the README's example reaches dev.sh, which hands its arguments to `salesagg run`.
	var example string
	for _, s := range codeSpans(walk.prose) {
		if strings.HasPrefix(s, "make run ARGS=") {
			example = s
			break
		}
	}
	if example == "" {
		t.Fatal("README.md: the walkthrough shows no `make run ARGS=...`")
	}
	flags := strings.Trim(strings.TrimPrefix(example, "make run ARGS="), `'"`)
	out, code := mk("-n", "run", "ARGS="+flags)
	if code != 0 || !strings.Contains(out, "./scripts/dev.sh "+flags+"\n") {
		t.Errorf("make -n run ARGS=%q (exit %d) runs:\n%s\nwant ./scripts/dev.sh %s", flags, code, out, flags)
	}

	// A taken port: the README's exit codes, and the DATA dir recorded.
	codes := walk.find(t, "`make run` fails at once: `scripts/dev.sh` exits (\\d+), so make says `Error (\\d+)` and exits (\\d+)")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	out, code = mk("run", "BUILD=0", "BIN="+binary, "BROKER_LISTEN="+taken.Addr().String(),
		"HTTP="+harness.FreeAddr(t), "DATA=./data2")
	if codes[1] != codes[2] || !strings.Contains(out, "Error "+codes[2]) || strconv.Itoa(code) != codes[3] {
		t.Errorf("make run on a taken port: exit %d, output:\n%s\nthe README says dev.sh exits %s and make %s", code, out, codes[1], codes[3])
	}
	recorded, err := os.ReadFile(filepath.Join(dir, ".dev-data-dirs"))
	if err != nil || string(recorded) != "data2\n" {
		t.Errorf(".dev-data-dirs = %q (%v), want data2 recorded by dev.sh", recorded, err)
	}

	// make clean: the recorded dir, and the one named.
	if err := os.MkdirAll(filepath.Join(dir, "data3", "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, _ = mk("-n", "clean", "DATA=./data3")
	for _, d := range []string{"data", "data2", "data3"} {
		if !regexp.MustCompile(`for d in [^;]*` + regexp.QuoteMeta(filepath.Join(dir, d)) + `[ ;]`).MatchString(out) {
			t.Errorf("make -n clean DATA=./data3 does not remove %s:\n%s", d, out)
		}
	}
	if out, code = mk("clean", "DATA=./data3"); code != 0 {
		t.Fatalf("make clean: exit %d\n%s", code, out)
	}
	for _, d := range []string{"bin", "data2", "data3", ".dev-data-dirs"} {
		if _, err := os.Stat(filepath.Join(dir, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after make clean, %s: %v; want it removed", d, err)
		}
	}

	// .gitignore: a second instance's data dir and the record are not untracked files.
	for _, p := range []string{"data2/", ".dev-data-dirs"} {
		cmd := exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", p)
		if err := cmd.Run(); err != nil {
			t.Errorf(".gitignore does not cover %s (git check-ignore: %v)", p, err)
		}
	}
}

// readmeNotifications returns the walkthrough's notifications command and
// the records its example line shows (product → total), checking the
// example against the sample file's totals: sent at once, the sample is
// folded in one commit cycle, whose notifications carry the final totals.
func readmeNotifications(t *testing.T, walk readmeText) (readmeCommand, map[string]int64) {
	t.Helper()
	for _, b := range walk.blocks {
		for i, l := range b.lines {
			if !strings.Contains(l, "consume --topic notifications-events-v1") || i+1 == len(b.lines) {
				continue
			}
			example := strings.TrimSuffix(strings.TrimPrefix(b.lines[i+1], "# "), " ...")
			shown := map[string]int64{}
			for _, rec := range strings.Split(example, " ... ") {
				key, value, ok := strings.Cut(rec, "\t")
				var n sales.Notification
				if !ok || json.Unmarshal([]byte(value), &n) != nil || n.SKU != key {
					t.Fatalf("README.md: the notifications example %q is not KEY<TAB>{\"sku\":KEY,\"value\":N} as consume prints it", rec)
				}
				shown[key] = n.Value
			}
			return readmeCommand{line: strings.TrimSpace(l)}, shown
		}
	}
	t.Fatal("README.md: the walkthrough has no `consume --topic notifications-events-v1` followed by an example line")
	return readmeCommand{}, nil
}

func TestReadmeNotificationExample(t *testing.T) {
	// Scenario: the README's notification example is what the service emits for the sample
	// file: one notification per product and commit cycle, with the total as of that commit, so
	// (the sample folded in one cycle) the product's final total, at or above the threshold.
	_, shown := readmeNotifications(t, readmePart(t, "## Walkthrough", "### Offline state tools"))
	for product, v := range shown {
		if want, ok := harness.SampleTotals[product]; !ok || v != want {
			t.Errorf("README.md: the notification example shows %s %d; the service emits its total as of the commit, %d for the sample file", product, v, want)
		}
		if v < 2000 {
			t.Errorf("README.md: the notification example shows %s %d, under the default notification.threshold 2000", product, v)
		}
	}
}

// checkNotifications runs the walkthrough's notifications command: every
// product of the sample at or above the threshold has a notification, the
// last one it got carrying its final total, as the README's example shows.
func (u *readmeUser) checkNotifications(walk readmeText) {
	t := u.t
	cmd, shown := readmeNotifications(t, walk)
	last := map[string]int64{}
	count := 0
	for _, l := range strings.Split(u.run(cmd), "\n") {
		key, value, ok := strings.Cut(l, "\t")
		var n sales.Notification
		if !ok || json.Unmarshal([]byte(value), &n) != nil {
			continue // consume's own lines
		}
		last[key] = n.Value
		count++
	}
	for product, total := range harness.SampleTotals {
		if total >= 2000 && last[product] != total {
			t.Errorf("%s: the last notification of %s is %d, want its final total %d", cmd.line, product, last[product], total)
		}
	}
	for product, v := range shown {
		if last[product] != v {
			t.Errorf("README.md shows the notification %s %d; the service's last for it was %d", product, v, last[product])
		}
	}
	t.Logf("%s: %d notifications for %d products", cmd.line, count, len(last))
}

func TestReadmeStreamFilesTable(t *testing.T) {
	// Scenario: the table of internal/stream's files (docs/internals.md, linked from the README's
	// Tests and benchmarks) names every non-test .go file of the package, once, and no other: a
	// file added to internal/stream fails this test until the table says what it owns.
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "docs", "internals.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "Inside `internal/stream`"):
			in = true
		case in && strings.HasPrefix(l, "|"):
			rows = append(rows, l)
		case in && len(rows) > 0:
			in = false // the table ended
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/internals.md: no table after \"Inside `internal/stream`\"")
	}
	listed := map[string]int{}
	for _, row := range rows {
		cells := strings.Split(row, "|")
		if len(cells) < 3 {
			continue
		}
		for _, name := range codeSpans(cells[1]) {
			if strings.HasSuffix(name, ".go") {
				listed[name]++
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(root, "internal", "stream", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		if name := filepath.Base(f); !strings.HasSuffix(name, "_test.go") {
			have[name] = true
		}
	}
	if len(have) == 0 {
		t.Fatal("internal/stream has no .go files: the test reads the wrong directory")
	}
	var missing, extra []string
	for name := range have {
		if listed[name] == 0 {
			missing = append(missing, name)
		}
	}
	for name, n := range listed {
		switch {
		case !have[name]:
			extra = append(extra, name)
		case n > 1:
			t.Errorf("docs/internals.md: the internal/stream table lists %s %d times", name, n)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("docs/internals.md: the internal/stream table lacks %s: add a row saying what each owns", strings.Join(missing, ", "))
	}
	if len(extra) > 0 {
		t.Errorf("docs/internals.md: the internal/stream table lists %s, which internal/stream has not", strings.Join(extra, ", "))
	}
}
