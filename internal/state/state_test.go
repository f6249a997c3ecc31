package state

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
)

func TestStoreApplyGetScanCheckpoint(t *testing.T) {
	// Scenario: totals and their checkpoint are written together, read back, listed in pages, and survive a reopen.
	path := t.TempDir()
	s, err := Open(path, zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Checkpoint(); ok || err != nil {
		t.Fatalf("new store has a checkpoint: %v %v", ok, err)
	}
	var ups []Update
	for i := 0; i < 25; i++ {
		ups = append(ups, Update{Product: fmt.Sprintf("p%02d", i), Entry: Entry{Total: int64(i * 10), Offsets: sales.Offsets{{Partition: 1, Offset: int64(i)}}}})
	}
	cp := Checkpoint{ChangelogOffset: 25, InputOffset: 40, ChangelogTopicID: [16]byte{1, 2, 3}}
	if err := s.Apply(ups, cp); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]Update{{Product: "p03", Delete: true}}, Checkpoint{ChangelogOffset: 26, InputOffset: 40, ChangelogTopicID: cp.ChangelogTopicID}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path, zap.NewNop(), OpenOptions{ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, ok, err := s.Checkpoint()
	if err != nil || !ok || got.ChangelogOffset != 26 || got.InputOffset != 40 || got.ChangelogTopicID != cp.ChangelogTopicID {
		t.Fatalf("checkpoint %+v %v %v", got, ok, err)
	}
	e, ok, err := s.Get("p07")
	if err != nil || !ok || e.Total != 70 || !e.Offsets.Reflects(1, 7) || e.Offsets.Reflects(1, 8) {
		t.Fatalf("p07 = %+v %v %v", e, ok, err)
	}
	if _, ok, _ := s.Get("p03"); ok {
		t.Fatal("deleted product still there")
	}
	var all []Total
	for after := ""; ; {
		page, err := s.Scan(after, 10)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 10 {
			break
		}
		after = page[len(page)-1].Product
	}
	if len(all) != 24 || all[0].Product != "p00" || all[23].Product != "p24" {
		t.Fatalf("scan got %d products: %v", len(all), all)
	}
	n, sum, err := s.Count()
	if err != nil || n != 24 || sum != 3000-30 {
		t.Fatalf("count %d sum %d err %v", n, sum, err)
	}
}

func TestDirLockAndProcessID(t *testing.T) {
	// Scenario: a second opener of a state dir fails naming the lock file and holder; the process id is stable.
	root := t.TempDir()
	d, err := OpenDir(root, "app")
	if err != nil {
		t.Fatal(err)
	}
	id := d.ProcessID()
	if len(id) != 36 {
		t.Fatalf("process id %q", id)
	}
	_, err = OpenDir(root, "app")
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	for _, want := range []string{root + "/app/.lock", fmt.Sprintf("pid=%d", os.Getpid()), "host="} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("lock error lacks %q: %v", want, err)
		}
	}
	if err := os.MkdirAll(d.TaskPath(2), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.TaskPath(0), 0o755); err != nil {
		t.Fatal(err)
	}
	if ps, err := d.Tasks(); err != nil || len(ps) != 2 || ps[0] != 0 || ps[1] != 2 {
		t.Fatalf("tasks %v %v", ps, err)
	}
	if err := d.Wipe(2); err != nil {
		t.Fatal(err)
	}
	if ps, _ := d.Tasks(); len(ps) != 1 {
		t.Fatalf("after wipe: %v", ps)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := OpenDir(root, "app")
	if err != nil {
		t.Fatalf("reopen after close: %v", err)
	}
	defer d2.Close()
	if d2.ProcessID() != id {
		t.Fatalf("process id changed: %s -> %s", id, d2.ProcessID())
	}
}
