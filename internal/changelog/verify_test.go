package changelog

import (
	"reflect"
	"strings"
	"testing"
)

func TestCompareStore(t *testing.T) {
	// Scenario: the key-by-key comparison as of a checkpoint: equal, different, only on one side,
	// deleted by a tombstone on both sides, and a product whose records up to the checkpoint were
	// compacted away (only a newer one is left) is reported as not verifiable, not as a difference.
	log := content{
		atCheckpoint: map[string]value{
			"same":      {total: 10, offset: 1},
			"differs":   {total: 20, offset: 2},
			"logonly":   {total: 30, offset: 3},
			"deleted":   {tombstone: true, offset: 4},
			"tombstone": {tombstone: true, offset: 5},
			"garbled":   {bad: "want 8 bytes, got 3", offset: 6},
		},
		later: map[string]bool{"compacted": true, "same": true},
	}
	store := map[string]int64{"same": 10, "differs": 21, "storeonly": 40, "tombstone": 50, "compacted": 60, "garbled": 1}
	diffs, unverified := compare(store, log)
	want := []string{
		`"differs": store 21, changelog 20 at offset 2`,
		`"garbled": the changelog record at offset 6 is unreadable: want 8 bytes, got 3`,
		`"logonly": not in the store, changelog 30 at offset 3`,
		`"storeonly": store 40, changelog no record below the checkpoint`,
		`"tombstone": store 50, changelog a tombstone at offset 5 below the checkpoint`,
	}
	if !reflect.DeepEqual(diffs, want) {
		t.Errorf("differences:\n%s\nwant:\n%s", strings.Join(diffs, "\n"), strings.Join(want, "\n"))
	}
	if !reflect.DeepEqual(unverified, []string{`"compacted"`}) {
		t.Errorf("unverified %v", unverified)
	}
}
