package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/salesagg/salesagg/internal/config"
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

// newKafkaClient returns a client of cfg's brokers, with its TLS and SASL
// (the same keys, and the same meaning, as the service's), and extra
// options. Its errors name the file at fault, never a secret.
func newKafkaClient(cfg config.Config, extra ...kgo.Opt) (*kgo.Client, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.BootstrapServers...)}
	sec := cfg.Security
	if sec.TLS() {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if sec.CAFile != "" {
			pem, err := os.ReadFile(sec.CAFile)
			if err != nil {
				return nil, fmt.Errorf("reading ssl.ca.file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("ssl.ca.file %s holds no PEM certificate", sec.CAFile)
			}
		}
		if sec.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(sec.CertFile, sec.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("loading ssl.cert.file %s and ssl.key.file %s: %w", sec.CertFile, sec.KeyFile, err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if sec.SASL() {
		switch sec.SASLMechanism {
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: sec.SASLUsername, Pass: sec.SASLPassword}.AsMechanism()))
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: sec.SASLUsername, Pass: sec.SASLPassword}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: sec.SASLUsername, Pass: sec.SASLPassword}.AsSha512Mechanism()))
		default:
			return nil, fmt.Errorf("unsupported sasl.mechanism %q", sec.SASLMechanism)
		}
	}
	return kgo.NewClient(append(opts, extra...)...)
}
