package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes a config file under a temporary dir and returns its path.
func writeFile(t *testing.T, text string) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "salesagg.yaml")
	if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestFlatAndNestedFilesAlike(t *testing.T) {
	// Scenario: the same settings written flat, nested (block and flow style) or mixed load the
	// same configuration; a key written both ways in one file is an error naming both spellings.
	want := "b1:9092,b2:9092"
	for name, text := range map[string]string{
		"flat":   "bootstrap.servers: b1:9092,b2:9092\nhttp.addr: 127.0.0.1:8081\nhttp.pprof: true\n",
		"nested": "bootstrap:\n  servers: [b1:9092, b2:9092]\nhttp:\n  addr: 127.0.0.1:8081\n  pprof: true\n",
		"flow":   "bootstrap: {servers: 'b1:9092,b2:9092'}\nhttp: {addr: '127.0.0.1:8081', pprof: true}\n",
		"mixed":  "bootstrap.servers: b1:9092,b2:9092\nhttp:\n  addr: 127.0.0.1:8081\nhttp.pprof: true\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := loadArgs(nil, "--config", writeFile(t, text))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(c.BootstrapServers, ","); got != want || c.HTTPAddr != "127.0.0.1:8081" || !c.HTTPPprof {
				t.Fatalf("bootstrap %q, http.addr %q, pprof %v", got, c.HTTPAddr, c.HTTPPprof)
			}
		})
	}
	_, err := loadArgs(nil, "--config", writeFile(t, "bootstrap.servers: a:1\nbootstrap:\n  servers: b:2\n"))
	if err == nil || !strings.Contains(err.Error(), `bootstrap.servers is given twice in `) ||
		!strings.Contains(err.Error(), `as "bootstrap.servers" (line 1) and as "bootstrap: servers" (line 3)`) {
		t.Fatalf("a key given both ways: %v", err)
	}
}
