package ratelimit

// Weight scales what a request takes, so that a decider can hold back part
// of a policy for instances that may be deciding elsewhere (a partitioned
// instance spending its fallback share). With Weight{Num: n, Den: d} the
// decider admits as if it had d/n of the policy: the token bucket and GCRA
// charge cost × n/d (so both the burst and the rate shrink), the window
// algorithms admit up to ⌊limit × d/n⌋. The zero value is {1, 1}: the whole
// policy.
type Weight struct {
	Num, Den int64
}

// Valid reports whether w is the zero value or 1 <= Den <= Num <= 1024.
func (w Weight) Valid() bool {
	return w == Weight{} || w.Den >= 1 && w.Den <= w.Num && w.Num <= 1024
}
