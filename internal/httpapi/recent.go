package httpapi

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
)

// RecentLog is a zapcore.Core that keeps the last log entries at or above a
// level (warn by default) in a fixed ring buffer, for the status page's "last
// warnings and errors". It is independent of any Backend: tee the process
// logger into it and hand it to the status page with the option WithRecentLog:
//
//	recent := httpapi.NewRecentLog(100, zapcore.WarnLevel)
//	log = log.WithOptions(zap.WrapCore(recent.Tee))
//	srv, err := httpapi.Listen(addr, backend, log, httpapi.WithRecentLog(recent))
//
// Its memory is bounded: size entries, each message and its fields cut to
// maxRecentText bytes. Writing takes a mutex for a copy into the ring; it
// never blocks on I/O.
type RecentLog struct {
	ring   *recentRing
	level  zapcore.LevelEnabler
	fields []zapcore.Field // from With
}

// LogEntry is one entry kept by a RecentLog.
type LogEntry struct {
	Time    time.Time
	Level   zapcore.Level
	Logger  string
	Message string
	// Fields are the entry's fields, "key=value" separated by spaces, in
	// the order they were given (the logger's With fields first).
	Fields string
}

// maxRecentText bounds the message and the fields of a kept entry.
const maxRecentText = 1024

type recentRing struct {
	mu    sync.Mutex // guards buf's entries, next, full and total
	buf   []LogEntry // guarded by mu (its length is fixed at creation)
	next  int        // guarded by mu: where the next entry goes
	full  bool       // guarded by mu
	total uint64     // guarded by mu
}

// NewRecentLog returns a core keeping the last size entries enabled by
// level (nil: warn and above).
func NewRecentLog(size int, level zapcore.LevelEnabler) *RecentLog {
	if size < 1 {
		size = 1
	}
	if level == nil {
		level = zapcore.WarnLevel
	}
	return &RecentLog{ring: &recentRing{buf: make([]LogEntry, size)}, level: level}
}

// Tee returns a core writing to both c and r; pass it to zap.WrapCore.
func (r *RecentLog) Tee(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, r) }

// Enabled implements zapcore.Core.
func (r *RecentLog) Enabled(l zapcore.Level) bool { return r.level.Enabled(l) }

// With implements zapcore.Core: the returned core shares r's ring.
func (r *RecentLog) With(fields []zapcore.Field) zapcore.Core {
	c := *r
	c.fields = append(append([]zapcore.Field(nil), r.fields...), fields...)
	return &c
}

// Check implements zapcore.Core.
func (r *RecentLog) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if r.Enabled(ent.Level) {
		return ce.AddCore(ent, r)
	}
	return ce
}

// Write implements zapcore.Core.
func (r *RecentLog) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	var b strings.Builder
	for _, fs := range [][]zapcore.Field{r.fields, fields} {
		for _, f := range fs {
			if b.Len() >= maxRecentText {
				break
			}
			appendField(&b, f)
		}
	}
	e := LogEntry{
		Time:    ent.Time,
		Level:   ent.Level,
		Logger:  ent.LoggerName,
		Message: cut(ent.Message, maxRecentText),
		Fields:  cut(b.String(), maxRecentText),
	}
	ring := r.ring
	ring.mu.Lock()
	ring.buf[ring.next] = e
	ring.next = (ring.next + 1) % len(ring.buf)
	if ring.next == 0 {
		ring.full = true
	}
	ring.total++
	ring.mu.Unlock()
	return nil
}

// Sync implements zapcore.Core.
func (r *RecentLog) Sync() error { return nil }

// Entries returns the kept entries, newest first, and how many were written
// since the start (kept or not).
func (r *RecentLog) Entries() (entries []LogEntry, total uint64) {
	ring := r.ring
	ring.mu.Lock()
	defer ring.mu.Unlock()
	n := ring.next
	if ring.full {
		n = len(ring.buf)
	}
	out := make([]LogEntry, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, ring.buf[(ring.next-i+len(ring.buf))%len(ring.buf)])
	}
	return out, ring.total
}

// appendField writes " key=value" (without the leading space when first).
func appendField(b *strings.Builder, f zapcore.Field) {
	enc := zapcore.NewMapObjectEncoder()
	f.AddTo(enc)
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		if k == f.Key+"Verbose" { // an error's stack of causes: too long for a table
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		v := fmt.Sprint(enc.Fields[k])
		if v == "" || strings.ContainsAny(v, " \t\n\"=") {
			v = fmt.Sprintf("%q", v)
		}
		b.WriteString(v)
	}
}

// cut shortens s to at most n bytes, on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8Start(s[i]) {
		i--
	}
	return s[:i] + "…"
}

func utf8Start(c byte) bool { return c&0xC0 != 0x80 }
