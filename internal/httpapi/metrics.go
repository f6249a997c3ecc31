package httpapi

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsHandler serves GET /metrics in the Prometheus text format from a
// registry of its own: the Go runtime and process collectors, and the
// backend when it is a prometheus.Collector (*stream.Runtime is).
func metricsHandler(b Backend) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if c, ok := b.(prometheus.Collector); ok {
		reg.MustRegister(c)
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: nil, ErrorHandling: promhttp.ContinueOnError})
}
