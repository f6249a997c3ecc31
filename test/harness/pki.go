package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a test CA and the certificates it signed, written as PEM files in
// a directory of the test's. Used by one goroutine at a time.
type PKI struct {
	dir    string
	CA     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	CAFile string
	serial int64
}

// NewPKI makes a CA valid for an hour around now and writes its
// certificate to ca.crt.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "salesagg test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{dir: t.TempDir(), CA: ca, caKey: key, serial: 1}
	p.CAFile = filepath.Join(p.dir, "ca.crt")
	WritePEM(t, p.CAFile, "CERTIFICATE", der)
	return p
}

// Issue writes a certificate for name (server and client use, for
// localhost and 127.0.0.1) and its key to <name>.crt and <name>.key,
// returning their paths and its serial.
func (p *PKI) Issue(t testing.TB, name string) (certFile, keyFile string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	WritePEM(t, certFile, "CERTIFICATE", der)
	WritePEM(t, keyFile, "EC PRIVATE KEY", kb)
	return certFile, keyFile, p.serial
}

// WritePEM writes der as one PEM block of typ to path, atomically (a
// reader never sees half a file).
func WritePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
