package main

import (
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
	"github.com/spf13/viper"

	"github.com/salesagg/salesagg/internal/config"
)

// Exit codes of "salesagg health", as Docker's HEALTHCHECK reads them: 0
// healthy, 1 unhealthy. Docker reserves 2, so health never returns it, not
// even for a bad flag.
const (
	healthOK        = 0
	healthUnhealthy = 1
)

const healthUsage = `Usage: salesagg health [--url URL | --path PATH] [--timeout D] [--config FILE] [--http.addr ADDR]

Probes the service's HTTP endpoint once: exit 0 when it answers 200, 1 otherwise
with the reason on one line of stderr. For Docker HEALTHCHECK and compose
healthcheck (the image has no shell or curl).

The default URL is http://HOST:PORT/readyz from http.addr, read like the service
reads it (--config file, SALESAGG_HTTP_ADDR, --http.addr); an empty or wildcard
host (":8080", "0.0.0.0:8080", "[::]:8080") probes 127.0.0.1.
`

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
			fmt.Fprint(stdout, healthUsage)
			fmt.Fprint(stdout, fs.FlagUsages())
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
	if target == "" {
		addr, err := healthAddr(*cfgFile, *httpAddr, environ)
		if err != nil {
			return fail("%v", err)
		}
		if !strings.HasPrefix(*path, "/") {
			return fail("--path must start with '/', got %q", *path)
		}
		target = "http://" + addr + *path
	}
	if err := probe(target, *timeout); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(stdout, "%s: 200 OK\n", target)
	return healthOK
}

// healthAddr returns host:port to probe, from http.addr as the service
// resolves it: default, --config file, SALESAGG_HTTP_ADDR, --http.addr.
func healthAddr(cfgFile, flagAddr string, environ []string) (string, error) {
	addr := flagAddr
	if addr == "" {
		addr = lookupEnv(environ, config.EnvName("http.addr"))
	}
	if addr == "" && cfgFile != "" {
		// Only http.addr is read from the file: a probe does not fail
		// because of a key it does not use (the service checks those).
		v := viper.New()
		v.SetConfigFile(cfgFile)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return "", fmt.Errorf("reading http.addr from %s: %v", cfgFile, err)
		}
		addr = v.GetString("http.addr")
	}
	if addr == "" {
		addr = config.Default().HTTPAddr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("http.addr %q: must be host:port or :port", addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
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
func probe(target string, timeout time.Duration) error {
	client := &http.Client{
		Timeout: timeout,
		// A probe talks to this one process: no proxy from the environment,
		// no redirect followed, no connection kept.
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
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
