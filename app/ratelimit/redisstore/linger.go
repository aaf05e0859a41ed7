package redisstore

import "context"

// maxLingering bounds the calls that read their replies past their callers'
// deadlines at once (lingering): each holds a pooled connection until its
// reply comes or the late window ends, and a Redis that answers nothing
// (cut off) must not take the pool from the decisions. Past it a call is
// bounded by its caller's deadline, as without a late window.
const maxLingering = 8

// lingering runs call and returns what it returns, or callCtx's error once
// callCtx ends first. With a late window (OnLate) call runs under a
// deadline that late window after callCtx's, so that a reply that comes
// after the caller gave up is still read, and dropped: go-redis closes a
// connection whose read timed out, and behind a slow Redis every such call
// cost a new connection, with its dial and AUTH round trip on the slow link,
// which then timed out the next calls in turn
// (TestLateHousekeepingKeepsConnections). Only the round trip goes through
// it: what the reply changes in the store is the caller's to do, and only
// for a reply in time.
func lingering[T any](l *Store, callCtx context.Context, call func(context.Context) (T, error)) (T, error) {
	deadline, ok := callCtx.Deadline()
	if !ok || l.co == nil || l.co.late == nil || l.co.window <= 0 {
		return call(callCtx)
	}
	if l.lingering.Add(1) > maxLingering {
		l.lingering.Add(-1)
		return call(callCtx)
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(callCtx), deadline.Add(l.co.window))
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer l.lingering.Add(-1)
		defer cancel()
		v, err := call(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-callCtx.Done():
		var zero T
		return zero, callCtx.Err()
	}
}
