package config

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeRow is one row of README.md's configuration table.
type readmeRow struct {
	line int
	keys []string // the keys its first cell names
	def  string   // its default cell
}

var backticked = regexp.MustCompile("`([^`]+)`")

// readmeTable returns the rows of the markdown table under "## Configuration"
// in the README at path: the first table of that section, rows
// "| `key` | default | meaning |", a cell naming one key or several.
func readmeTable(t *testing.T, path string) []readmeRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("opening the README: %v", err)
	}
	defer f.Close()
	var rows []readmeRow
	section, inTable := false, false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = strings.TrimSpace(line) == "## Configuration"
			inTable = false
			continue
		case !section:
			continue
		case !strings.HasPrefix(line, "|"):
			if inTable {
				return rows // the table ended
			}
			continue
		}
		inTable = true
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "`") {
			continue // the header and its rule
		}
		row := readmeRow{line: n, def: strings.TrimSpace(cells[2])}
		for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			row.keys = append(row.keys, m[1])
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the README: %v", err)
	}
	return rows
}

func TestReadmeTableMatchesKeys(t *testing.T) {
	// Scenario: README.md's configuration table and the declared keys name the same keys, once each, with the declared defaults.
	rows := readmeTable(t, "../../README.md")
	if len(rows) == 0 {
		t.Fatal("no configuration table under \"## Configuration\" in README.md")
	}
	declared := map[string]key{}
	for _, k := range keys {
		declared[k.name] = k
	}
	documented := map[string]int{}
	for _, row := range rows {
		for _, name := range row.keys {
			if line, ok := documented[name]; ok {
				t.Errorf("README.md:%d: %s is documented again (first at line %d)", row.line, name, line)
			}
			documented[name] = row.line
			k, ok := declared[name]
			if !ok {
				t.Errorf("README.md:%d: %s is not a configuration key", row.line, name)
				continue
			}
			// A key without a literal default (none, or derived) is
			// described in words, which only a reader can check.
			if k.def != "" && !strings.Contains(row.def, "`"+k.def+"`") {
				t.Errorf("README.md:%d: the default of %s is %q, the table says %q", row.line, name, k.def, row.def)
			}
		}
	}
	for _, k := range keys {
		if _, ok := documented[k.name]; !ok {
			t.Errorf("README.md's configuration table lacks %s", k.name)
		}
	}
}
