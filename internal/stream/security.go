package stream

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/salesagg/salesagg/internal/config"
)

// SecurityOpts returns the Kafka client options for sec's TLS and SASL, as
// the service connects; the command-line tools use them too, so that a key
// means the same everywhere. Errors name the file at fault, never a secret.
func SecurityOpts(sec config.Security) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if sec.TLS() {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if sec.CAFile != "" {
			pem, err := os.ReadFile(sec.CAFile)
			if err != nil {
				return nil, fmt.Errorf("reading ssl.ca.file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("ssl.ca.file %s holds no PEM certificate", sec.CAFile)
			}
			tc.RootCAs = pool
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
	return opts, nil
}
