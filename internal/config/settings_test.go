package config

import (
	"bytes"
	"testing"

	"github.com/spf13/pflag"
)

func TestResolveSources(t *testing.T) {
	// Scenario: every key's setting says where its value came from: the default (or derived), the
	// file, the environment variable or the flag, each source over the ones below it; a secret is
	// redacted wherever it came from, and the settings come back even when the config is invalid.
	file := writeFile(t, "application.id: from-file\nstate:\n  dir: /file\nnotification.threshold: 10\n")
	fs := pflag.NewFlagSet("config print", pflag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	RegisterFlags(fs)
	if err := ParseFlags(fs, []string{"--config", file, "--state.dir", "/flag", "--sasl.password", "hunter2"}); err != nil {
		t.Fatal(err)
	}
	_, settings, err := Resolve(fs, []string{"SALESAGG_NOTIFICATION_THRESHOLD=20", "KAFKA_BOOTSTRAP_SERVERS=k:1"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Setting{}
	for _, s := range settings {
		got[s.Key] = s
	}
	if len(got) != len(Keys()) {
		t.Fatalf("%d settings for %d keys", len(got), len(Keys()))
	}
	for key, want := range map[string]string{
		"application.id":         "from-file file " + file,
		"state.dir":              "/flag flag --state.dir",
		"notification.threshold": "20 env SALESAGG_NOTIFICATION_THRESHOLD",
		"bootstrap.servers":      "k:1 env KAFKA_BOOTSTRAP_SERVERS",
		"input.topic":            "sales-events-v1 default",
		"commit.interval.ms":     "100 derived",
		"sasl.password":          "[redacted] flag --sasl.password",
	} {
		if s := got[key]; s.Value+" "+s.Origin.String() != want {
			t.Errorf("%s: %q %q, want %q", key, s.Value, s.Origin, want)
		}
	}
	if got["http.pprof"].Kind != "boolean" || got["session.timeout.ms"].Kind != "milliseconds" {
		t.Errorf("kinds %q %q", got["http.pprof"].Kind, got["session.timeout.ms"].Kind)
	}

	fs = pflag.NewFlagSet("config print", pflag.ContinueOnError)
	RegisterFlags(fs)
	_ = ParseFlags(fs, []string{"--topics.partitions", "many"})
	_, settings, err = Resolve(fs, nil)
	if err == nil || len(settings) != len(Keys()) {
		t.Fatalf("invalid config: %v, %d settings", err, len(settings))
	}
	for _, s := range settings {
		if s.Key == "topics.partitions" && s.Value != "many" {
			t.Errorf("a value that did not decode is shown as %q", s.Value)
		}
	}
}
