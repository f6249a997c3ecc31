package sales

import "testing"

func BenchmarkDecode(b *testing.B) {
	key, value := []byte("product42"), []byte(`{"product":"product42","value":1000}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(key, value); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeKey is BenchmarkDecode through the hot path's decoder,
// which copies nothing.
func BenchmarkDecodeKey(b *testing.B) {
	key, value := []byte("product42"), []byte(`{"product":"product42","value":1000}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, err := DecodeKey(key, value); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPartition(b *testing.B) {
	key := []byte("product42")
	for b.Loop() {
		_ = Partition(key, 3)
	}
}

// BenchmarkDecodeGeneral is BenchmarkDecode through encoding/json only, the
// path every event took before the canonical decoder.
func BenchmarkDecodeGeneral(b *testing.B) {
	key, value := []byte("product42"), []byte(`{"product":"product42","value":1000}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeGeneral(key, value); err != nil {
			b.Fatal(err)
		}
	}
}
