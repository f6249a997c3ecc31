package httpapi

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/salesagg/salesagg/internal/config"
)

// Option configures Handler and Listen.
type Option func(*options)

type options struct {
	recent  *RecentLog
	pprof   bool
	sec     config.HTTPSecurity
	metrics prometheus.Gatherer // nil: GET /metrics is not served
	about   About
}

// About is what the status page says of the service it runs in.
type About struct {
	ApplicationID string
	InputTopic    string
	Brokers       []string
	Guarantee     string
	// Version is the build's version (and commit), "" when unknown.
	Version string
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithSecurity serves with sec's TLS, client certificates, tokens and
// connection limit (Listen only; the zero value: plain HTTP to anyone).
func WithSecurity(sec config.HTTPSecurity) Option {
	return func(o *options) { o.sec = sec }
}

// WithPprof serves net/http/pprof's handlers under /debug/pprof/.
func WithPprof(on bool) Option {
	return func(o *options) { o.pprof = on }
}

// WithRecentLog shows the entries of log on the status page, under "last
// warnings and errors".
func WithRecentLog(log *RecentLog) Option {
	return func(o *options) { o.recent = log }
}

// WithMetrics serves GET /metrics in the Prometheus text format from g,
// continuing past a collector's error. The registry is the caller's (the
// service's holds the runtime's collector and the Go runtime and process
// collectors); without this option GET /metrics is not served.
func WithMetrics(g prometheus.Gatherer) Option {
	return func(o *options) { o.metrics = g }
}

// WithAbout shows a on the status page: the application, its input topic,
// brokers, guarantee and version.
func WithAbout(a About) Option {
	return func(o *options) { o.about = a }
}
