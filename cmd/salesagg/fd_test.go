package main

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

func TestIdleConnectionsDoNotStopProcessing(t *testing.T) {
	// Scenario: the service runs with a limit of 400 file descriptors, and clients open 450
	// connections to its HTTP server and leave them idle. It lowers http.max.connections to fit
	// the limit (saying so), so the connections cannot take the descriptors its stores and Kafka
	// need: events keep being folded into the changelog, no task stalls as if the disk were full,
	// and once the clients go the HTTP server answers again.
	if testing.Short() {
		t.Skip("starts a broker and the service")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("needs sh for ulimit: ", err)
	}
	work := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	addr := harness.FreeAddr(t)
	// sh sets the limit (soft and hard, so that Go cannot raise it) and
	// becomes the service.
	p := &harness.Service{API: harness.NewAPI(addr), Proc: harness.Start(t, harness.Spec{Name: "salesagg", Path: "sh", Args: []string{
		"-c", `ulimit -n 400 && exec "$0" "$@"`, binary, "run", "--bootstrap.servers", brokerAddr,
		"--state.dir", filepath.Join(work, "state"), "--http.addr", addr, "--log.format", "json", "--commit.interval.ms", "100"}})}
	p.WaitReady(t, 60*time.Second)
	if len(p.LogsWith("Lowering http.max.connections")) != 1 {
		t.Fatalf("the service did not lower http.max.connections to its file descriptor limit:\n%s", p.Stderr())
	}

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 450 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dialing connection %d: %v", len(conns), err)
		}
		// One request, then the connection stays open, idle.
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	produceSample(t, brokerAddr)
	// Read from Kafka, not over HTTP: the server may have no connection
	// left to give the test.
	harness.WaitFor(t, 60*time.Second, "the sample totals in the changelog while 450 connections are open", func() error {
		got, _ := changelogTotals(t, brokerAddr)
		for prod, want := range harness.SampleTotals {
			if got[prod] != want {
				return fmt.Errorf("changelog %s = %d, want %d", prod, got[prod], want)
			}
		}
		return nil
	})
	if strings.Contains(p.Stderr(), "Cannot write its store") {
		t.Fatalf("a task stalled as if its store could not be written:\n%s", p.Stderr())
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	p.WaitTotals(t, harness.SampleTotals, 60*time.Second)
	p.Terminate(t)
}
