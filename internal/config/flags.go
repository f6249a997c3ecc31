package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// ParseFlags parses args into fs as fs.Parse does, but reports every problem
// at once instead of stopping at the first, so that they can be reported
// together with the configuration's own (Load):
//
//   - an unknown flag, one line each, with the nearest flag of fs when one
//     is close ("did you mean --bootstrap.servers?") and pointing to
//     "salesagg <fs.Name()> --help";
//   - a flag missing its value: at the end of args, or followed by another
//     flag ("--notification.threshold --http.addr :1" is an error naming
//     --notification.threshold, not a threshold of "--http.addr"). A value
//     that starts with "--" can be given as --key=--value; a negative number
//     ("--commit.interval.ms -5") is a value;
//   - a positional argument (no subcommand takes one).
//
// A boolean flag needs no value: "--http.pprof" alone, or followed by
// another flag, is "--http.pprof=true"; a word after it is its value.
//
// --help and -h print fs's usage and return pflag.ErrHelp.
func ParseFlags(fs *pflag.FlagSet, args []string) error {
	hint := fmt.Sprintf("salesagg %s --help", fs.Name())
	var problems []error
	var unknown []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--help" || arg == "-h" {
			if fs.Usage != nil {
				fs.Usage()
			} else {
				fmt.Fprintf(fs.Output(), "Usage of salesagg %s:\n", fs.Name())
				fs.PrintDefaults()
			}
			return pflag.ErrHelp
		}
		if arg == "--" {
			for _, rest := range args[i+1:] {
				problems = append(problems, fmt.Errorf("unexpected argument %q: salesagg %s takes only flags (%s)", rest, fs.Name(), hint))
			}
			break
		}
		var f *pflag.Flag
		var name string
		switch {
		case strings.HasPrefix(arg, "--"):
			name = strings.TrimPrefix(arg, "--")
		case len(arg) > 1 && arg[0] == '-':
			name = arg[1:]
		default:
			problems = append(problems, fmt.Errorf("unexpected argument %q: salesagg %s takes only flags, each with its value (%s)", arg, fs.Name(), hint))
			continue
		}
		name, value, hasValue := strings.Cut(name, "=")
		if strings.HasPrefix(arg, "--") {
			f = fs.Lookup(name)
		} else if len(name) == 1 {
			f = fs.ShorthandLookup(name)
		}
		if f == nil {
			if given, _, _ := strings.Cut(arg, "="); !slices.Contains(unknown, given) {
				unknown = append(unknown, given)
			}
			// Skip its value too, so that it is not taken for an
			// argument of its own.
			if !hasValue && i+1 < len(args) && !isFlag(args[i+1]) {
				i++
			}
			continue
		}
		if !hasValue {
			switch {
			case f.NoOptDefVal != "" && isBoolFlag(f) && i+1 < len(args) && !isFlag(args[i+1]):
				// "--http.pprof false" as well as "--http.pprof=false",
				// and "--http.pprof maybe" is a bad value, not a stray
				// argument: no command takes an argument it could be.
				i++
				value = args[i]
			case f.NoOptDefVal != "":
				value = f.NoOptDefVal
			case i+1 >= len(args):
				problems = append(problems, fmt.Errorf("flag --%s needs a value (%s)", f.Name, f.Usage))
				continue
			case isFlag(args[i+1]):
				problems = append(problems, fmt.Errorf("flag --%s needs a value, but %s follows it (write --%s=VALUE for a value that starts with '-')", f.Name, args[i+1], f.Name))
				continue
			default:
				i++
				value = args[i]
			}
		}
		if err := fs.Set(f.Name, value); err != nil {
			problems = append(problems, fmt.Errorf("flag --%s = %q: %v", f.Name, value, err))
		}
	}
	for _, arg := range unknown {
		problems = append(problems, unknownFlag(fs, arg, hint))
	}
	return errors.Join(problems...)
}

// unknownFlag is the problem of the unknown flag arg (without its value):
// its name, the nearest
// flag of fs (hidden ones aside) when one is close, and the hint.
func unknownFlag(fs *pflag.FlagSet, arg, hint string) error {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	h := Hint(name, "", names, func(k string) string { return k })
	switch {
	case strings.HasSuffix(h, ")"): // where the name comes from
		h = strings.Replace(strings.TrimSuffix(h, ")"), "did you mean ", "did you mean --", 1)
		return fmt.Errorf("unknown flag %s%s; %s lists the flags)", arg, h, hint)
	case h != "":
		return fmt.Errorf("unknown flag %s%s (%s lists the flags)", arg, strings.Replace(h, "did you mean ", "did you mean --", 1), hint)
	}
	return fmt.Errorf("unknown flag %s (%s lists the flags)", arg, hint)
}

// isBoolFlag reports whether f is a boolean: a key's toggle or a pflag
// bool.
func isBoolFlag(f *pflag.Flag) bool {
	t := f.Value.Type()
	return t == "bool" || t == kindBool
}

// isFlag reports whether arg is a flag rather than a value: it starts with
// "--", or is "-" and a letter (not a negative number).
func isFlag(arg string) bool {
	if strings.HasPrefix(arg, "--") {
		return true
	}
	return len(arg) > 1 && arg[0] == '-' && (arg[1] < '0' || arg[1] > '9') && arg[1] != '.'
}

// LoadArgs parses args into fs (ParseFlags, fs holding RegisterFlags' flags)
// and loads the configuration (Load), reporting the problems of both in one
// error. --help gives pflag.ErrHelp alone.
func LoadArgs(fs *pflag.FlagSet, args, environ []string) (Config, error) {
	parseErr := ParseFlags(fs, args)
	if errors.Is(parseErr, pflag.ErrHelp) {
		return Config{}, parseErr
	}
	c, err := Load(fs, environ)
	if err := errors.Join(parseErr, err); err != nil {
		return Config{}, err
	}
	return c, nil
}

// AliasFlag adds to fs the hidden flag --old, another name of the flag
// --key (registered before): what it is given, --key is given. It keeps an
// old spelling working without showing it in --help or in suggestions.
func AliasFlag(fs *pflag.FlagSet, old, key string) {
	target := fs.Lookup(key)
	if target == nil {
		panic("config: no flag --" + key + " to alias")
	}
	fs.Var(&aliasValue{fs: fs, key: key, kind: target.Value.Type()}, old, "the old name of --"+key)
	_ = fs.MarkHidden(old)
}

// aliasValue sets the flag it is an alias of.
type aliasValue struct {
	fs        *pflag.FlagSet
	key, kind string
}

func (a *aliasValue) String() string     { return "" }
func (a *aliasValue) Set(s string) error { return a.fs.Set(a.key, s) }
func (a *aliasValue) Type() string       { return a.kind }

// ClientKeys are the keys of a Kafka connection: bootstrap.servers and the
// security keys (TLS, SASL), which every command that talks to Kafka takes.
func ClientKeys() []string {
	return []string{"bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
		"sasl.password.file", "ssl.ca.file", "ssl.cert.file", "ssl.key.file"}
}
