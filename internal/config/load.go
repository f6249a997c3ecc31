package config

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Keys returns the names of all configuration keys, sorted.
func Keys() []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.name
	}
	sort.Strings(out)
	return out
}

// EnvName returns the environment variable of key: SALESAGG_ and the key in
// upper case with dots as underscores.
func EnvName(key string) string {
	return "SALESAGG_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// RegisterFlags adds --config and one flag per key to fs.
func RegisterFlags(fs *pflag.FlagSet) { RegisterKeyFlags(fs, Keys()...) }

// RegisterKeyFlags adds --config and the flags of the keys named to fs, for
// a command that uses only some keys (Load still reads every key from the
// file and the environment, and checks them all). Each flag's type in
// --help is its key's kind (string, int, milliseconds, list, boolean) and
// its help ends with the default. A boolean key's flag needs no value. It
// panics on a name that is no key: a mistake in the program, not the input.
func RegisterKeyFlags(fs *pflag.FlagSet, names ...string) {
	fs.String("config", "", "YAML configuration file (keys flat, bootstrap.servers: x, or nested, bootstrap: {servers: x})")
	for _, name := range names {
		i := slices.IndexFunc(keys, func(k key) bool { return k.name == name })
		if i < 0 {
			panic("config: no key " + name)
		}
		k := keys[i]
		help := k.help
		switch {
		case k.def != "":
			help += " (default " + k.def + ")"
		case !strings.Contains(help, "default"):
			help += " (default: none)"
		}
		f := fs.VarPF(&flagValue{kind: k.bind.kind()}, k.name, "", help)
		if f.Value.Type() == kindBool {
			f.NoOptDefVal = "true"
		}
	}
}

// flagValue is a key's flag: it keeps the text given, which Load decodes
// as it decodes the file's and the environment's, so that a value has one
// set of rules and messages wherever it comes from.
type flagValue struct{ val, kind string }

func (v *flagValue) String() string     { return v.val }
func (v *flagValue) Set(s string) error { v.val = s; return nil }
func (v *flagValue) Type() string       { return v.kind }

// Load reads the configuration: defaults, then the YAML file named by
// --config, then the environment (environ, as os.Environ returns it), then
// flags set on fs. It returns every problem found at once.
func Load(fs *pflag.FlagSet, environ []string) (Config, error) {
	c, _, err := Resolve(fs, environ)
	return c, err
}

// Resolve is Load that also returns every key's effective value and where
// it came from, sorted by key, for salesagg config print and check. The
// settings are returned even when the configuration has problems (a value
// that did not decode is shown as given); the Config only without them.
func Resolve(fs *pflag.FlagSet, environ []string) (Config, []Setting, error) {
	v := viper.New()
	from := map[string]Origin{}
	for _, k := range keys {
		if k.def != "" {
			v.SetDefault(k.name, k.def)
		}
	}
	var problems []error
	if f := fs.Lookup("config"); f != nil && f.Value.String() != "" {
		// Its problems are reported with the others: the environment's
		// and the flags' are still worth knowing.
		problems = append(problems, setFromFile(v.Set, from, f.Value.String())...)
	}
	env := environment(environ)
	envProblems, links := setFromEnv(v, from, env)
	problems = append(problems, envProblems...)
	for _, k := range keys {
		if f := fs.Lookup(k.name); f != nil && f.Changed {
			v.Set(k.name, f.Value.String())
			from[k.name] = Origin{Source: FromFlag, Name: "--" + k.name}
		}
	}

	// Decode and validation problems are reported together. A key that did
	// not decode holds its zero value, so validation skips it rather than
	// report it twice.
	c, failed, errs := decode(source{v})
	problems = append(problems, errs...)
	settings := c.settings(source{v}, from, failed)
	if len(links) > 0 {
		c.Notes = append(c.Notes, "Ignoring Kubernetes service-link environment variables (a Service named like the SALESAGG_ prefix; enableServiceLinks: false in the pod spec turns them off): "+strings.Join(links, ", "))
	}
	if f := fs.Lookup("sasl.password"); f != nil && f.Changed {
		c.Warnings = append(c.Warnings, "sasl.password is given as a command-line flag: every user of the machine can read it (ps, /proc/<pid>/cmdline); put it in a file and give sasl.password.file instead")
	} else if _, ok := env[EnvName("sasl.password")]; ok {
		c.Warnings = append(c.Warnings, "sasl.password is given in the environment ("+EnvName("sasl.password")+"): it is visible in the process's environment and to anything that inherits it; put it in a file and give sasl.password.file instead")
	}
	if err := c.validate(failed); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return Config{}, settings, errors.Join(problems...)
	}
	return c, settings, nil
}

// environment maps the variables of environ (as os.Environ returns it) to
// their values.
func environment(environ []string) map[string]string {
	env := map[string]string{}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if ok {
			env[name] = val
		}
	}
	return env
}

// setFromEnv sets on v the keys given in env, and records them in from:
// KAFKA_BOOTSTRAP_SERVERS, then EnvName of each key over it. It returns a
// problem for each SALESAGG_ variable that names no key, with the nearest
// variable when one is close, and the names of the variables it ignored as
// Kubernetes service links (serviceLink).
func setFromEnv(v *viper.Viper, from map[string]Origin, env map[string]string) ([]error, []string) {
	var problems []error
	var names []string
	for _, k := range keys {
		names = append(names, EnvName(k.name))
	}
	var unknown, links []string
	for name, val := range env {
		switch {
		case !strings.HasPrefix(name, "SALESAGG_") || slices.Contains(names, name):
		case serviceLink(name, val):
			links = append(links, name)
		default:
			unknown = append(unknown, name)
		}
	}
	sort.Strings(unknown)
	sort.Strings(links)
	for _, name := range unknown {
		key := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, "SALESAGG_"), "_", "."))
		msg := fmt.Sprintf("config: unknown environment variable %s (no key %q)", name, key)
		msg += Hint(name, "SALESAGG_", names, EnvName)
		problems = append(problems, errors.New(msg))
	}
	if val, ok := env["KAFKA_BOOTSTRAP_SERVERS"]; ok {
		v.Set("bootstrap.servers", val)
		from["bootstrap.servers"] = Origin{Source: FromEnv, Name: "KAFKA_BOOTSTRAP_SERVERS"}
	}
	for _, k := range keys {
		if val, ok := env[EnvName(k.name)]; ok {
			v.Set(k.name, val)
			from[k.name] = Origin{Source: FromEnv, Name: EnvName(k.name)}
		}
	}
	return problems, links
}

// Default returns the configuration with every key at its default.
func Default() Config {
	c, err := Load(pflag.NewFlagSet("default", pflag.ContinueOnError), nil)
	if err != nil {
		panic(err) // the defaults are valid; a test guards it
	}
	return c
}

// Peek returns the values, as text, that the YAML file sets for the keys
// named, without looking at the file's other keys or checking any value:
// for a command that needs a few keys (salesagg health reads http.addr and
// the HTTP TLS files) and must not fail because of the others, which the
// service checks. A key the file does not set is not in the map. The error
// of a file that cannot be read or parsed is viper's, unwrapped, for the
// caller to say what it read the file for; naming a key that is not
// declared is an error too.
func Peek(file string, names ...string) (map[string]string, error) {
	for _, name := range names {
		if !known(name) {
			return nil, fmt.Errorf("config: peeking at %s: no key %q", file, name)
		}
	}
	v := viper.New()
	v.SetConfigFile(file)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(names))
	for _, name := range names {
		if v.IsSet(name) {
			out[name] = v.GetString(name)
		}
	}
	return out, nil
}

func known(name string) bool {
	return slices.ContainsFunc(keys, func(k key) bool { return k.name == name })
}

// decode reads every key of src into a Config, in the order of keys. It
// returns the problems found and the keys they are of.
func decode(src source) (Config, map[string]bool, []error) {
	var c Config
	var problems []error
	failed := map[string]bool{}
	for _, k := range keys {
		if err := k.bind.decode(&c, src, k); err != nil {
			problems = append(problems, err)
			failed[k.name] = true
		}
	}
	return c, failed, problems
}

// Fields returns the effective configuration as key/value pairs, for the
// start-up log line.
func (c Config) Fields() map[string]any {
	out := make(map[string]any, len(keys))
	for _, k := range keys {
		out[k.name] = k.bind.show(c)
	}
	return out
}
