package config

import (
	"fmt"
	"sort"
)

// Source is where a key's value comes from, in rising precedence.
type Source string

// The sources of a key's value.
const (
	FromDefault Source = "default"
	// FromDerived is a key not given whose value is worked out from other
	// keys, the host or the state dir.
	FromDerived Source = "derived"
	FromFile    Source = "file"
	FromEnv     Source = "env"
	FromFlag    Source = "flag"
)

// Origin is where a key's effective value came from: its source and the
// file, variable or flag that gave it (empty for a default or a derived
// value).
type Origin struct {
	Source Source
	Name   string
}

// String is the source and its name: "file salesagg.yaml",
// "env SALESAGG_HTTP_ADDR", "flag --http.addr", "default", "derived".
func (o Origin) String() string {
	if o.Name == "" {
		return string(o.Source)
	}
	return string(o.Source) + " " + o.Name
}

// Setting is one key's effective value and where it came from.
type Setting struct {
	Key string
	// Kind is the key's kind as --help shows it (string, int,
	// milliseconds, list, boolean).
	Kind string
	// Value is as the start-up line shows it (a derived value resolved),
	// a secret redacted; a value that did not decode is shown as given.
	Value  string
	Origin Origin
}

// settings returns each key's Setting, sorted by key: its value in c, or
// as src has it for the keys that failed to decode, and its origin in from
// (default when absent).
func (c Config) settings(src source, from map[string]Origin, failed map[string]bool) []Setting {
	shown := c.Fields()
	out := make([]Setting, 0, len(keys))
	for _, k := range keys {
		s := Setting{Key: k.name, Kind: k.bind.kind(), Value: fmt.Sprint(shown[k.name])}
		if failed[k.name] {
			s.Value = src.text(k.name)
		}
		if k.secret {
			s.Value = redact(s.Value)
		}
		s.Origin = Origin{Source: FromDefault}
		if o, ok := from[k.name]; ok {
			s.Origin = o
		} else if k.derived || k.bind.derived() {
			s.Origin.Source = FromDerived
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
