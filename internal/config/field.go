package config

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"
)

// key declares one configuration key. Everything else is made from the
// declarations in keys: the flag --<name> and the variable EnvName(name),
// the defaults Load starts from, decoding, validation, the start-up line
// (Fields) and Keys; README.md's table is checked against them.
type key struct {
	name string
	// def is the default, as a flag would give it. Empty: the key has no
	// default value; it is unset until given (its value in Config says so,
	// e.g. "" or 0), or derived from other keys (its help says how).
	def  string
	help string
	// bind ties the key to its place in Config, and says its kind (text,
	// number, millis, toggle, hosts).
	bind binding
	// secret keys are never shown: config print and check show them
	// redacted whatever their binding shows.
	secret bool
	// derived keys not given take a value worked out at start (from other
	// keys, the host, the state dir) rather than a default: config print
	// says "derived" and shows that value.
	derived bool
}

// optional reports whether k is unset until given: no default and nothing
// derived.
func (k key) optional() bool { return k.def == "" && !k.bind.derived() }

// A binding ties a key to its field of Config: how the key's value is read
// into it, shown from it and checked there.
type binding interface {
	// decode reads k's value from src into c. The error is the problem
	// of a value it cannot take; the field then holds its zero value (or,
	// when only loading what the value names failed, the value).
	decode(c *Config, src source, k key) error
	// show returns k's effective value in c, for the start-up line.
	show(c Config) any
	// check reports each problem of k's value in c, with the value as it
	// is shown and what is allowed.
	check(c Config, k key, report func(val any, allowed string))
	// derived reports whether a value not given is derived from other keys.
	derived() bool
	// kind names the values the key takes, as --help shows it: one of
	// the kind constants.
	kind() string
}

// The kinds of values keys take, as --help shows them.
const (
	kindString = "string"
	kindInt    = "int"
	kindMillis = "milliseconds"
	kindList   = "list"
	// kindBool is not pflag's "bool", which --help would not show.
	kindBool = "boolean"
)

// A rule checks a key's decoded value v (c is the whole configuration, for
// rules that depend on other keys). It returns what is allowed when v
// breaks it, "" when v passes.
type rule[T any] func(v T, c Config) string

// scalar binds a key of one value of type T, kept at at(c).
type scalar[T comparable] struct {
	at   func(*Config) *T
	read func(src source, name string) (T, error)
	// display is a value as problems and the start-up line show it.
	display func(T) any
	// unset is the value of an optional key not given (the zero value
	// unless unsetAs says otherwise); rules do not apply to it.
	unset T
	// derive, when set, gives the value of a key not given (or given
	// blank) from the keys decoded before it; rules apply to it.
	derive func(Config) T
	// when, when set, limits the rules to the configurations it holds for.
	when  func(Config) bool
	rules []rule[T]
	// load, when set, runs on a value decoded (e.g. reads the file it names).
	load func(c *Config, v T) error
	// shown, when set, is what the start-up line shows instead of display
	// (a value derived in Config's methods, a secret).
	shown func(Config) any
	// fold, when set, normalizes a value read (folded).
	fold func(T) T
	// lo and hi are a number or millis key's range; sign is its value as
	// an integer, for positive.
	lo, hi int64
	sign   func(T) int64
	// kinds is the key's kind (kind).
	kinds string
}

// text binds a string key. Its value is trimmed of spaces.
func text(at func(*Config) *string) *scalar[string] {
	read := func(src source, name string) (string, error) { return src.text(name), nil }
	return &scalar[string]{at: at, read: read, display: func(v string) any { return v }, kinds: kindString}
}

// toggle binds a boolean key: true or false (as strconv.ParseBool reads them).
func toggle(at func(*Config) *bool) *scalar[bool] {
	return &scalar[bool]{at: at, read: source.boolean, display: func(v bool) any { return v }, kinds: kindBool}
}

// number binds an integer key accepting lo to hi. Decoding keeps a loaded
// value in that range; a Config built otherwise is checked only by the
// rules the key adds (e.g. positive).
func number[T ~int | ~int16 | ~int32 | ~int64](lo, hi int64, at func(*Config) *T) *scalar[T] {
	s := &scalar[T]{at: at, display: func(v T) any { return v }, lo: lo, hi: hi, kinds: kindInt}
	s.sign = func(v T) int64 { return int64(v) }
	s.read = func(src source, name string) (T, error) {
		n, err := src.integer(name, lo, hi)
		return T(n), err
	}
	return s
}

// millis binds a duration key given in milliseconds, lo to hi, as number
// does.
func millis(lo, hi int64, at func(*Config) *time.Duration) *scalar[time.Duration] {
	s := &scalar[time.Duration]{at: at, display: func(v time.Duration) any { return v.Milliseconds() }, lo: lo, hi: hi, kinds: kindMillis}
	s.sign = func(v time.Duration) int64 { return int64(v) }
	s.read = func(src source, name string) (time.Duration, error) {
		n, err := src.integer(name, lo, hi)
		return time.Duration(n) * time.Millisecond, err
	}
	return s
}

// positive adds the rule that a number or millis key is above zero (any
// positive duration passes, even one under a millisecond), reported with
// the key's range. Decoding already keeps a loaded value in range; the
// rule is what Validate checks of a Config built otherwise.
func (s *scalar[T]) positive() *scalar[T] {
	return s.must(func(v T, _ Config) string {
		if s.sign(v) <= 0 {
			return fmt.Sprintf("must be from %d to %d", s.lo, s.hi)
		}
		return ""
	})
}

// must adds rules, each checked (and reported) on its own.
func (s *scalar[T]) must(rules ...rule[T]) *scalar[T] {
	s.rules = append(s.rules, rules...)
	return s
}

// allow adds the rule that the value is one of vals, reported as
// "allowed: " and vals.
func (s *scalar[T]) allow(vals ...T) *scalar[T] {
	names := make([]string, len(vals))
	for i, v := range vals {
		names[i] = fmt.Sprint(v)
	}
	return s.must(func(v T, _ Config) string {
		for _, a := range vals {
			if v == a {
				return ""
			}
		}
		return "allowed: " + strings.Join(names, ", ")
	})
}

// folded normalizes a value read (e.g. strings.ToUpper).
func (s *scalar[T]) folded(f func(T) T) *scalar[T] { s.fold = f; return s }

// unsetAs sets the value of an optional key not given.
func (s *scalar[T]) unsetAs(v T) *scalar[T] { s.unset = v; return s }

// derivedBy makes a key not given (or given blank) take the value f
// derives from the keys decoded before it.
func (s *scalar[T]) derivedBy(f func(Config) T) *scalar[T] { s.derive = f; return s }

// checkedWhen limits the rules to the configurations f holds for.
func (s *scalar[T]) checkedWhen(f func(Config) bool) *scalar[T] { s.when = f; return s }

// loads runs f on a value decoded.
func (s *scalar[T]) loads(f func(c *Config, v T) error) *scalar[T] { s.load = f; return s }

// shows makes the start-up line show f(c) instead of the value.
func (s *scalar[T]) shows(f func(Config) any) *scalar[T] { s.shown = f; return s }

func (s *scalar[T]) derived() bool { return s.derive != nil }

func (s *scalar[T]) kind() string { return s.kinds }

func (s *scalar[T]) decode(c *Config, src source, k key) error {
	switch {
	case s.derive != nil && (!src.set(k.name) || src.text(k.name) == ""):
		*s.at(c) = s.derive(*c)
		return nil
	case k.optional() && !src.set(k.name):
		*s.at(c) = s.unset
		return nil
	}
	v, err := s.read(src, k.name)
	if s.fold != nil {
		v = s.fold(v)
	}
	*s.at(c) = v
	if err == nil && s.load != nil {
		err = s.load(c, v)
	}
	return err
}

func (s *scalar[T]) show(c Config) any {
	if s.shown != nil {
		return s.shown(c)
	}
	return s.display(*s.at(&c))
}

func (s *scalar[T]) check(c Config, k key, report func(val any, allowed string)) {
	v := *s.at(&c)
	if (k.optional() && v == s.unset) || (s.when != nil && !s.when(c)) {
		return
	}
	for _, r := range s.rules {
		if allowed := r(v, c); allowed != "" {
			report(s.display(v), allowed)
		}
	}
}

// list binds a key of comma-separated values (or a YAML list), kept at at(c).
type list struct {
	at func(*Config) *[]string
	// empty is what is allowed, reported when the list is empty.
	empty string
	// each is checked on every entry, reported with the entry.
	each rule[string]
}

// hosts binds a list of host:port.
func hosts(at func(*Config) *[]string) *list {
	return &list{at: at, empty: "must list at least one host:port", each: func(v string, _ Config) string {
		host, port, err := net.SplitHostPort(v)
		if err != nil || host == "" {
			return "each entry must be host:port"
		}
		if !portIn(port, 1) {
			return "each entry must be host:port with a port from 1 to 65535"
		}
		return ""
	}}
}

func (l *list) derived() bool { return false }

func (l *list) kind() string { return kindList }

func (l *list) decode(c *Config, src source, k key) error {
	*l.at(c) = src.list(k.name)
	return nil
}

func (l *list) show(c Config) any { return strings.Join(*l.at(&c), ",") }

func (l *list) check(c Config, _ key, report func(val any, allowed string)) {
	vals := *l.at(&c)
	if len(vals) == 0 && l.empty != "" {
		report("", l.empty)
	}
	for _, v := range vals {
		if allowed := l.each(v, c); allowed != "" {
			report(v, allowed)
		}
	}
}

// source is what decode reads: the defaults, the file, the environment and
// the flags merged by precedence.
type source struct{ v *viper.Viper }

// set reports whether name has a value (a default counts).
func (s source) set(name string) bool { return s.v.IsSet(name) }

// text returns name's value as text, trimmed; "" when it has none.
func (s source) text(name string) string {
	if !s.v.IsSet(name) {
		return ""
	}
	return strings.TrimSpace(fmt.Sprint(s.v.Get(name)))
}

func (s source) integer(name string, lo, hi int64) (int64, error) {
	raw := s.v.Get(name)
	notInteger := func() error {
		return fmt.Errorf("config: %s = %v: must be an integer from %d to %d", name, raw, lo, hi)
	}
	var n int64
	switch x := raw.(type) {
	case int:
		n = int64(x)
	case int64:
		n = x
	case uint64:
		if x > math.MaxInt64 {
			return 0, notInteger()
		}
		n = int64(x)
	case float64:
		if x != math.Trunc(x) || x < math.MinInt64 || x > math.MaxInt64 {
			return 0, notInteger()
		}
		n = int64(x)
	default:
		var err error
		n, err = strconv.ParseInt(strings.TrimSpace(fmt.Sprint(raw)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("config: %s = %q: must be an integer from %d to %d", name, fmt.Sprint(raw), lo, hi)
		}
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("config: %s = %d: must be from %d to %d", name, n, lo, hi)
	}
	return n, nil
}

func (s source) boolean(name string) (bool, error) {
	switch x := s.v.Get(name).(type) {
	case bool:
		return x, nil
	default:
		b, err := strconv.ParseBool(strings.TrimSpace(fmt.Sprint(x)))
		if err != nil {
			return b, fmt.Errorf("config: %s = %q: must be true or false", name, fmt.Sprint(x))
		}
		return b, nil
	}
}

// list returns name's entries, trimmed, empty ones dropped.
func (s source) list(name string) []string {
	var parts []string
	switch x := s.v.Get(name).(type) {
	case nil:
		return nil
	case []any:
		for _, e := range x {
			parts = append(parts, fmt.Sprint(e))
		}
	default:
		parts = strings.Split(fmt.Sprint(x), ",")
	}
	var out []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
