package config

import "strings"

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
