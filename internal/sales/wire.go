package sales

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// Wire formats, compatible with the Kafka Streams application salesagg
// replaces:
//
//   - changelog record: key = product (UTF-8), value = the total as an 8-byte
//     big-endian int64 (Kafka's LongSerializer).
//   - notification record: key = product, value = {"sku": product, "value": total}.
//
// salesagg adds one header to each changelog record it writes, OffsetsHeader,
// carrying the input offsets the total reflects (see Offsets). Records
// without it (written by the reference application) reflect no offsets.

// OffsetsHeader is the changelog record header holding the encoded Offsets of
// the total.
const OffsetsHeader = "salesagg.offsets"

// Headers of a record forwarded to the repartition topic: the input partition
// and offset the event was read from, which identify it for de-duplication.
const (
	SourcePartitionHeader = "salesagg.source.partition"
	SourceOffsetHeader    = "salesagg.source.offset"
)

// Headers added to a dead-lettered event, beside its own headers.
const (
	DLQTopicHeader     = "salesagg.dlq.topic"
	DLQPartitionHeader = "salesagg.dlq.partition"
	DLQOffsetHeader    = "salesagg.dlq.offset"
	DLQReasonHeader    = "salesagg.dlq.reason"
	DLQErrorHeader     = "salesagg.dlq.error"
)

// EncodeTotal encodes a total as Kafka's LongSerializer does.
func EncodeTotal(total int64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(total))
}

// DecodeTotal decodes a LongSerializer value.
func DecodeTotal(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("sales: decoding total: want 8 bytes, got %d", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// Notification is the value of a notification record.
type Notification struct {
	SKU   string `json:"sku"`
	Value int64  `json:"value"`
}

// EncodeNotification returns the JSON value of a notification. HTML
// characters are not escaped, as Jackson writes them.
func EncodeNotification(product string, total int64) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(Notification{SKU: product, Value: total}) // cannot fail for these types
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// Notify reports whether a total at threshold or above emits a notification.
func Notify(total, threshold int64) bool { return total >= threshold }

// Offsets records, for one product, the last input offset folded into its
// total from each input partition. An event read from input partition p at
// offset o is already reflected in the total, and is skipped when redelivered,
// when o <= Offsets[p]. Tracking this per product (rather than one offset per
// partition) keeps totals exact when a crash falls between the changelog
// writes of two products.
//
// It is a short sorted list, not a map: a product is fed by one partition,
// or a few when producers disagree on partitioning.
type Offsets []PartitionOffset

// PartitionOffset is the last input offset folded from one input partition.
type PartitionOffset struct {
	Partition int32
	Offset    int64
}

// Reflects reports whether the event at input partition p, offset o, is
// already folded in.
func (offs Offsets) Reflects(p int32, o int64) bool {
	for _, po := range offs {
		if po.Partition == p {
			return o <= po.Offset
		}
	}
	return false
}

// With returns offs updated so that partition p reflects offset o. It may
// modify offs in place.
func (offs Offsets) With(p int32, o int64) Offsets {
	for i := range offs {
		if offs[i].Partition == p {
			offs[i].Offset = o
			return offs
		}
	}
	offs = append(offs, PartitionOffset{p, o})
	slices.SortFunc(offs, func(a, b PartitionOffset) int { return int(a.Partition) - int(b.Partition) })
	return offs
}

// Clone returns a copy of offs.
func (offs Offsets) Clone() Offsets { return slices.Clone(offs) }

// AppendEncode appends the encoding of offs to b: per entry a 4-byte partition
// and an 8-byte offset, big-endian.
func (offs Offsets) AppendEncode(b []byte) []byte {
	for _, po := range offs {
		b = binary.BigEndian.AppendUint32(b, uint32(po.Partition))
		b = binary.BigEndian.AppendUint64(b, uint64(po.Offset))
	}
	return b
}

// ErrBadOffsets is returned when an Offsets encoding is corrupt.
var ErrBadOffsets = errors.New("sales: bad offsets encoding")

// DecodeOffsets decodes what AppendEncode wrote.
func DecodeOffsets(b []byte) (Offsets, error) {
	if len(b)%12 != 0 {
		return nil, ErrBadOffsets
	}
	var offs Offsets
	for ; len(b) > 0; b = b[12:] {
		offs = append(offs, PartitionOffset{
			Partition: int32(binary.BigEndian.Uint32(b)),
			Offset:    int64(binary.BigEndian.Uint64(b[4:])),
		})
	}
	return offs, nil
}

// Partition returns the partition of key among n partitions as Kafka's
// default Java partitioner chooses it (murmur2 of the key bytes), so that
// salesagg agrees with Kafka Streams about which task owns a product.
func Partition(key []byte, n int32) int32 {
	return int32((murmur2(key) & 0x7fffffff) % uint32(n))
}

// murmur2 is Kafka's Utils.murmur2.
func murmur2(data []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	length := len(data)
	h := uint32(seed) ^ uint32(length)
	for len(data) >= 4 {
		k := binary.LittleEndian.Uint32(data)
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		data = data[4:]
	}
	switch len(data) {
	case 3:
		h ^= uint32(data[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
