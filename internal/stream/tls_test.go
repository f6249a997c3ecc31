package stream_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/config"
)

// selfSignedCA makes a CA and a server certificate for 127.0.0.1, and
// writes the CA as PEM to a file.
func selfSignedCA(t *testing.T) (server tls.Certificate, pool *x509.CertPool, caFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "salesagg test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	server = tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
	pool = x509.NewCertPool()
	pool.AddCert(caCert)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return server, pool, caFile
}

func TestTLS(t *testing.T) {
	// Scenario: the broker listens with TLS only; with security.protocol SSL and the CA in
	// ssl.ca.file the service connects, verifies the broker and processes events.
	server, pool, caFile := selfSignedCA(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{Certificates: []tls.Certificate{server}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h := harnessOn(t, c, c.ListenAddrs()[0])
	h.cfg.Security = config.Security{Protocol: config.ProtocolSSL, CAFile: caFile}

	cl := h.client(kgo.DialTLSConfig(&tls.Config{RootCAs: pool}))
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, h.cfg.InputTopic); err != nil {
		t.Fatal(err)
	}
	in := h.start(h.cfg)
	in.waitReady()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: h.cfg.InputTopic, Key: []byte("t"), Value: []byte(`{"product":"t","value":9}`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	in.waitTotals(map[string]int64{"t": 9})
}
