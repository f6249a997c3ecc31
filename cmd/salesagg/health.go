package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/salesagg/salesagg/internal/config"
)

// Exit codes of "salesagg health", as Docker's HEALTHCHECK reads them: 0
// healthy, 1 unhealthy. Docker reserves 2, so health never returns it, not
// even for a bad flag.
const (
	healthOK        = 0
	healthUnhealthy = 1
)

const healthLine = "health [--url URL | --path PATH] [--timeout D] [--config FILE] [--http.addr ADDR]"

const healthAbout = `Probes the service's HTTP endpoint once: exit 0 when it answers 200, 1 otherwise
with the reason on one line of stderr. For Docker HEALTHCHECK and compose
healthcheck (the image has no shell or curl).

The default URL is http://HOST:PORT/readyz from http.addr, read like the service
reads it (--config file, SALESAGG_HTTP_ADDR, --http.addr); an empty or wildcard
host (":8080", "0.0.0.0:8080", "[::]:8080") probes 127.0.0.1. With
http.tls.cert.file set (read the same way) it probes https: the certificate is
checked against http.tls.peer.ca.file (or the certificate file itself) but not
its name, since the probe asks this process on loopback.`

// runHealth implements "salesagg health". It returns the process exit code.
func runHealth(args []string, environ []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("health", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("url", "", "URL to probe (default: http://<http.addr>/readyz)")
	path := fs.String("path", "/readyz", "path probed at http.addr when --url is not given (/healthz: only alive)")
	timeout := fs.Duration("timeout", 3*time.Second, "time allowed for the whole request")
	cfgFile := fs.String("config", "", "YAML configuration file, read only for http.addr")
	httpAddr := fs.String("http.addr", "", "the service's http.addr (default: from --config, SALESAGG_HTTP_ADDR, else :8080)")
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "salesagg health: "+format+"\n", a...)
		return healthUnhealthy
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, helpText(fs, healthLine, healthAbout, false))
			return healthOK
		}
		return fail("%v (see salesagg health --help)", err)
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q (see salesagg health --help)", fs.Arg(0))
	}
	if *timeout <= 0 {
		return fail("--timeout must be positive, got %s", *timeout)
	}
	target := *url
	tgt, err := healthTarget(*cfgFile, *httpAddr, environ)
	if err != nil {
		return fail("%v", err)
	}
	if target == "" {
		if !strings.HasPrefix(*path, "/") {
			return fail("--path must start with '/', got %q", *path)
		}
		scheme := "http"
		if tgt.tls {
			scheme = "https"
		}
		target = scheme + "://" + tgt.addr + *path
	}
	if err := probe(target, *timeout, tgt.ca); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(stdout, "%s: 200 OK\n", target)
	return healthOK
}

// probeTarget is what health probes: host:port, whether over TLS, and the
// CA bundle to check the certificate with ("" with TLS: not checked).
type probeTarget struct {
	addr string
	tls  bool
	ca   string
}

// healthTarget reads http.addr and the HTTP TLS keys as the service
// resolves them: default, --config file, environment, --http.addr.
func healthTarget(cfgFile, flagAddr string, environ []string) (probeTarget, error) {
	var file map[string]string
	if cfgFile != "" {
		// Only these keys are read from the file: a probe does not fail
		// because of a key it does not use (the service checks those).
		var err error
		file, err = config.Peek(cfgFile, "http.addr", "http.tls.cert.file", "http.tls.peer.ca.file")
		if err != nil {
			return probeTarget{}, fmt.Errorf("reading http.addr from %s: %v", cfgFile, err)
		}
	}
	get := func(key, flag string) string {
		if flag != "" {
			return flag
		}
		if v := lookupEnv(environ, config.EnvName(key)); v != "" {
			return v
		}
		return file[key]
	}
	addr := get("http.addr", flagAddr)
	if addr == "" {
		addr = config.Default().HTTPAddr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return probeTarget{}, fmt.Errorf("http.addr %q: must be host:port or :port", addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	t := probeTarget{addr: net.JoinHostPort(host, port)}
	if cert := get("http.tls.cert.file", ""); cert != "" {
		t.tls, t.ca = true, cert
		if ca := get("http.tls.peer.ca.file", ""); ca != "" {
			t.ca = ca
		}
	}
	return t, nil
}

func lookupEnv(environ []string, name string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// probe GETs url once and fails unless it answers 200. The error is one line:
// the URL, the status and the reason the service gave.
//
// Over https the server's chain is checked against the PEM bundle ca (when
// given), not its name: the probe asks this process on loopback, whose
// certificate names the instance's DNS name.
func probe(target string, timeout time.Duration, ca string) error {
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	if strings.HasPrefix(target, "https://") {
		tc, err := probeTLS(ca)
		if err != nil {
			return oneLine(err.Error())
		}
		tr.TLSClientConfig = tc
	}
	client := &http.Client{
		Timeout: timeout,
		// A probe talks to this one process: no proxy from the environment,
		// no redirect followed, no connection kept.
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	req, err := http.NewRequest(http.MethodGet, target, nil)
	if err != nil {
		return oneLine(fmt.Sprintf("bad URL %q: %v", target, err))
	}
	req.Header.Set("User-Agent", "salesagg-health")
	resp, err := client.Do(req)
	if err != nil {
		var ue *neturl.Error
		if errors.As(err, &ue) {
			if ue.Timeout() {
				return fmt.Errorf("GET %s: no answer within %s", target, timeout)
			}
			err = ue.Err
		}
		return oneLine(fmt.Sprintf("GET %s: %v", target, err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	reason := strings.TrimSpace(string(body))
	var answer struct {
		Reason string `json:"reason"`
	}
	if json.Unmarshal(body, &answer) == nil && answer.Reason != "" {
		reason = answer.Reason
	}
	msg := fmt.Sprintf("GET %s: %s", target, resp.Status)
	if reason != "" {
		msg += ": " + reason
	}
	return oneLine(msg)
}

// probeTLS checks the server's chain against the bundle in ca (when set),
// without its name.
func probeTLS(ca string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} // the chain is checked below
	if ca == "" {
		return c, nil
	}
	b, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("reading the CA to check the HTTPS certificate with: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", ca)
	}
	c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("the server presented no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, r := range raw {
			var err error
			if certs[i], err = x509.ParseCertificate(r); err != nil {
				return err
			}
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter})
		return err
	}
	return c, nil
}

// oneLine folds s onto one line of at most 300 bytes.
func oneLine(s string) error {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		cut := 297
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return errors.New(s)
}

// healthMain is runHealth on the process's own arguments and streams.
func healthMain(args []string) int {
	return runHealth(args, os.Environ(), os.Stdout, os.Stderr)
}
