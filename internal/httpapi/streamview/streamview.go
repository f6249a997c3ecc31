// Package streamview serves a *stream.Runtime over httpapi: it adapts the
// runtime's query errors to httpapi's errors (the status both read is
// internal/status's), so that httpapi reads the runtime at arm's length and
// never imports it. The service's wiring and the runtime's tests build
// their HTTP interface with it.
package streamview

import (
	"context"
	"errors"
	"time"

	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/status"
	"github.com/salesagg/salesagg/internal/stream"
)

// Backend is httpapi's Backend over a runtime.
type Backend struct{ rt *stream.Runtime }

var _ httpapi.Backend = Backend{}

// New returns rt as an httpapi.Backend.
func New(rt *stream.Runtime) Backend { return Backend{rt: rt} }

// Total is rt's Total, its error adapted (see queryError).
func (b Backend) Total(product string) (int64, bool, error) {
	total, ok, err := b.rt.Total(product)
	return total, ok, queryError(err)
}

// StandbyTotal is rt's StandbyTotal, its error adapted.
func (b Backend) StandbyTotal(product string) (int64, bool, int64, error) {
	total, ok, lag, err := b.rt.StandbyTotal(product)
	return total, ok, lag, queryError(err)
}

// StandbyServers is rt's StandbyServers.
func (b Backend) StandbyServers(product string) []status.Peer { return b.rt.StandbyServers(product) }

// TaskOf is rt's TaskOf.
func (b Backend) TaskOf(product string) string { return b.rt.TaskOf(product) }

// InstanceID is rt's InstanceID.
func (b Backend) InstanceID() string { return b.rt.InstanceID() }

// Products is rt's Products, its error adapted.
func (b Backend) Products(after string, limit int) ([]state.Total, []string, error) {
	page, unavailable, err := b.rt.Products(after, limit)
	return page, unavailable, queryError(err)
}

// TopProducts is rt's TopProducts, its error adapted.
func (b Backend) TopProducts(ctx context.Context, limit int) ([]state.Total, []string, error) {
	top, unavailable, err := b.rt.TopProducts(ctx, limit)
	return top, unavailable, queryError(err)
}

// StandbyPage is rt's StandbyPage, its error adapted.
func (b Backend) StandbyPage(ctx context.Context, task, after string, limit int, byTotal bool) ([]state.Total, int64, error) {
	page, lag, err := b.rt.StandbyPage(ctx, task, after, limit, byTotal)
	return page, lag, queryError(err)
}

// WindowSizes is rt's WindowSizes.
func (b Backend) WindowSizes() []time.Duration { return b.rt.WindowSizes() }

// ProductWindows is rt's ProductWindows, its error adapted.
func (b Backend) ProductWindows(product string, size time.Duration, from, to int64) ([]state.WindowTotal, error) {
	ws, err := b.rt.ProductWindows(product, size, from, to)
	return ws, queryError(err)
}

// StandbyWindows is rt's StandbyWindows, its error adapted.
func (b Backend) StandbyWindows(product string, size time.Duration, from, to int64) ([]state.WindowTotal, int64, error) {
	ws, lag, err := b.rt.StandbyWindows(product, size, from, to)
	return ws, lag, queryError(err)
}

// WindowPage is rt's WindowPage, its error adapted.
func (b Backend) WindowPage(size time.Duration, start int64, after string, limit int) ([]state.Total, []string, error) {
	page, unavailable, err := b.rt.WindowPage(size, start, after, limit)
	return page, unavailable, queryError(err)
}

// WindowTop is rt's WindowTop, its error adapted.
func (b Backend) WindowTop(ctx context.Context, size time.Duration, start int64, limit int) ([]state.Total, []string, error) {
	top, unavailable, err := b.rt.WindowTop(ctx, size, start, limit)
	return top, unavailable, queryError(err)
}

// StandbyWindowPage is rt's StandbyWindowPage, its error adapted.
func (b Backend) StandbyWindowPage(ctx context.Context, task string, size time.Duration, start int64, after string, limit int, byTotal bool) ([]state.Total, int64, error) {
	page, lag, err := b.rt.StandbyWindowPage(ctx, task, size, start, after, limit, byTotal)
	return page, lag, queryError(err)
}

// WindowStarts is rt's WindowStarts, its error adapted.
func (b Backend) WindowStarts(size time.Duration, from int64, limit int) ([]int64, []string, error) {
	starts, unavailable, err := b.rt.WindowStarts(size, from, limit)
	return starts, unavailable, queryError(err)
}

// Ready is rt's Ready.
func (b Backend) Ready() (bool, string) { return b.rt.Ready() }

// Healthy is rt's Healthy.
func (b Backend) Healthy() (bool, string) { return b.rt.Healthy() }

// BadEvents is rt's BadEvents.
func (b Backend) BadEvents() int64 { return b.rt.BadEvents() }

// ScanStore is rt's ScanStore.
func (b Backend) ScanStore(task, after string, limit int) ([]state.Total, error) {
	return b.rt.ScanStore(task, after, limit)
}

// Tasks is rt's Tasks.
func (b Backend) Tasks() []status.Task { return b.rt.Tasks() }

// Instances is rt's Instances.
func (b Backend) Instances() []status.Instance { return b.rt.Instances() }

// queryError is err as httpapi answers it: a *stream.NotHostedError becomes
// an *httpapi.NotHostedError naming the same owner; stream.ErrNotReady and
// stream.ErrNotHosted are marked httpapi.ErrUnavailable (503). The text is
// err's, and err stays in the chain.
func queryError(err error) error {
	if err == nil {
		return nil
	}
	var nh *stream.NotHostedError
	if errors.As(err, &nh) {
		return &httpapi.NotHostedError{Task: nh.Task, Partition: nh.Partition, Owner: nh.Owner, Server: nh.Server,
			Unroutable: nh.Unroutable, Err: err}
	}
	if errors.Is(err, stream.ErrNotReady) || errors.Is(err, stream.ErrNotHosted) {
		return httpapi.Unavailable(err)
	}
	if errors.Is(err, stream.ErrUnknownWindow) || errors.Is(err, state.ErrTooManyWindows) {
		return httpapi.BadQuery(err)
	}
	return err
}
