package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/httpapi/streamview"
	"github.com/salesagg/salesagg/internal/stream"
)

// listenHTTP binds the HTTP interface over rt (through streamview, which
// adapts the runtime to httpapi's Backend), with the status page's log ring,
// pprof, the security of http.* and the metrics registry.
func listenHTTP(cfg config.Config, rt *stream.Runtime, log *zap.Logger, recent *httpapi.RecentLog) (*httpapi.Server, error) {
	reg, err := newRegistry(rt)
	if err != nil {
		return nil, err
	}
	srv, err := httpapi.Listen(cfg.HTTPAddr, streamview.New(rt), log, httpapi.WithRecentLog(recent), httpapi.WithPprof(cfg.HTTPPprof),
		httpapi.WithSecurity(cfg.HTTP), httpapi.WithMetrics(reg), httpapi.WithAbout(about(cfg)))
	if err != nil {
		return nil, explainBind(cfg.HTTPAddr, err, "stop it, or give the service another http.addr (--http.addr, SALESAGG_HTTP_ADDR; make run: HTTP=host:port)")
	}
	return srv, nil
}

// newRegistry is the registry GET /metrics serves: the runtime's collector
// (the salesagg_ families), salesagg_build_info, and the Go runtime and
// process collectors, on a registry of its own (never the global one).
func newRegistry(rt prometheus.Collector) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newBuildInfoGauge(), rt} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the metrics: %w", err)
		}
	}
	return reg, nil
}
