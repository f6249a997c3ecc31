package config

import (
	"strings"
	"testing"
)

func TestAddressPortRange(t *testing.T) {
	// Scenario: a listen address or a broker with a port out of range is a configuration problem
	// naming the key and the value; port 0 listens on any free port.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http.addr", "127.0.0.1:99999"}, `config: http.addr = "127.0.0.1:99999": must be host:port or :port, with a port from 1 to 65535`},
		{[]string{"--http.addr", ":http"}, `http.addr = ":http"`},
		{[]string{"--http.addr", ":-1"}, `http.addr = ":-1"`},
		{[]string{"--bootstrap.servers", "a:9092,b:70000"}, `bootstrap.servers = "b:70000": each entry must be host:port with a port from 1 to 65535`},
		{[]string{"--bootstrap.servers", ":9092"}, `bootstrap.servers = ":9092": each entry must be host:port`},
		{[]string{"--bootstrap.servers", "a:0"}, `bootstrap.servers = "a:0"`},
	} {
		if _, err := loadArgs(nil, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	for _, ok := range []string{"127.0.0.1:0", ":65535", "[::1]:8080", "localhost:1"} {
		if _, err := loadArgs(nil, "--http.addr", ok); err != nil {
			t.Errorf("http.addr %s: %v", ok, err)
		}
	}
}
