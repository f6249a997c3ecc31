//go:build race

package config

// raceEnabled: under the race detector Pebble allocates its caches with
// make half the time, whatever the build (its manual.useGoAllocation).
const raceEnabled = true
