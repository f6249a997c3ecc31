package stream_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStoreOfAnotherApplicationIDIsWipedNamingWhy(t *testing.T) {
	// Scenario: the state dir of application "app-a" (its stores checkpointed against changelog
	// app-a-PRODUCT_AGGREGATED_SALES-changelog) is moved to be application "app-b"'s, and app-b
	// starts: each task warns that the checkpoint is of app-a's changelog, not app-b's (the
	// store was written under another application.id or store.name), wipes its store and
	// restores from app-b's changelog; no line claims that the changelog was recreated, and no
	// total of app-a is served.
	h := newHarness(t)
	h.cfg.ApplicationID = "app-a"
	h.seedAndStop(t)
	cfgA := h.cfg
	cfgB := h.cfg
	cfgB.ApplicationID = "app-b"
	if err := os.Rename(filepath.Join(h.stateDir, "app-a"), filepath.Join(h.stateDir, "app-b")); err != nil {
		t.Fatal(err)
	}
	// The group app-b is new: it would read the input from its start. Past its end
	// (auto.offset.reset=latest), whatever it serves could only have come from app-a's stores.
	cfgB.AutoOffsetReset = "latest"
	in := h.start(cfgB)
	in.waitReady()
	if n := in.logs.FilterMessageSnippet("recreated").Len(); n != 0 {
		t.Errorf("%d lines say the changelog was recreated: %v", n, in.logs.FilterMessageSnippet("recreated").All())
	}
	warned := in.logs.FilterMessageSnippet("The checkpoint is of changelog " + cfgA.ChangelogTopic() + ", not " + cfgB.ChangelogTopic()).All()
	if len(warned) != 3 {
		t.Fatalf("%d warnings naming app-a's changelog, want one per task (3): %v", len(warned), in.logs.All())
	}
	for _, w := range warned {
		if w.Level.String() != "warn" || !strings.Contains(w.Message, "another application.id or store.name") || !strings.Contains(w.Message, "wiping the store") {
			t.Fatalf("warning = %s %q", w.Level, w.Message)
		}
	}
	if total, code := in.total("product1"); code != 404 {
		t.Fatalf("app-a's total served by app-b: %d (http %d)", total, code)
	}
}
