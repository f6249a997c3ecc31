package devbroker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Kafka's Java admin tools (kafka-topics, kafka-consumer-groups) need a few
// answers that kfake gets wrong. Each is completed here through kfake's
// control hooks: the hook takes the client's request, asks kfake the same
// question on a loopback connection of its own (marked with a private tag,
// so that the hook lets that one through), corrects kfake's answer and gives
// it to the client. See fixDescribeTopicPartitions, fixListGroups and
// fixDescribeGroups for what is wrong; each comment there is the note for an
// upstream report. OffsetFetch (the committed offsets, the CURRENT-OFFSET
// column) needs nothing: kfake answers it as Kafka does.
//
// While the hook waits for kfake's own answer, it sleeps (SleepControl) so
// that kfake's single request loop goes on serving, among others, the
// loopback request.

// innerTag marks the loopback requests: a tagged field no Kafka version
// uses (tags are flexible-version only).
const innerTag = 0x5a1e_5a1e

type fixes struct {
	c   *kfake.Cluster
	log *zap.Logger
	lb  *loopback
}

// installFixes registers the hooks on c, whose first broker listens on addr.
func installFixes(c *kfake.Cluster, addr string, log *zap.Logger) *fixes {
	f := &fixes{c: c, log: log, lb: &loopback{addr: addr, fmt: kmsg.NewRequestFormatter(kmsg.FormatterClientID("salesagg-devbroker-fixes"))}}
	f.hook(kmsg.DescribeTopicPartitions, nil, fixDescribeTopicPartitions)
	f.hook(kmsg.ListGroups, prepareListGroups, fixListGroups)
	f.hook(kmsg.DescribeGroups, nil, fixDescribeGroups)
	return f
}

func (f *fixes) close() { f.lb.close() }

// hook completes the answers to requests of key: prepare (if any) adjusts
// the copy of the request sent to kfake, fix corrects kfake's answer given
// the client's request. Requests of non-flexible versions (no tags to mark
// the loopback copy with; no Java tool of Kafka 4.x sends them) are left to
// kfake.
func (f *fixes) hook(key kmsg.Key, prepare func(inner kmsg.Request), fix func(req kmsg.Request, resp kmsg.Response)) {
	f.c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		if !req.IsFlexible() || isInner(req) {
			return nil, nil, false
		}
		inner, err := copyRequest(req)
		if err != nil {
			f.log.Warn("Cannot copy a request to complete its answer; kfake answers it as is", zap.String("request", key.Name()), zap.Error(err))
			return nil, nil, false
		}
		markInner(inner)
		if prepare != nil {
			prepare(inner)
		}
		var resp kmsg.Response
		f.c.SleepControl(func() { resp, err = f.lb.do(inner) })
		if err != nil {
			f.log.Warn("Completing an answer failed; kfake answers it as is", zap.String("request", key.Name()), zap.Error(err))
			return nil, nil, false
		}
		fix(req, resp)
		return resp, nil, true
	})
}

// fixDescribeTopicPartitions gives every partition an empty, non-null list
// of eligible leader replicas and of last known ones.
//
// kfake bug: DescribeTopicPartitions (key 75, v0) leaves
// EligibleLeaderReplicas and LastKnownElr unset, so they go out as null
// arrays (length -1). The fields are nullable in the schema, but Kafka's
// brokers always send lists (empty when ELR is off), and the Java admin
// client relies on it: DescribeTopicPartitionsResponse.
// partitionToTopicPartitionInfo calls eligibleLeaderReplicas().stream(),
// so Admin.describeTopics, kafka-topics --describe and
// kafka-consumer-groups --describe fail with a NullPointerException.
func fixDescribeTopicPartitions(_ kmsg.Request, r kmsg.Response) {
	resp := r.(*kmsg.DescribeTopicPartitionsResponse)
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			p := &resp.Topics[i].Partitions[j]
			if p.EligibleLeaderReplicas == nil {
				p.EligibleLeaderReplicas = []int32{}
			}
			if p.LastKnownELR == nil {
				p.LastKnownELR = []int32{}
			}
		}
	}
}

// prepareListGroups asks kfake for every group: it filters by state and by
// type itself, with the case-sensitive comparison that is its bug.
func prepareListGroups(inner kmsg.Request) {
	req := inner.(*kmsg.ListGroupsRequest)
	req.StatesFilter, req.TypesFilter = nil, nil
}

// fixListGroups filters the groups by the client's states and types filters,
// ignoring case as Kafka does.
//
// kfake bug: ListGroups (key 16, v4+ StatesFilter, v5+ TypesFilter)
// compares the filters case-sensitively (slices.Contains against the group's
// state, e.g. "Stable", and its type, "classic" or "consumer"), while Kafka
// parses them ignoring case (GroupType.parse, GroupState.parse) and the Java
// admin client sends the types capitalized, as GroupType.toString gives them
// ("Classic", "Consumer"). So Admin.listGroups with a types filter, e.g.
// kafka-consumer-groups --list (ListGroupsOptions.forConsumerGroups), gets no
// group at all. (kfake's share groups, listed in the same handler, use a
// case-insensitive containsFold already.)
func fixListGroups(r kmsg.Request, rr kmsg.Response) {
	req := r.(*kmsg.ListGroupsRequest)
	resp := rr.(*kmsg.ListGroupsResponse)
	keep := resp.Groups[:0]
	for _, g := range resp.Groups {
		if len(req.StatesFilter) > 0 && !containsFold(req.StatesFilter, g.GroupState) {
			continue
		}
		typ := g.GroupType
		if typ == "" {
			typ = "classic"
		}
		if len(req.TypesFilter) > 0 && !containsFold(req.TypesFilter, typ) {
			continue
		}
		keep = append(keep, g)
	}
	resp.Groups = keep
}

// fixDescribeGroups gives each member's client host as Kafka does, the
// address without the port and with a leading slash (Java's
// InetAddress.toString: "/127.0.0.1"), and names a group that does not exist
// in the error message.
//
// kfake difference (cosmetic): DescribeGroups (key 15) answers the member's
// ClientHost as the connection's remote "ip:port", and GROUP_ID_NOT_FOUND
// (v6+) without an ErrorMessage.
func fixDescribeGroups(_ kmsg.Request, r kmsg.Response) {
	resp := r.(*kmsg.DescribeGroupsResponse)
	for i := range resp.Groups {
		g := &resp.Groups[i]
		if g.ErrorCode == kerr.GroupIDNotFound.Code && g.ErrorMessage == nil {
			g.ErrorMessage = kmsg.StringPtr(fmt.Sprintf("Group %s not found.", g.Group))
		}
		for j := range g.Members {
			m := &g.Members[j]
			if host, _, err := net.SplitHostPort(m.ClientHost); err == nil {
				m.ClientHost = "/" + host
			}
		}
	}
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(strings.TrimSpace(v), s) {
			return true
		}
	}
	return false
}

// tagsOf returns the request's top-level unknown tags.
func tagsOf(req kmsg.Request) *kmsg.Tags {
	v := reflect.ValueOf(req)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	f := v.Elem().FieldByName("UnknownTags")
	if !f.IsValid() || !f.CanAddr() {
		return nil
	}
	t, _ := f.Addr().Interface().(*kmsg.Tags)
	return t
}

func isInner(req kmsg.Request) bool {
	t := tagsOf(req)
	if t == nil {
		return false
	}
	found := false
	t.Each(func(k uint32, _ []byte) { found = found || k == innerTag })
	return found
}

func markInner(req kmsg.Request) {
	if t := tagsOf(req); t != nil {
		t.Set(innerTag, nil)
	}
}

// copyRequest returns a deep copy of req, at its version.
func copyRequest(req kmsg.Request) (kmsg.Request, error) {
	cp := kmsg.RequestForKey(req.Key())
	if cp == nil {
		return nil, fmt.Errorf("unknown request key %d", req.Key())
	}
	cp.SetVersion(req.GetVersion())
	if err := cp.ReadFrom(req.AppendTo(nil)); err != nil {
		return nil, err
	}
	return cp, nil
}

// loopback is a Kafka connection of the broker to itself: requests at
// exactly the version given (a client library would negotiate its own), one
// at a time.
type loopback struct {
	addr string
	fmt  *kmsg.RequestFormatter

	// mu guards the connection and makes the requests one at a time: it is
	// held for a whole round trip (roundTrip runs under it).
	mu   sync.Mutex
	conn net.Conn      // guarded by mu; nil until dialled and after a failure
	rd   *bufio.Reader // guarded by mu
	corr int32         // guarded by mu: the last correlation id sent
}

func (l *loopback) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		_ = l.conn.Close()
		l.conn = nil
	}
}

func (l *loopback) do(req kmsg.Request) (kmsg.Response, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	resp, err := l.roundTrip(req)
	if err != nil && l.conn != nil {
		_ = l.conn.Close()
		l.conn = nil
	}
	return resp, err
}

// roundTrip sends req and reads its answer; l.mu is held.
func (l *loopback) roundTrip(req kmsg.Request) (kmsg.Response, error) {
	if l.conn == nil {
		conn, err := net.DialTimeout("tcp", l.addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		l.conn, l.rd = conn, bufio.NewReader(conn)
	}
	if err := l.conn.SetDeadline(time.Now().Add(15 * time.Second)); err != nil {
		return nil, err
	}
	l.corr++
	if _, err := l.conn.Write(l.fmt.AppendRequest(nil, req, l.corr)); err != nil {
		return nil, err
	}
	var size [4]byte
	if _, err := io.ReadFull(l.rd, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 4 || n > 64<<20 {
		return nil, fmt.Errorf("answer of %d bytes", n)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(l.rd, buf); err != nil {
		return nil, err
	}
	if corr := int32(binary.BigEndian.Uint32(buf)); corr != l.corr {
		return nil, fmt.Errorf("answer to request %d, want %d", corr, l.corr)
	}
	body := buf[4:]
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if resp.IsFlexible() && req.Key() != int16(kmsg.ApiVersions) {
		// The response header's tagged fields.
		count, k := binary.Uvarint(body)
		if k <= 0 {
			return nil, errors.New("bad response header")
		}
		body = body[k:]
		for range count {
			_, k := binary.Uvarint(body) // tag
			if k <= 0 {
				return nil, errors.New("bad response header tag")
			}
			body = body[k:]
			sz, k := binary.Uvarint(body)
			if k <= 0 || uint64(len(body)-k) < sz {
				return nil, errors.New("bad response header tag")
			}
			body = body[k+int(sz):]
		}
	}
	if err := resp.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decoding the answer: %w", err)
	}
	return resp, nil
}
