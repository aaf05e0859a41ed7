package invariant

// What a key is judged against when its quota is not one policy for the
// whole run: a policy change that reaches the instances one by one
// (Change), and an operator's reset of the key (its requests before and
// after are judged as two keys).

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Change is a route's policy change during the run, reaching the instances
// one by one. Before is in force until the first instance's reload began
// (FirstMS, the earliest reload event's t_send); the route's policy of
// Input.Policies once the last one's had ended (LastMS, the latest reload
// event's t_recv).
type Change struct {
	Before          Policy
	FirstMS, LastMS float64
}

// quota is what a set of one key's admitted requests may hold: Limit for
// the window algorithms, Capacity and Refill (units per µs) for the token
// bucket and GCRA.
type quota struct {
	limit, capacity, refill float64
}

func quotaOf(p Policy) quota {
	return quota{limit: float64(p.Limit), capacity: float64(p.capacity()), refill: float64(p.Limit) / float64(p.Window.Microseconds())}
}

// allowance gives a set of one key's admitted requests its quota from the
// set's earliest t_send and latest t_recv (µs). Without a change it is the
// policy's. With one, while the instances disagree the fleet may admit
// what the old policy allows plus what the new one does, for one window:
// a set that ends before the first reload began has the old quota, a set
// that begins a window or more after the last reload ended the new one,
// every other set their sum (limits and capacities added, the faster
// refill).
type allowance struct {
	after   quota
	changed bool
	before  quota
	both    quota
	first   int64 // µs: the first reload's t_send
	settled int64 // µs: the last reload's t_recv plus a window
}

func newAllowance(p Policy, c *Change) (allowance, error) {
	al := allowance{after: quotaOf(p)}
	if c == nil {
		return al, nil
	}
	b := c.Before
	if b.Algorithm != p.Algorithm || b.Window != p.Window {
		return al, fmt.Errorf("policy %q changed its algorithm or window (%s/%v to %s/%v): not judged", p.Name, b.Algorithm, b.Window, p.Algorithm, p.Window)
	}
	al.changed = true
	al.before = quotaOf(b)
	al.both = quota{limit: al.before.limit + al.after.limit, capacity: al.before.capacity + al.after.capacity,
		refill: math.Max(al.before.refill, al.after.refill)}
	al.first = msToUS(c.FirstMS)
	al.settled = msToUS(c.LastMS) + p.Window.Microseconds()
	return al, nil
}

// of is the quota of a set spanning [minSend, maxRecv].
func (a allowance) of(minSend, maxRecv int64) quota {
	switch {
	case !a.changed:
		return a.after
	case maxRecv < a.first:
		return a.before
	case minSend >= a.settled:
		return a.after
	}
	return a.both
}

// cuts are the t_recv values below which a set's quota may change (the
// first reload): the window computations try each as a set's bound.
func (a allowance) cuts() []int64 {
	if !a.changed {
		return nil
	}
	return []int64{a.first}
}

// resetSpan is a reset's bracket in µs.
type resetSpan struct{ send, recv int64 }

// resetsByKey reads the reset events: per key, its resets' brackets in
// time order.
func resetsByKey(events []Event) map[string][]resetSpan {
	out := map[string][]resetSpan{}
	for _, e := range events {
		if e.Event != EventReset || e.Key == "" {
			continue
		}
		out[e.Key] = append(out[e.Key], resetSpan{send: msToUS(e.TSendMS), recv: msToUS(e.TRecvMS)})
	}
	for _, rs := range out {
		slices.SortFunc(rs, func(a, b resetSpan) int { return cmp.Compare(a.send, b.send) })
	}
	return out
}

// segments splits one key's requests at its resets: the requests
// certainly decided between two resets (received before the next one was
// sent, sent after the previous one was answered) form one segment, judged
// against a fresh quota. A request whose bracket overlaps a reset's is in
// no segment: whether its usage counts before or after is not certain.
// Without resets the requests are one segment.
func segments(reqs []Request, resets []resetSpan) [][]Request {
	if len(resets) == 0 {
		return [][]Request{reqs}
	}
	out := make([][]Request, len(resets)+1)
	for _, r := range reqs {
		s, v := sendUS(r), recvUS(r)
		k := 0
		for k < len(resets) && s > resets[k].recv {
			k++
		}
		// r was sent after resets[:k] were answered: segment k, if it was
		// received before resets[k] was sent.
		if k < len(resets) && v >= resets[k].send {
			continue
		}
		out[k] = append(out[k], r)
	}
	return out
}
