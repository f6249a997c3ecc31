package main

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// serviceLinks are the variables Kubernetes sets in a pod for a Service
// named salesagg with one port, http 8080.
var serviceLinks = []string{
	"SALESAGG_SERVICE_HOST=10.96.12.34",
	"SALESAGG_SERVICE_PORT=8080",
	"SALESAGG_SERVICE_PORT_HTTP=8080",
	"SALESAGG_PORT=tcp://10.96.12.34:8080",
	"SALESAGG_PORT_8080_TCP=tcp://10.96.12.34:8080",
	"SALESAGG_PORT_8080_TCP_PROTO=tcp",
	"SALESAGG_PORT_8080_TCP_PORT=8080",
	"SALESAGG_PORT_8080_TCP_ADDR=10.96.12.34",
}

func TestServiceLinkVariablesDoNotStopTheStart(t *testing.T) {
	// Scenario: a chart with a Service named salesagg and service links on: the pod's environment
	// holds SALESAGG_SERVICE_HOST, SALESAGG_PORT and the rest. config check accepts it, and run
	// starts, saying in one info line which variables it ignored; another unknown SALESAGG_
	// variable is still refused.
	code, _, stderr := runBinary(t, serviceLinks, "config", "check")
	if code != 0 {
		t.Fatalf("config check with service-link variables: exit %d:\n%s", code, stderr)
	}
	code, _, stderr = runBinary(t, append(serviceLinks, "SALESAGG_PORTS=8080"), "config", "check")
	if code != exitUsage || !strings.Contains(stderr, "unknown environment variable SALESAGG_PORTS") || strings.Contains(stderr, "SALESAGG_PORT_8080_TCP ") {
		t.Fatalf("config check with SALESAGG_PORTS: exit %d, want %d naming it only:\n%s", code, exitUsage, stderr)
	}

	p := startProc(t, serviceLinks, "run", "--bootstrap.servers", harness.FreeAddr(t), "--state.dir", t.TempDir(), "--http.addr", harness.FreeAddr(t))
	harness.WaitFor(t, 30*time.Second, "the start-up line", func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		if !strings.Contains(p.Stderr(), "Starting salesagg") {
			return errors.New("not logged yet")
		}
		return nil
	})
	_ = p.Signal(syscall.SIGTERM)
	if !p.WaitExit(45 * time.Second) {
		t.Fatal("no exit within 45 s of SIGTERM")
	}
	if n := strings.Count(p.Stderr(), "Kubernetes service-link"); n != 1 {
		t.Errorf("%d lines about the service-link variables, want 1:\n%s", n, p.Stderr())
	}
}
