package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
)

// runProduce sends key:value lines as kafka-console-producer does with
// parse.key=true and key.separator=":" (the key ends at the first ':'). Keys
// are partitioned with murmur2, as the Java producer does.
func runProduce(args []string) error {
	fs := pflag.NewFlagSet("produce", pflag.ContinueOnError)
	file := fs.String("file", "", "file of key:value lines ('-' for standard input)")
	topic := fs.String("topic", "sales-events-v1", "topic to send to")
	servers := fs.String("bootstrap.servers", defaultBootstrap(), "Kafka brokers, comma separated (env KAFKA_BOOTSTRAP_SERVERS)")
	if err := config.ParseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if *file == "" {
		return usageError{errors.New("--file is required")}
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
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*servers, ",")...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing to %s at %s: %w", *topic, *servers, err)
	}
	fmt.Fprintf(os.Stderr, "sent %d records to %s\n", len(recs), *topic)
	return nil
}

func defaultBootstrap() string {
	if v := os.Getenv("KAFKA_BOOTSTRAP_SERVERS"); v != "" {
		return v
	}
	if v := os.Getenv("SALESAGG_BOOTSTRAP_SERVERS"); v != "" {
		return v
	}
	return "localhost:9092"
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
