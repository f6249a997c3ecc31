package main

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

func TestHTTPPortClashNamesTheHolder(t *testing.T) {
	// Scenario: http.addr's port is taken by another process (here the test itself). The service
	// fails at start naming the address, the process holding it (pid and command line, as the
	// dev broker does) and the key to change, not only "address already in use".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	p := startProc(t, nil, "run", "--bootstrap.servers", harness.FreeAddr(t), "--state.dir", t.TempDir(), "--http.addr", addr)
	if !p.WaitExit(30 * time.Second) {
		t.Fatal("the service still runs on a taken port")
	}
	for _, want := range []string{"listening on " + addr + ": address already in use, held by pid " + strconv.Itoa(os.Getpid()), "http.addr"} {
		if !strings.Contains(p.Stderr(), want) {
			t.Errorf("standard error lacks %q:\n%s", want, p.Stderr())
		}
	}
	if p.ExitCode() != exitError {
		t.Errorf("exit: %s, want %d", p.DescribeExit(), exitError)
	}
}
