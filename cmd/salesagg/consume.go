package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/changelog"
	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/sales"
)

const consumeLine = `consume --topic T [--from-beginning] [--max-messages N] [--timeout D] [--bootstrap.servers B]
                        [--changelog] [--print.headers] [--print.partition] [--print.offset]`

const consumeAbout = `Prints a topic's committed records (read_committed), one per line, as kafka-console-consumer
does: [Partition:P<TAB>][Offset:O<TAB>][HEADERS<TAB>]KEY<TAB>VALUE. A changelog (--changelog, or
a topic whose name ends in -changelog) has its int64 totals decoded, tombstones shown as
(tombstone) and the salesagg.offsets header decoded; dead letters show their salesagg.dlq.*
headers always. It follows the topic until Ctrl-C, unless --max-messages or --timeout says when
to stop.`

// consumeOptions are the flags of `salesagg consume`.
type consumeOptions struct {
	topic, servers             string
	cfg                        config.Config // the brokers and their security
	fromBeginning, changelog   bool
	headers, partition, offset bool
	maxMessages                int
	idle                       time.Duration
}

// runConsume implements `salesagg consume`: a console consumer that knows
// salesagg's wire formats. It reads without a group (it commits nothing
// and joins nothing), so it never disturbs the service's.
func runConsume(args []string) error {
	var o consumeOptions
	fs := pflag.NewFlagSet("consume", pflag.ContinueOnError)
	fs.StringVar(&o.topic, "topic", "", "topic to read (required)")
	// The brokers and their TLS and SASL, read as run reads them (--config,
	// SALESAGG_*, the key flags).
	config.RegisterKeyFlags(fs, config.ClientKeys()...)
	fs.BoolVar(&o.fromBeginning, "from-beginning", false, "start at the earliest offset (default: the end, new records only)")
	fs.IntVar(&o.maxMessages, "max-messages", 0, "exit after this many records (0: no limit)")
	fs.DurationVar(&o.idle, "timeout", 0, "exit when nothing new came for this long, e.g. 5s (0: follow until Ctrl-C)")
	fs.BoolVar(&o.changelog, "changelog", false, "decode values as int64 totals and salesagg.offsets (automatic for *-changelog)")
	fs.BoolVar(&o.headers, "print.headers", false, "print each record's headers (key:value,...; NO_HEADERS when none)")
	fs.BoolVar(&o.partition, "print.partition", false, "print each record's partition")
	fs.BoolVar(&o.offset, "print.offset", false, "print each record's offset")
	commandUsage(fs, consumeLine, consumeAbout)
	cfg, err := loadCommandConfig(fs, args)
	if err != nil {
		return err
	}
	o.cfg, o.servers = cfg, strings.Join(cfg.BootstrapServers, ",")
	var problems []error
	if o.topic == "" {
		problems = append(problems, errors.New("--topic is required"))
	}
	if o.maxMessages < 0 {
		problems = append(problems, fmt.Errorf("--max-messages = %d: must be 0 (no limit) or more", o.maxMessages))
	}
	if o.idle < 0 {
		problems = append(problems, fmt.Errorf("--timeout = %s: must be 0 (follow) or more", o.idle))
	}
	if len(problems) > 0 {
		return usageError{errors.Join(problems...)}
	}
	o.changelog = o.changelog || sales.IsChangelogTopic(o.topic)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	n, err := consume(ctx, o, os.Stdout)
	// As kafka-console-consumer: the count on standard error, so that
	// standard output holds the records alone.
	fmt.Fprintf(os.Stderr, "Processed a total of %d messages\n", n)
	return err
}

// consume prints o.topic's records to w until ctx ends, o.maxMessages were
// printed or o.idle passed with nothing new; it returns how many it printed.
func consume(ctx context.Context, o consumeOptions, w io.Writer) (int, error) {
	start := kgo.NewOffset().AtEnd()
	if o.fromBeginning {
		start = kgo.NewOffset().AtStart()
	}
	cl, err := newKafkaClient(o.cfg, kgo.ConsumeTopics(o.topic),
		kgo.ConsumeResetOffset(start), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return 0, fmt.Errorf("creating the client for %s: %w", o.servers, err)
	}
	defer cl.Close()
	if err := topicExists(ctx, kadm.NewClient(cl), o.topic, o.servers); err != nil {
		return 0, err
	}
	out := bufio.NewWriter(w)
	defer out.Flush()
	n := 0
	for o.maxMessages == 0 || n < o.maxMessages {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if o.idle > 0 {
			pctx, cancel = context.WithTimeout(ctx, o.idle)
		}
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return n, nil // Ctrl-C: a normal end, as the console consumer's
		}
		if pctx.Err() != nil && fetches.NumRecords() == 0 {
			return n, nil // idle for o.idle
		}
		for _, fe := range fetches.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) && !errors.Is(fe.Err, context.Canceled) {
				return n, fmt.Errorf("reading %s partition %d from %s: %w", fe.Topic, fe.Partition, o.servers, fe.Err)
			}
		}
		for it := fetches.RecordIter(); !it.Done() && (o.maxMessages == 0 || n < o.maxMessages); n++ {
			out.WriteString(formatRecord(it.Next(), o))
			out.WriteByte('\n')
		}
		if err := out.Flush(); err != nil {
			return n, fmt.Errorf("writing the records: %w", err)
		}
	}
	return n, nil
}

// topicExists fails, within 15 s, when topic does not exist or the brokers
// cannot be reached, rather than polling forever for nothing.
func topicExists(ctx context.Context, adm *kadm.Client, topic, servers string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return fmt.Errorf("reading the metadata of %s from %s: %w", topic, servers, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		return fmt.Errorf("reading topic %s at %s: it does not exist", topic, servers)
	}
	return nil
}

// controls keeps a record on one line: newline, carriage return and tab
// (the column separator) are written escaped.
var controls = strings.NewReplacer("\n", `\n`, "\r", `\r`, "\t", `\t`)

// formatRecord is r's line: the columns o asks for, tab separated, as
// kafka-console-consumer orders them.
func formatRecord(r *kgo.Record, o consumeOptions) string {
	var cols []string
	if o.partition {
		cols = append(cols, "Partition:"+strconv.Itoa(int(r.Partition)))
	}
	if o.offset {
		cols = append(cols, "Offset:"+strconv.FormatInt(r.Offset, 10))
	}
	if o.headers || isDeadLetter(r) {
		cols = append(cols, formatHeaders(r.Headers))
	}
	key := "null"
	if r.Key != nil {
		key = string(r.Key)
	}
	return strings.Join(append(cols, controls.Replace(key), controls.Replace(formatValue(r, o.changelog))), "\t")
}

// isDeadLetter reports whether r carries the headers of a dead letter.
func isDeadLetter(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if strings.HasPrefix(h.Key, sales.DLQHeaderPrefix) {
			return true
		}
	}
	return false
}

// formatValue is r's value as the console consumer prints it ("null" for
// none), or in a changelog the total it encodes, as internal/changelog reads
// it.
func formatValue(r *kgo.Record, isChangelog bool) string {
	if !isChangelog {
		if r.Value == nil {
			return "null"
		}
		return string(r.Value)
	}
	u, err := changelog.Update(r)
	switch {
	case err != nil:
		return fmt.Sprintf("(not an int64 total: %d bytes %s)", len(r.Value), hex.EncodeToString(r.Value))
	case u.Delete:
		return "(tombstone)"
	}
	return strconv.FormatInt(u.Entry.Total, 10)
}

// formatHeaders is key:value,... with salesagg.offsets decoded
// ("p0@41 p2@7 topic=<id>"), NO_HEADERS when there are none.
func formatHeaders(hs []kgo.RecordHeader) string {
	if len(hs) == 0 {
		return "NO_HEADERS"
	}
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		v := string(h.Value)
		if h.Key == sales.OffsetsHeader {
			v = formatOffsets(h.Value)
		}
		parts = append(parts, controls.Replace(h.Key+":"+v))
	}
	return strings.Join(parts, ",")
}

// formatOffsets decodes a salesagg.offsets header: the last input offset
// folded from each input partition, and the input topic's id.
func formatOffsets(b []byte) string {
	offs, err := sales.DecodeOffsets(b)
	if err != nil {
		return "(undecodable: " + hex.EncodeToString(b) + ")"
	}
	parts := make([]string, 0, len(offs.Parts)+1)
	for _, po := range offs.Parts {
		parts = append(parts, fmt.Sprintf("p%d@%d", po.Partition, po.Offset))
	}
	if offs.TopicID != ([16]byte{}) {
		parts = append(parts, "topic="+hex.EncodeToString(offs.TopicID[:]))
	}
	return strings.Join(parts, " ")
}
