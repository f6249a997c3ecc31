package config

import (
	"fmt"
	"slices"
	"strings"
)

// Suggest returns the candidate nearest to name, for a "did you mean"
// hint, or "" when none is near enough to be a likely typo. Names are
// compared with '-' and '_' read as '.', so that --bootstrap-servers and
// SALESAGG_BOOTSTRAP_SERVERS find bootstrap.servers; near enough is an
// edit distance of at most a quarter of the name's length (at least 1, at
// most 3). Of equally near candidates the first wins.
func Suggest(name string, candidates []string) string {
	norm := func(s string) string {
		return strings.NewReplacer("-", ".", "_", ".").Replace(strings.ToLower(s))
	}
	n := norm(name)
	limit := min(max(len(n)/4, 1), 3)
	best, bestD := "", limit+1
	for _, c := range candidates {
		if d := distance(n, norm(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b (insertions, deletions
// and substitutions of bytes), with a transposition of two neighbours
// counted as one edit (optimal string alignment): "treshold" is one edit
// from "threshold", "thershold" one too.
func distance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// foreign maps the names a Kafka Streams, Java client or librdkafka user
// knows (normalized: lower case, '-' and '_' as '.') to the key salesagg
// uses for the same thing, or to a sentence when salesagg has none. They
// are too far from our keys for Suggest to find.
var foreign = map[string]struct{ key, from, note string }{
	"statestore.cache.max.bytes":          {key: "cache.max.bytes", from: "Kafka Streams'"},
	"cache.max.bytes.buffering":           {key: "cache.max.bytes", from: "Kafka Streams'"},
	"num.stream.threads":                  {from: "Kafka Streams'", note: "salesagg runs one goroutine per task, as many as the input has partitions"},
	"default.key.serde":                   {from: "Kafka Streams'", note: "salesagg's formats are fixed (README: Wire formats)"},
	"default.value.serde":                 {from: "Kafka Streams'", note: "salesagg's formats are fixed (README: Wire formats)"},
	"internal.leave.group.on.close":       {key: "leave.group.on.close", from: "Kafka Streams'"},
	"group.id":                            {key: "application.id", from: "the Java client's"},
	"metadata.broker.list":                {key: "bootstrap.servers", from: "librdkafka's"},
	"ssl.ca.location":                     {key: "ssl.ca.file", from: "librdkafka's"},
	"ssl.certificate.location":            {key: "ssl.cert.file", from: "librdkafka's"},
	"ssl.key.location":                    {key: "ssl.key.file", from: "librdkafka's"},
	"ssl.truststore.location":             {key: "ssl.ca.file", from: "the Java client's"},
	"ssl.keystore.location":               {key: "ssl.cert.file", from: "the Java client's"},
	"ssl.key.password":                    {from: "the Java client's", note: "salesagg reads an unencrypted PEM key (ssl.key.file)"},
	"sasl.mechanisms":                     {key: "sasl.mechanism", from: "librdkafka's"},
	"sasl.jaas.config":                    {key: "sasl.username", from: "the Java client's", note: "give sasl.username and sasl.password.file"},
	"compression.codec":                   {key: "compression.type", from: "librdkafka's"},
	"num.partitions":                      {key: "topics.partitions", from: "the broker's"},
	"auto.create.topics.enable":           {key: "topics.create", from: "the broker's"},
	"allow.auto.create.topics":            {key: "topics.create", from: "the Java client's"},
	"transactional.id":                    {from: "the Java client's", note: "salesagg derives it from application.id and the process id"},
	"isolation.level":                     {key: "processing.guarantee", from: "the Java client's"},
	"statestore.cache.max.bytes.per.task": {key: "cache.max.bytes", from: "Kafka Streams'"},
}

// Hint is the "did you mean" of the unknown name (a key, an environment
// variable with prefix, or a flag's name): ": did you mean X? (where the
// name comes from)" for a name of Kafka Streams, a Kafka client or the
// broker (foreign) whose key, as name(key) spells it, is among
// candidates; ": " and a sentence for one salesagg has no key for; else
// Suggest's nearest candidate, or "".
func Hint(name, prefix string, candidates []string, spell func(key string) string) string {
	norm := strings.NewReplacer("-", ".", "_", ".").Replace(strings.ToLower(strings.TrimPrefix(name, prefix)))
	if f, ok := foreign[norm]; ok {
		note := ""
		if f.note != "" {
			note = "; " + f.note
		}
		if f.key != "" && slices.Contains(candidates, spell(f.key)) {
			return fmt.Sprintf(": did you mean %s? (%s is %s name%s)", spell(f.key), norm, f.from, note)
		}
		if f.note != "" {
			return fmt.Sprintf(": %s (%s is %s name)", f.note, norm, f.from)
		}
	}
	if s := Suggest(name, candidates); s != "" {
		return ": did you mean " + s + "?"
	}
	return ""
}
