package main

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	brokerAddr := freeAddr(t)
	startBroker(t, filepath.Join(work, "broker"), brokerAddr)
	addr := freeAddr(t)
	// sh sets the limit (soft and hard, so that Go cannot raise it) and
	// becomes the service.
	bin := binary
	binary = "sh"
	p := startProc(t, nil, "-c", `ulimit -n 400 && exec "$0" "$@"`, bin, "run", "--bootstrap.servers", brokerAddr,
		"--state.dir", filepath.Join(work, "state"), "--http.addr", addr, "--log.format", "json", "--commit.interval.ms", "100")
	binary = bin
	p.http = "http://" + addr
	p.waitReady()
	if len(p.logLines("Lowering http.max.connections")) != 1 {
		t.Fatalf("the service did not lower http.max.connections to its file descriptor limit:\n%s", p.output())
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
	out, err := exec.Command(binary, "produce", "--file", filepath.Join("..", "..", "sample_events.txt"), "--bootstrap.servers", brokerAddr).CombinedOutput()
	if err != nil {
		t.Fatalf("produce: %v: %s", err, out)
	}
	// Read from Kafka, not over HTTP: the server may have no connection
	// left to give the test.
	waitFor(t, 60*time.Second, "the sample totals in the changelog while 450 connections are open", func() bool {
		got, _ := changelogTotals(t, brokerAddr, "sales-aggregator-PRODUCT_AGGREGATED_SALES-changelog")
		for prod, want := range sampleTotals {
			if got[prod] != want {
				return false
			}
		}
		return true
	})
	if strings.Contains(p.output(), "Cannot write its store") {
		t.Fatalf("a task stalled as if its store could not be written:\n%s", p.output())
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	p.waitTotals(sampleTotals, 60*time.Second)
	p.stop()
}
