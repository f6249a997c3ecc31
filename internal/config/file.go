package config

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// fileValue is one key a YAML file sets: its value, decoded as YAML
// decodes it (a string, a number, a bool or a list), and where it is.
type fileValue struct {
	val any
	// spelled is how the file writes the key: "bootstrap.servers", or
	// "bootstrap: servers" when nested.
	spelled string
	line    int
}

// readFile reads the YAML file name into its keys, flat (bootstrap.servers:
// x) and nested (bootstrap: {servers: x}) alike, in any mix: a mapping's
// keys are joined to their parents' with dots. Keys are folded to lower
// case, as viper read them. A key given twice (both ways, or twice the same
// way) is a problem naming both spellings and their lines; a key with a
// null value is not set. Unknown keys are the caller's to report: they are
// returned with the others.
func readFile(name string) (map[string]fileValue, []error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, []error{fmt.Errorf("config: reading %s: %w", name, err)}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, []error{fmt.Errorf("config: reading %s: %w", name, err)}
	}
	out := map[string]fileValue{}
	if len(doc.Content) == 0 { // an empty file
		return out, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, []error{fmt.Errorf("config: reading %s: line %d: the file must be a mapping of keys to values", name, root.Line)}
	}
	var problems []error
	walkYAML(root, nil, func(path []string, n *yaml.Node) {
		key := strings.ToLower(strings.Join(path, "."))
		spelled := strings.Join(path, ": ")
		var val any
		if err := n.Decode(&val); err != nil {
			problems = append(problems, fmt.Errorf("config: %s in %s, line %d: %w", key, name, n.Line, err))
			return
		}
		if val == nil {
			return
		}
		if prev, ok := out[key]; ok {
			problems = append(problems, fmt.Errorf("config: %s is given twice in %s: as %q (line %d) and as %q (line %d); keep one",
				key, name, prev.spelled, prev.line, spelled, n.Line))
			return
		}
		out[key] = fileValue{val: val, spelled: spelled, line: n.Line}
	})
	return out, problems
}

// walkYAML calls leaf for each value under the mapping n that is not
// itself a mapping, with the path of keys that leads to it.
func walkYAML(n *yaml.Node, path []string, leaf func(path []string, n *yaml.Node)) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		p := append(append([]string(nil), path...), k.Value)
		if v.Kind == yaml.MappingNode {
			walkYAML(v, p, leaf)
			continue
		}
		leaf(p, v)
	}
}

// setFromFile sets on v the keys of the YAML file name and records them in
// from. It returns the file's problems: unreadable, a key given twice, or a
// key that is none of ours (each once, with the nearest key when one is
// close).
func setFromFile(set func(key string, val any), from map[string]Origin, name string) []error {
	vals, problems := readFile(name)
	names := make([]string, 0, len(vals))
	for k := range vals {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, key := range names {
		fv := vals[key]
		if !known(key) {
			msg := fmt.Sprintf("config: unknown key %q in %s (line %d)", key, name, fv.line)
			msg += Hint(key, "", Keys(), func(k string) string { return k })
			problems = append(problems, errors.New(msg))
			continue
		}
		set(key, fv.val)
		from[key] = Origin{Source: FromFile, Name: name}
	}
	return problems
}
