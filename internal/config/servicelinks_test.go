package config

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestKubernetesServiceLinksAreIgnored(t *testing.T) {
	// Scenario: the pod runs beside a Service named salesagg (and one named salesagg-metrics)
	// without enableServiceLinks: false, so Kubernetes sets SALESAGG_SERVICE_HOST, SALESAGG_PORT
	// and the rest. Those exact shapes are ignored, with one note naming them; any other unknown
	// SALESAGG_ variable, even one that looks close, still stops the start.
	links := []string{
		"SALESAGG_SERVICE_HOST=10.96.12.34",
		"SALESAGG_SERVICE_PORT=8080",
		"SALESAGG_SERVICE_PORT_HTTP=8080",
		"SALESAGG_PORT=tcp://10.96.12.34:8080",
		"SALESAGG_PORT_8080_TCP=tcp://10.96.12.34:8080",
		"SALESAGG_PORT_8080_TCP_PROTO=tcp",
		"SALESAGG_PORT_8080_TCP_PORT=8080",
		"SALESAGG_PORT_8080_TCP_ADDR=10.96.12.34",
		"SALESAGG_METRICS_SERVICE_HOST=fd00::12",
		"SALESAGG_METRICS_PORT_9090_UDP_ADDR=fd00::12",
	}
	c, err := Load(pflag.NewFlagSet("t", pflag.ContinueOnError), links)
	if err != nil {
		t.Fatalf("service-link variables: %v", err)
	}
	if len(c.Notes) != 1 || !strings.Contains(c.Notes[0], "SALESAGG_SERVICE_HOST") || !strings.Contains(c.Notes[0], "SALESAGG_PORT_8080_TCP_ADDR") ||
		!strings.Contains(c.Notes[0], "enableServiceLinks") {
		t.Errorf("notes %q, want one naming the variables ignored", c.Notes)
	}
	for _, bad := range []string{
		"SALESAGG_PORT=8080",                   // not tcp://host:port
		"SALESAGG_SERVICE_HOST=",               // no address
		"SALESAGG_PORTS=tcp://10.0.0.1:80",     // another name
		"SALESAGG_PORT_8080_TCP_HOST=10.0.0.1", // no such suffix
		"SALESAGG_PORT_HTTP_TCP=tcp://10.0.0.1:80",
		"SALESAGG_PORT_8080_TCP_PROTO=http",
		"SALESAGG_SERVICE_PORT=http",
	} {
		if _, err := Load(pflag.NewFlagSet("t", pflag.ContinueOnError), []string{bad}); err == nil || !strings.Contains(err.Error(), "unknown environment variable") {
			t.Errorf("%s: error %v, want unknown environment variable", bad, err)
		}
	}
}
