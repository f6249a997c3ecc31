package state

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"go.uber.org/zap"
)

const hourMS = int64(time.Hour / time.Millisecond)

func TestWindowsBesideTheTotals(t *testing.T) {
	// Scenario: a store holds the totals and windows of two sizes; each key space answers its
	// own reads and keeps its own checkpoint, and survives a reopen. A product's windows come
	// back by time range, a window's products by name and page, the windows present by start.
	dir := t.TempDir()
	s, err := Open(dir, zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, d := s.Windows(time.Hour), s.Windows(24*time.Hour)
	if err := s.Apply([]Update{{Product: "p1", Entry: Entry{Total: 9}}}, Checkpoint{ChangelogOffset: 3, InputOffset: -1}); err != nil {
		t.Fatal(err)
	}
	hw := WindowWrite{Windows: h, Checkpoint: Checkpoint{ChangelogOffset: 5, InputOffset: -1}, Updates: []WindowUpdate{
		{Product: "p1", Start: 0, Entry: Entry{Total: 4}},
		{Product: "p1", Start: 2 * hourMS, Entry: Entry{Total: 5}},
		{Product: "p2", Start: 2 * hourMS, Entry: Entry{Total: 6}},
		{Product: "p0", Start: 2 * hourMS, Entry: Entry{Total: 1}},
		{Product: "p1", Start: 5 * hourMS, Entry: Entry{Total: 7}},
	}}
	dw := WindowWrite{Windows: d, Checkpoint: Checkpoint{ChangelogOffset: 2, InputOffset: -1}, Updates: []WindowUpdate{
		{Product: "p1", Start: 0, Entry: Entry{Total: 16}},
	}}
	hw.StreamTime, dw.StreamTime = 5*hourMS+3, -1
	if err := s.ApplyWindows([]WindowWrite{hw, dw}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir, zap.NewNop(), OpenOptions{}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h, d = s.Windows(time.Hour), s.Windows(24*time.Hour)

	// The totals are untouched by the windows, and list only products.
	if got, err := s.Scan("", 10); err != nil || !reflect.DeepEqual(got, []Total{{Product: "p1", Total: 9}}) {
		t.Fatalf("totals = %v, %v", got, err)
	}
	if n, sum, err := s.Count(); err != nil || n != 1 || sum != 9 {
		t.Fatalf("count = %d, %d, %v", n, sum, err)
	}
	if cp, ok, err := s.Checkpoint(); err != nil || !ok || cp.ChangelogOffset != 3 {
		t.Fatalf("totals checkpoint = %+v, %v, %v", cp, ok, err)
	}
	if cp, ok, err := h.Checkpoint(); err != nil || !ok || cp.ChangelogOffset != 5 {
		t.Fatalf("1h checkpoint = %+v, %v, %v", cp, ok, err)
	}
	if cp, ok, err := d.Checkpoint(); err != nil || !ok || cp.ChangelogOffset != 2 {
		t.Fatalf("24h checkpoint = %+v, %v, %v", cp, ok, err)
	}
	if st, ok, err := h.StreamTime(); err != nil || !ok || st != 5*hourMS+3 {
		t.Fatalf("1h stream time = %d, %v, %v", st, ok, err)
	}
	if _, ok, err := d.StreamTime(); err != nil || ok {
		t.Fatalf("24h stream time, never written: %v, %v", ok, err)
	}
	if _, ok, err := s.Windows(time.Minute).Checkpoint(); err != nil || ok {
		t.Fatalf("a size never written has a checkpoint: %v, %v", ok, err)
	}

	// fetch(key, from, to): the starts in range, whatever from's alignment.
	got, err := h.Fetch("p1", 1, 5*hourMS)
	if want := []WindowTotal{{"p1", 2 * hourMS, 5}, {"p1", 5 * hourMS, 7}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("1h windows of p1 from 1 ms to 5h = %v, %v; want %v", got, err, want)
	}
	got, err = h.Fetch("p1", 0, 6*hourMS)
	if err != nil || len(got) != 3 {
		t.Fatalf("1h windows of p1 from 0 to 6h = %v, %v", got, err)
	}
	if got, err := d.Fetch("p1", 0, 6*hourMS); err != nil || !reflect.DeepEqual(got, []WindowTotal{{"p1", 0, 16}}) {
		t.Fatalf("24h windows of p1 = %v, %v", got, err)
	}
	if got, err := h.Fetch("p9", 0, 6*hourMS); err != nil || len(got) != 0 {
		t.Fatalf("windows of a product never seen = %v, %v", got, err)
	}
	if _, err := h.Fetch("p1", 0, (MaxWindowReads+1)*hourMS); !errors.Is(err, ErrTooManyWindows) {
		t.Fatalf("a fetch of %d windows: %v, want ErrTooManyWindows", MaxWindowReads+2, err)
	}

	// One window's products, by name, paged.
	page, err := h.Scan(2*hourMS, "", 2)
	if want := []WindowTotal{{"p0", 2 * hourMS, 1}, {"p1", 2 * hourMS, 5}}; err != nil || !reflect.DeepEqual(page, want) {
		t.Fatalf("first page of window 2h = %v, %v; want %v", page, err, want)
	}
	page, err = h.Scan(2*hourMS, "p1", 2)
	if want := []WindowTotal{{"p2", 2 * hourMS, 6}}; err != nil || !reflect.DeepEqual(page, want) {
		t.Fatalf("second page of window 2h = %v, %v; want %v", page, err, want)
	}
	if starts, err := h.Starts(0, 10); err != nil || !reflect.DeepEqual(starts, []int64{0, 2 * hourMS, 5 * hourMS}) {
		t.Fatalf("1h starts = %v, %v", starts, err)
	}
	if starts, err := h.Starts(hourMS, 1); err != nil || !reflect.DeepEqual(starts, []int64{2 * hourMS}) {
		t.Fatalf("first 1h start from 1h = %v, %v", starts, err)
	}
	if starts, err := d.Starts(0, 10); err != nil || !reflect.DeepEqual(starts, []int64{0}) {
		t.Fatalf("24h starts = %v, %v", starts, err)
	}
}

func TestWindowsExpireBeforeAStart(t *testing.T) {
	// Scenario: a write expires every window starting before 5h with one range deletion: the
	// windows of other sizes and the totals stay; an update in the same write of a window it
	// expires is refused, as is a start off the size's grid.
	s, err := Open(t.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h, d := s.Windows(time.Hour), s.Windows(24*time.Hour)
	var ups []WindowUpdate
	for i := range int64(8) {
		ups = append(ups, WindowUpdate{Product: "p", Start: i * hourMS, Entry: Entry{Total: i + 1}})
	}
	if err := s.ApplyWindows([]WindowWrite{{Windows: h, Updates: ups}, {Windows: d, Updates: []WindowUpdate{{Product: "p", Start: 0, Entry: Entry{Total: 36}}}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]Update{{Product: "p", Entry: Entry{Total: 36}}}, Checkpoint{}); err != nil {
		t.Fatal(err)
	}
	cp := Checkpoint{ChangelogOffset: 11, InputOffset: -1}
	if err := s.ApplyWindows([]WindowWrite{{Windows: h, ExpireBefore: 5 * hourMS, Checkpoint: cp, StreamTime: -1,
		Updates: []WindowUpdate{{Product: "p", Start: 7 * hourMS, Entry: Entry{Total: 80}}}}}, false); err != nil {
		t.Fatal(err)
	}
	if starts, err := h.Starts(0, 20); err != nil || !reflect.DeepEqual(starts, []int64{5 * hourMS, 6 * hourMS, 7 * hourMS}) {
		t.Fatalf("1h starts after expiring before 5h = %v, %v", starts, err)
	}
	if got, err := h.Fetch("p", 7*hourMS, 7*hourMS); err != nil || len(got) != 1 || got[0].Total != 80 {
		t.Fatalf("window 7h = %v, %v", got, err)
	}
	if got, ok, err := h.Checkpoint(); err != nil || !ok || got != cp {
		t.Fatalf("1h checkpoint = %+v, %v, %v", got, ok, err)
	}
	if got, err := d.Fetch("p", 0, 0); err != nil || len(got) != 1 || got[0].Total != 36 {
		t.Fatalf("the 24h window after the 1h expiry = %v, %v", got, err)
	}
	if e, ok, err := s.Get("p"); err != nil || !ok || e.Total != 36 {
		t.Fatalf("the total after the 1h expiry = %v, %v, %v", e, ok, err)
	}
	err = s.ApplyWindows([]WindowWrite{{Windows: h, ExpireBefore: 6 * hourMS, Updates: []WindowUpdate{{Product: "p", Start: 5 * hourMS, Entry: Entry{Total: 1}}}}}, false)
	if err == nil {
		t.Fatal("an update of a window the same write expires was written")
	}
	if err := s.ApplyWindows([]WindowWrite{{Windows: h, Updates: []WindowUpdate{{Product: "p", Start: 90, Entry: Entry{Total: 1}}}}}, false); err == nil {
		t.Fatal("a window starting off the hour's grid was written")
	}
	// Refused writes wrote nothing.
	if starts, err := h.Starts(0, 20); err != nil || len(starts) != 3 {
		t.Fatalf("1h starts after refused writes = %v, %v", starts, err)
	}
}
