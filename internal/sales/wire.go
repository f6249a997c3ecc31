package sales

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Wire formats, compatible with the Kafka Streams application salesagg
// replaces:
//
//   - changelog record: key = product (UTF-8), value = the total as an 8-byte
//     big-endian int64 (Kafka's LongSerializer).
//   - notification record: key = product, value = {"sku": product, "value": total}.
//
// salesagg adds one header to each changelog record it writes, OffsetsHeader,
// carrying the input offsets the total reflects and the id of the input topic
// they are of (see Offsets). Records without it (written by the reference
// application) reflect no offsets. The same bytes follow the total in a
// store entry (internal/state). Offsets have two encodings, told apart by
// their length; all integers are big-endian:
//
//	legacy (no topic id): n × (4-byte partition, 8-byte offset)           len % 12 == 0
//	version 2:            0x02, 16-byte input topic id, then as legacy    len % 12 == 5
//
// The legacy form is what salesagg wrote before offsets carried the input
// topic's id; it decodes with a zero (unknown) TopicID. AppendEncode writes
// version 2 when the id is known, the legacy form when it is zero. Any other
// length, or another version byte, is ErrBadOffsets.

// StoreName is the name of the reference application's store, the default
// of store.name.
const StoreName = "PRODUCT_AGGREGATED_SALES"

// changelogSuffix ends the name of every changelog topic.
const changelogSuffix = "-changelog"

// ChangelogTopic returns the name of the changelog topic of store storeName
// of application appID, <appID>-<storeName>-changelog, as Kafka Streams
// names it: the reference application's changelog is salesagg's.
func ChangelogTopic(appID, storeName string) string {
	return appID + "-" + storeName + changelogSuffix
}

// IsChangelogTopic reports whether topic is named as the changelog topic of
// some application and store: whether it ends in -changelog.
func IsChangelogTopic(topic string) bool { return strings.HasSuffix(topic, changelogSuffix) }

// OffsetsHeader is the changelog record header holding the encoded Offsets of
// the total.
const OffsetsHeader = "salesagg.offsets"

// Headers of a record forwarded to the repartition topic: the input partition
// and offset the event was read from (4- and 8-byte big-endian), which
// identify it for de-duplication, and the 16-byte id of the input topic they
// are of (absent from records forwarded before it was carried: the reader
// then assumes the current input topic).
const (
	SourcePartitionHeader = "salesagg.source.partition"
	SourceOffsetHeader    = "salesagg.source.offset"
	SourceTopicIDHeader   = "salesagg.source.topic.id"
	// EventTimeHeader carries the time field (windows.time.field) of an
	// event forwarded as an amount alone, as 8-byte big-endian epoch
	// milliseconds; BadTimeHeader instead marks one whose time field could
	// not be read, its value the reason's detail. The record keeps the
	// event's own timestamp: a time field far in the future would be
	// refused by the broker as a timestamp (log.message.timestamp.after.max.ms).
	EventTimeHeader = "salesagg.event.time"
	BadTimeHeader   = "salesagg.bad.time"
)

// Headers added to a dead-lettered event, beside its own headers.
const (
	DLQTopicHeader     = "salesagg.dlq.topic"
	DLQPartitionHeader = "salesagg.dlq.partition"
	DLQOffsetHeader    = "salesagg.dlq.offset"
	DLQReasonHeader    = "salesagg.dlq.reason"
	DLQErrorHeader     = "salesagg.dlq.error"
	// DLQTruncatedHeader is "true" on a dead-letter record cut to fit
	// dlq.max.record.bytes; the original sizes of its key and value (and
	// how many of the event's own headers were left out) are in the next.
	DLQTruncatedHeader      = "salesagg.dlq.truncated"
	DLQKeyBytesHeader       = "salesagg.dlq.original.key.bytes"
	DLQValueBytesHeader     = "salesagg.dlq.original.value.bytes"
	DLQDroppedHeadersHeader = "salesagg.dlq.dropped.headers"
	// DLQHeaderPrefix starts every header salesagg sets on a dead-letter
	// record: such headers the event came with are replaced, not kept.
	DLQHeaderPrefix = "salesagg.dlq."
)

// EncodeTotal encodes a total as Kafka's LongSerializer does.
func EncodeTotal(total int64) []byte {
	return AppendTotal(make([]byte, 0, 8), total)
}

// AppendTotal appends EncodeTotal(total) to b.
func AppendTotal(b []byte, total int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(total))
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

// AppendNotification appends EncodeNotification(product, total) to b,
// without encoding/json for a product of printable ASCII other than '"' and
// '\\' (nothing to escape).
func AppendNotification(b []byte, product string, total int64) []byte {
	for i := 0; i < len(product); i++ {
		if c := product[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return append(b, EncodeNotification(product, total)...)
		}
	}
	b = append(b, `{"sku":"`...)
	b = append(b, product...)
	b = append(b, `","value":`...)
	b = strconv.AppendInt(b, total, 10)
	return append(b, '}')
}

// Notify reports whether a total at threshold or above emits a notification.
func Notify(total, threshold int64) bool { return total >= threshold }

// Offsets records, for one product, the last input offset folded into its
// total from each input partition, and the id of the input topic those
// offsets are of. An event read from input partition p at offset o is
// already reflected in the total, and is skipped when redelivered, when
// o <= the offset recorded for p. Tracking this per product (rather than one
// offset per partition) keeps totals exact when a crash falls between the
// changelog writes of two products.
//
// The topic id ties the offsets to one incarnation of the input topic: once
// the topic is deleted and recreated (or input.topic names another one), its
// offsets restart at 0 and would otherwise all look like redeliveries. A zero
// id means unknown (offsets written before ids were recorded) and matches any
// topic, so an upgrade does not fold redelivered events twice.
//
// Parts is a short list sorted by partition, not a map: a product is fed by
// one partition, or a few when producers disagree on partitioning. Offsets is
// a small value; copies share Parts (see With).
type Offsets struct {
	TopicID [16]byte
	Parts   []PartitionOffset
}

// PartitionOffset is the last input offset folded from one input partition.
type PartitionOffset struct {
	Partition int32
	Offset    int64
}

// sameTopic reports whether ids a and b may name the same topic: they are
// equal, or either is unknown (zero).
func sameTopic(a, b [16]byte) bool {
	return a == b || a == [16]byte{} || b == [16]byte{}
}

// Reflects reports whether the event at partition p, offset o of the input
// topic with id topicID is already folded in. Offsets of another topic
// reflect nothing; a zero id on either side matches.
func (offs Offsets) Reflects(topicID [16]byte, p int32, o int64) bool {
	if !sameTopic(offs.TopicID, topicID) {
		return false
	}
	for _, po := range offs.Parts {
		if po.Partition == p {
			return o <= po.Offset
		}
	}
	return false
}

// With returns offs updated so that partition p of the input topic with id
// topicID reflects offset o. Offsets of another topic (both ids non-zero and
// different) are dropped first. The result carries topicID, or keeps offs'
// id when topicID is zero (unknown). It may modify offs.Parts in place.
func (offs Offsets) With(topicID [16]byte, p int32, o int64) Offsets {
	if !sameTopic(offs.TopicID, topicID) {
		offs.Parts = nil
	}
	if topicID != ([16]byte{}) {
		offs.TopicID = topicID
	}
	// Copy on write: offs may share its parts with an entry held elsewhere
	// (a task's cache of committed entries), which must not change.
	for i := range offs.Parts {
		if offs.Parts[i].Partition == p {
			offs.Parts = slices.Clone(offs.Parts)
			offs.Parts[i].Offset = o
			return offs
		}
	}
	parts := make([]PartitionOffset, len(offs.Parts), len(offs.Parts)+1)
	copy(parts, offs.Parts)
	offs.Parts = append(parts, PartitionOffset{p, o})
	slices.SortFunc(offs.Parts, func(a, b PartitionOffset) int { return cmp.Compare(a.Partition, b.Partition) })
	return offs
}

// Set is With in place, for offsets the caller owns (they share no parts
// with offsets held elsewhere, e.g. a Clone): it allocates only when p is a
// partition offs has no offset for.
func (offs *Offsets) Set(topicID [16]byte, p int32, o int64) {
	if !sameTopic(offs.TopicID, topicID) {
		offs.Parts = offs.Parts[:0]
	}
	if topicID != ([16]byte{}) {
		offs.TopicID = topicID
	}
	for i := range offs.Parts {
		if offs.Parts[i].Partition == p {
			offs.Parts[i].Offset = o
			return
		}
	}
	offs.Parts = append(offs.Parts, PartitionOffset{p, o})
	slices.SortFunc(offs.Parts, func(a, b PartitionOffset) int { return cmp.Compare(a.Partition, b.Partition) })
}

// Clone returns a copy of offs that shares nothing with it.
func (offs Offsets) Clone() Offsets {
	return Offsets{TopicID: offs.TopicID, Parts: slices.Clone(offs.Parts)}
}

// Layout of the Offsets encodings (see the top of this file).
const (
	offsetsVersion = 2
	offsetsEntry   = 4 + 8
	offsetsHead    = 1 + 16 // version byte and topic id
)

// EncodedLen returns the length of offs' encoding.
func (offs Offsets) EncodedLen() int {
	n := offsetsEntry * len(offs.Parts)
	if offs.TopicID != ([16]byte{}) {
		n += offsetsHead
	}
	return n
}

// AppendEncode appends the encoding of offs to b: version 2 when offs has a
// topic id, the legacy form when its id is zero.
func (offs Offsets) AppendEncode(b []byte) []byte {
	if offs.TopicID != ([16]byte{}) {
		b = append(b, offsetsVersion)
		b = append(b, offs.TopicID[:]...)
	}
	for _, po := range offs.Parts {
		b = binary.BigEndian.AppendUint32(b, uint32(po.Partition))
		b = binary.BigEndian.AppendUint64(b, uint64(po.Offset))
	}
	return b
}

// CanonicalOffsets returns the encoding AppendEncode writes of what
// DecodeOffsets reads from b, without decoding it: b itself, or its parts
// alone when it is a version 2 encoding of a zero topic id (AppendEncode
// writes those in the legacy form), or nil (no offsets) when b is not an
// encoding. A bulk restore copies it as it is into the stored entry.
func CanonicalOffsets(b []byte) []byte {
	switch len(b) % offsetsEntry {
	case 0:
		return b
	case offsetsHead % offsetsEntry:
		if len(b) < offsetsHead || b[0] != offsetsVersion {
			return nil
		}
		if [16]byte(b[1:offsetsHead]) == ([16]byte{}) {
			return b[offsetsHead:]
		}
		return b
	}
	return nil
}

// ErrBadOffsets is returned when an Offsets encoding is corrupt.
var ErrBadOffsets = errors.New("sales: bad offsets encoding")

// DecodeOffsets decodes either encoding AppendEncode writes. It rejects any
// other length, or an unknown version, with ErrBadOffsets.
func DecodeOffsets(b []byte) (Offsets, error) {
	var offs Offsets
	switch len(b) % offsetsEntry {
	case 0: // legacy
	case offsetsHead % offsetsEntry:
		if len(b) < offsetsHead {
			return Offsets{}, fmt.Errorf("%w: %d bytes", ErrBadOffsets, len(b))
		}
		if b[0] != offsetsVersion {
			return Offsets{}, fmt.Errorf("%w: version %d", ErrBadOffsets, b[0])
		}
		copy(offs.TopicID[:], b[1:offsetsHead])
		b = b[offsetsHead:]
	default:
		return Offsets{}, fmt.Errorf("%w: %d bytes", ErrBadOffsets, len(b))
	}
	if len(b) > 0 {
		offs.Parts = make([]PartitionOffset, 0, len(b)/offsetsEntry)
	}
	for ; len(b) > 0; b = b[offsetsEntry:] {
		offs.Parts = append(offs.Parts, PartitionOffset{
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
