// Package budget carries in a context when a request's wait for the store
// must end. The lease layer spends part of a request's time waiting for
// another request's draw; the resilient limiter then gives its store call
// only what is left, so that no request waits for the store longer than
// one timeout in all.
package budget

import (
	"context"
	"time"
)

type key struct{}

// WithDeadline returns ctx carrying deadline t. Unlike a context deadline
// it cancels nothing: a store call already sent is still read.
func WithDeadline(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, key{}, t)
}

// Deadline returns the deadline ctx carries, if any.
func Deadline(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(key{}).(time.Time)
	return t, ok
}
