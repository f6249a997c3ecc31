// Package state owns salesagg's local state: the state-dir layout, the lock
// that keeps one process per state dir, the stable process id, and one Pebble
// store per task holding the totals and the checkpoint that describes them.
//
// Layout on disk:
//
//	<state.dir>/<application.id>/
//	    .lock               flock(2)-held by the running process; holds "pid=N host=H"
//	    process-metadata    {"processId": "<uuid>"}, kept across restarts
//	    0_<partition>/      one task's Pebble database
//
// A store is a cache of its changelog partition: every write is one atomic
// Pebble batch holding the new totals together with the checkpoint (the next
// changelog offset they reflect), so data and checkpoint can never disagree.
package state
