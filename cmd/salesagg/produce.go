package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/stream"
)

// runProduce sends key:value lines as kafka-console-producer does with
// parse.key=true and key.separator=":" (the key ends at the first ':'). Keys
// are partitioned with murmur2, as the Java producer does. The brokers and
// the security keys come from the configuration, as run reads it.
func runProduce(args []string) error {
	fs := pflag.NewFlagSet("produce", pflag.ContinueOnError)
	file := fs.String("file", "", "file of key:value lines ('-' for standard input)")
	topic := fs.String("topic", "", "topic to send to (default: input.topic, sales-events-v1)")
	config.RegisterKeyFlags(fs, append(config.ClientKeys(), "input.topic")...)
	commandUsage(fs, "produce --file FILE [--topic T] [--config FILE] [--KEY VALUE ...]",
		"Sends key:value lines (the key ends at the first ':'), partitioned by murmur2 as the Java producer does.")
	cfg, err := loadCommandConfig(fs, args)
	if err != nil {
		return err
	}
	if *file == "" {
		return usageError{errors.New("--file is required")}
	}
	if *topic == "" {
		*topic = cfg.InputTopic
	}
	in := io.Reader(os.Stdin)
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	recs, err := parseLines(in, *topic)
	if err != nil {
		return err
	}
	cl, err := newKafkaClient(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	servers := strings.Join(cfg.BootstrapServers, ",")
	if err := checkKafka(context.Background(), cl, cfg, "topic", *topic); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing to %s at %s: %w", *topic, servers, err)
	}
	fmt.Fprintf(os.Stderr, "sent %d records to %s\n", len(recs), *topic)
	return nil
}

// parseLines reads key:value lines, skipping blank ones. A line without the
// separator is an error naming the line, and nothing is sent.
func parseLines(in io.Reader, topic string) ([]*kgo.Record, error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var recs []*kgo.Record
	var bad []string
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			bad = append(bad, fmt.Sprintf("line %d: no ':' between key and value: %q", n, line))
			continue
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(k), Value: []byte(v)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading input: %w", err)
	}
	if len(bad) > 0 {
		return nil, usageError{errors.New(strings.Join(bad, "\n"))}
	}
	return recs, nil
}

// cliDialTimeout bounds one connection attempt of a command's client: a
// broker that does not answer is reported after it, not after the
// client's retries.
const cliDialTimeout = 5 * time.Second

// newKafkaClient returns a client of cfg's brokers, with its TLS and SASL
// (the same keys, and the same meaning, as the service's), and extra
// options. Its errors name the file at fault, never a secret.
func newKafkaClient(cfg config.Config, extra ...kgo.Opt) (*kgo.Client, error) {
	sec, err := stream.SecurityOpts(cfg.Security)
	if err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.BootstrapServers...), kgo.DialTimeout(cliDialTimeout)}, sec...)
	return kgo.NewClient(append(opts, extra...)...)
}

// closedHint explains a connection the broker closed while it was being
// set up: with SASL that is how some brokers (kfake, older Kafka) answer
// a failed authentication, where Kafka says SASL_AUTHENTICATION_FAILED.
func closedHint(sec config.Security, err error) string {
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		return ""
	}
	if sec.SASL() {
		return fmt.Sprintf(" (the broker closed the connection: the SASL authentication of %q with %s failed, or the listener does not speak %s)",
			sec.SASLUsername, sec.SASLMechanism, sec.Protocol)
	}
	return fmt.Sprintf(" (the broker closed the connection: does its listener speak %s? see security.protocol)", sec.Protocol)
}

// checkKafka asks the seed brokers, one after the other and each once, for
// the metadata of topic (what says what kind of topic it is, for the
// messages), without creating it. It returns nil at the first answer that
// knows the topic. Unlike the client's own requests, which retry until
// their deadline (a minute of silence, then "context deadline exceeded"),
// it names at once each broker with its error (connection refused, no such
// host, a failed authentication), and a topic that does not exist.
func checkKafka(ctx context.Context, cl *kgo.Client, cfg config.Config, what, topic string) error {
	servers := cfg.BootstrapServers
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = []kmsg.MetadataRequestTopic{rt}
	req.AllowAutoTopicCreation = false
	var failed []string
	for i, b := range cl.SeedBrokers() { // in the order of servers
		addr := fmt.Sprintf("seed %d", i)
		if i < len(servers) {
			addr = servers[i]
		}
		rctx, cancel := context.WithTimeout(ctx, 2*cliDialTimeout)
		defer cancel()
		resp, err := b.Request(rctx, req)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v%s", addr, err, closedHint(cfg.Security, err)))
			continue
		}
		for _, t := range resp.(*kmsg.MetadataResponse).Topics {
			switch err := kerr.ErrorForCode(t.ErrorCode); {
			case errors.Is(err, kerr.UnknownTopicOrPartition):
				return fmt.Errorf("%s %s does not exist at %s%s", what, topic, addr, otherTopics(rctx, b, topic))
			case err != nil:
				return fmt.Errorf("reading the metadata of %s %s at %s: %w", what, topic, addr, err)
			}
		}
		return nil
	}
	return fmt.Errorf("connecting to Kafka: no broker of bootstrap.servers answered: %s", strings.Join(failed, "; "))
}

// otherTopics is the hint for a topic that does not exist, from the topics
// broker b has (stream.MissingTopicHint: the nearest one's name when it is
// close, a typo, else those there are).
func otherTopics(ctx context.Context, b *kgo.Broker, topic string) string {
	resp, err := b.Request(ctx, kmsg.NewPtrMetadataRequest()) // nil topics: all of them
	if err != nil {
		return ""
	}
	var names []string
	for _, t := range resp.(*kmsg.MetadataResponse).Topics {
		if t.Topic != nil && !t.IsInternal {
			names = append(names, *t.Topic)
		}
	}
	return stream.MissingTopicHint(topic, names)
}
