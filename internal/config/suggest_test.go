package config

import (
	"strings"
	"testing"
)

func TestUnknownNamesSuggestTheNearestKey(t *testing.T) {
	// Scenario: a mistyped key in the file, in the environment or as a flag is reported on one line
	// with the key it is nearest to, never with the list of every key, and once however often it
	// is given; a name near no key gets no suggestion.
	file := writeFile(t, "notification.treshold: 10\nnotification:\n  topik: x\nwhatever.this.is: 1\n")
	_, err := loadArgs([]string{"SALESAGG_NOTIFICATION_TRESHOLD=1", "SALESAGG_STATE_DIRR=/x"},
		"--config", file, "--bootstrap-servers", "x:1", "--bootstrap-servers=y:1", "--http.pprofx")
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		`config: unknown key "notification.treshold" in ` + file + ` (line 1): did you mean notification.threshold?`,
		`config: unknown key "notification.topik" in ` + file + ` (line 3): did you mean notification.topic?`,
		`config: unknown key "whatever.this.is" in ` + file + ` (line 4)` + "\n",
		`config: unknown environment variable SALESAGG_NOTIFICATION_TRESHOLD (no key "notification.treshold"): did you mean SALESAGG_NOTIFICATION_THRESHOLD?`,
		`config: unknown environment variable SALESAGG_STATE_DIRR (no key "state.dirr"): did you mean SALESAGG_STATE_DIR?`,
		"unknown flag --bootstrap-servers: did you mean --bootstrap.servers? (salesagg run --help lists the flags)",
		"unknown flag --http.pprofx: did you mean --http.pprof?",
	} {
		if !strings.Contains(msg+"\n", want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "--bootstrap-servers"); n != 1 {
		t.Errorf("--bootstrap-servers reported %d times:\n%s", n, msg)
	}
	if strings.Contains(msg, "application.id") || strings.Contains(msg, "known keys") {
		t.Errorf("the error lists the keys:\n%s", msg)
	}
}

func TestSuggest(t *testing.T) {
	// Scenario: the nearest candidate within a few edits, dashes and underscores read as dots.
	keys := Keys()
	for name, want := range map[string]string{
		"bootstrap-servers":     "bootstrap.servers",
		"notification.treshold": "notification.threshold",
		"SALESAGG_HTTP_ADR":     "",
		"comit.interval.ms":     "commit.interval.ms",
		"bogus":                 "",
		"state_dir":             "state.dir",
	} {
		if got := Suggest(name, keys); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", name, got, want)
		}
	}
	if got := Suggest("SALESAGG_HTTP_ADR", []string{EnvName("http.addr")}); got != "SALESAGG_HTTP_ADDR" {
		t.Errorf("env suggestion %q", got)
	}
}
