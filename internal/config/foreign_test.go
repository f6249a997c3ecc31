package config

import (
	"strings"
	"testing"
)

func TestKafkaNativeNamesSuggestOurKey(t *testing.T) {
	// Scenario: a Kafka Streams, Java client or librdkafka user writes the names they know, in the
	// file, the environment and as flags. Each is refused with the key salesagg uses for it and
	// where the name comes from, though the names are too far apart for a typo's suggestion.
	file := writeFile(t, "statestore.cache.max.bytes: 1024\nssl.ca.location: /ca.pem\nnum.stream.threads: 2\n")
	_, err := loadArgs([]string{"SALESAGG_CACHE_MAX_BYTES_BUFFERING=1024", "SALESAGG_METADATA_BROKER_LIST=k:1"},
		"--config", file, "--ssl.ca.location", "/ca.pem", "--sasl.mechanisms", "PLAIN")
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		`unknown key "statestore.cache.max.bytes" in ` + file + ` (line 1): did you mean cache.max.bytes? (statestore.cache.max.bytes is Kafka Streams' name)`,
		`unknown key "ssl.ca.location" in ` + file + ` (line 2): did you mean ssl.ca.file? (ssl.ca.location is librdkafka's name)`,
		`unknown key "num.stream.threads" in ` + file + ` (line 3): salesagg runs one goroutine per task`,
		`unknown environment variable SALESAGG_CACHE_MAX_BYTES_BUFFERING (no key "cache.max.bytes.buffering"): did you mean SALESAGG_CACHE_MAX_BYTES? (cache.max.bytes.buffering is Kafka Streams' name)`,
		`unknown environment variable SALESAGG_METADATA_BROKER_LIST (no key "metadata.broker.list"): did you mean SALESAGG_BOOTSTRAP_SERVERS? (metadata.broker.list is librdkafka's name)`,
		`unknown flag --ssl.ca.location: did you mean --ssl.ca.file? (ssl.ca.location is librdkafka's name; salesagg run --help lists the flags)`,
		`unknown flag --sasl.mechanisms: did you mean --sasl.mechanism? (sasl.mechanisms is librdkafka's name; salesagg run --help lists the flags)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
}
