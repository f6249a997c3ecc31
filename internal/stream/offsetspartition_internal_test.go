package stream

import "testing"

// Scenario: the partition of the offsets topic that holds a group's commits
// is the one Kafka's group coordinator picks (abs of Java's String.hashCode
// modulo the partition count); the values were printed by a JVM.
func TestOffsetsPartitionMatchesKafka(t *testing.T) {
	for _, tc := range []struct {
		group string
		n     int32
		want  int32
	}{
		{"salesagg", 50, 7},
		{"e2e-brk-062635-3367", 50, 43},
		{"Ωmega-ünï", 50, 5},          // UTF-16 code units, not bytes
		{"polygenelubricants", 50, 0}, // hashCode is math.MinInt32: abs gives 0
		{"a", 50, 47},
		{"salesagg", 1, 0},
	} {
		if got := offsetsPartition(tc.group, tc.n); got != tc.want {
			t.Errorf("offsetsPartition(%q, %d) = %d, want %d", tc.group, tc.n, got, tc.want)
		}
	}
}
