package state

import (
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/sales"
)

// BenchmarkApply writes batches of 1000 products with their checkpoint, as a
// commit cycle or a restore fetch does.
func BenchmarkApply(b *testing.B) {
	s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ups := make([]Update, 1000)
	for i := range ups {
		ups[i] = Update{Product: fmt.Sprintf("product%06d", i), Entry: Entry{Total: int64(i), Offsets: sales.Offsets{TopicID: [16]byte{1}, Parts: []sales.PartitionOffset{{Partition: 0, Offset: int64(i)}}}}}
	}
	b.ReportAllocs()
	n := int64(0)
	for b.Loop() {
		n++
		if err := s.Apply(ups, Checkpoint{ChangelogOffset: n}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(ups))/b.Elapsed().Seconds(), "products/s")
}

func BenchmarkGet(b *testing.B) {
	s, err := Open(b.TempDir(), zap.NewNop(), OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ups := make([]Update, 10000)
	for i := range ups {
		ups[i] = Update{Product: fmt.Sprintf("product%06d", i), Entry: Entry{Total: int64(i)}}
	}
	if err := s.Apply(ups, Checkpoint{}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, err := s.Get(ups[i%len(ups)].Product); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
