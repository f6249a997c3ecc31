//go:build !cgo

package config

// StoreCachesInHeap reports whether Pebble's block cache and memtables are
// Go heap. Built without cgo, Pebble allocates them with make: they count
// against the memory limit, and every block read into the cache is a Go
// allocation (scripts/build.sh builds with cgo wherever it can).
const StoreCachesInHeap = true
