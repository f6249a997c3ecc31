package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
