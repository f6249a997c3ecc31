//go:build cgo

package config

// StoreCachesInHeap reports whether Pebble's block cache and memtables are
// Go heap. Built with cgo, Pebble allocates them with the C allocator: the
// collector neither scans nor frees them, and memory.limit.bytes does not
// count them.
const StoreCachesInHeap = false
