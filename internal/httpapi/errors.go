package httpapi

import (
	"errors"
	"fmt"
)

// The errors of queries, as the backend reports them and the product's
// query answers them (see writeError).

// NotHostedError is the error of a query for a product whose task runs on
// another member, or on none yet. The product's query asks the owner at
// Server; an answer that cannot is 404 naming the owner, or 503 while no
// owner is known or it cannot be asked.
type NotHostedError struct {
	Task      string // "0_<partition>"
	Partition int32
	// Owner names the member running the task, "" when unknown (a
	// rebalance is in progress).
	Owner string
	// Server is the owner's application.server, "" when unknown.
	Server string
	// Unroutable, when set, says why the owner cannot be asked.
	Unroutable string
	// Err is the backend's error: its text is the answer's "error" (nil:
	// the text is made of the fields above).
	Err error
}

// Error is Err's text, or, without Err, one made of the fields.
func (e *NotHostedError) Error() string {
	switch {
	case e.Err != nil:
		return e.Err.Error()
	case e.Owner == "":
		return fmt.Sprintf("task %s (partition %d) has no known owner yet (a rebalance is in progress)", e.Task, e.Partition)
	case e.Unroutable != "":
		return fmt.Sprintf("task %s (partition %d) runs on member %s, which %s", e.Task, e.Partition, e.Owner, e.Unroutable)
	}
	return fmt.Sprintf("task %s (partition %d) runs on member %s", e.Task, e.Partition, e.Owner)
}

// Unwrap returns Err, so that the backend's error stays in the chain.
func (e *NotHostedError) Unwrap() error { return e.Err }

// ErrUnavailable marks a query's error as temporary here (the task is not
// ready, or not hosted by this instance, and no owner is named): it is
// answered 503 with Retry-After. Mark an error with Unavailable.
var ErrUnavailable = errors.New("httpapi: unavailable here for now")

// Unavailable returns err marked as ErrUnavailable; its text is err's.
func Unavailable(err error) error { return unavailableError{err} }

type unavailableError struct{ err error }

func (u unavailableError) Error() string        { return u.err.Error() }
func (u unavailableError) Unwrap() error        { return u.err }
func (u unavailableError) Is(target error) bool { return target == ErrUnavailable }

// ErrBadQuery marks a query's error as the request's fault (a window size
// that is not configured): it is answered 400. Mark an error with BadQuery.
var ErrBadQuery = errors.New("httpapi: bad query")

// BadQuery returns err marked as ErrBadQuery; its text is err's.
func BadQuery(err error) error { return badQueryError{err} }

type badQueryError struct{ err error }

func (b badQueryError) Error() string        { return b.err.Error() }
func (b badQueryError) Unwrap() error        { return b.err }
func (b badQueryError) Is(target error) bool { return target == ErrBadQuery }
