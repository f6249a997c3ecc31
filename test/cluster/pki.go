package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is a certificate authority of the test's own and the key pairs it
// signs, written as PEM files in Dir: <name>.crt and <name>.key.
type PKI struct {
	Dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// NewPKI makes a CA (ca.crt, ca.key) in dir.
func NewPKI(dir string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "salesagg-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir, caCert: cert, caKey: key, serial: 1}
	return p, p.write("ca", der, key)
}

// CA is the path of the CA certificate.
func (p *PKI) CA() string { return filepath.Join(p.Dir, "ca.crt") }

// Cert returns the paths of the certificate and key of name.
func (p *PKI) Cert(name string) (crt, key string) {
	return filepath.Join(p.Dir, name+".crt"), filepath.Join(p.Dir, name+".key")
}

// Issue signs a key pair for name: a client certificate for cn in groups
// orgs, also a server certificate when hosts (IP addresses or DNS names)
// are given.
func (p *PKI) Issue(name, cn string, orgs []string, hosts ...string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("signing %s: %w", name, err)
	}
	return p.write(name, der, key)
}

// KeyPair writes a bare key pair (name.key, name.pub), as the service
// account token signer needs.
func (p *PKI) KeyPair(name string) (pub, priv string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	pub = filepath.Join(p.Dir, name+".pub")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return "", "", err
	}
	_, priv = p.Cert(name)
	return pub, priv, p.writeKey(priv, key)
}

func (p *PKI) write(name string, der []byte, key *ecdsa.PrivateKey) error {
	crt, keyPath := p.Cert(name)
	if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return p.writeKey(keyPath, key)
}

func (p *PKI) writeKey(path string, key *ecdsa.PrivateKey) error {
	b, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), 0o600)
}

// Kubeconfig writes a kubeconfig at path for the API server at server
// (https://127.0.0.1:PORT), authenticating with the key pair name.
func (p *PKI) Kubeconfig(path, server, name string) error {
	crt, key := p.Cert(name)
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: test
  context:
    cluster: test
    user: %s
current-context: test
`, server, p.CA(), name, crt, key, name)
	return os.WriteFile(path, []byte(cfg), 0o600)
}
