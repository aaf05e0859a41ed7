package invariant

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
)

// bracket is an admitted request's decision interval [send, recv], in µs.
type bracket struct{ send, recv int64 }

func brackets(reqs []Request) []bracket {
	out := make([]bracket, 0, len(reqs))
	for _, r := range reqs {
		if r.Admitted() {
			out = append(out, bracket{send: sendUS(r), recv: recvUS(r)})
		}
	}
	slices.SortFunc(out, func(a, b bracket) int {
		if a.send != b.send {
			return cmp.Compare(a.send, b.send)
		}
		return cmp.Compare(a.recv, b.recv)
	})
	return out
}

// KeyOverAdmission is the over-admission ratio of one key's requests per
// phase (indexed like phases); NaN where the phase has no admitted request
// of the key to judge.
//
//   - Sliding window log: the largest number of admitted requests with
//     max(t_recv) - min(t_send) < window (so all of them were certainly
//     decided within one window), divided by the limit.
//   - Sliding window counter: the same, counting only sets that lie in one
//     aligned window (Unix epoch aligned): min(t_send) >= the window's start
//     and max(t_recv) < its end. A bracket that straddles a boundary is not
//     certain to be in either window and is not counted.
//   - Token bucket and GCRA: 1 + max(n - capacity - refill * (t_recv_max -
//     t_send[i])) / capacity over every run i..j (n = j-i+1 requests,
//     consecutive in t_send order) of admitted requests, refill being
//     Limit/Window and t_recv_max the latest t_recv in the run (t_recv[j]
//     when the answers come back in order): the run's decisions certainly
//     happened within [t_send[i], t_recv_max], over which one limiter could
//     admit at most capacity + refill * that span.
//
// A set is attributed to the phase in which its last request was received.
func KeyOverAdmission(p Policy, reqs []Request, phases []Phase) ([]float64, error) {
	return keyOverAdmission(p, nil, reqs, phases)
}

// keyOverAdmission is KeyOverAdmission with the policy change c (nil:
// none): each set is judged against its allowance (allowance.of), the
// ratio being its count over its limit (window algorithms), or 1 + (n -
// capacity - refill * span) / capacity with the allowance's capacity and
// refill.
func keyOverAdmission(p Policy, c *Change, reqs []Request, phases []Phase) ([]float64, error) {
	ps := spans(phases)
	adm := brackets(reqs)
	out := make([]float64, len(ps))
	for i := range out {
		out[i] = math.NaN()
	}
	w := p.Window.Microseconds()
	if w <= 0 || p.Limit <= 0 {
		return nil, fmt.Errorf("over_admission: policy %q: no limit or window", p.Name)
	}
	al, err := newAllowance(p, c)
	if err != nil {
		return nil, fmt.Errorf("over_admission: %w", err)
	}
	switch p.Algorithm {
	case ideal.SlidingWindowLog:
		windowLogRatios(adm, w, ps, al, out)
	case ideal.SlidingWindowCounter:
		alignedWindowRatios(adm, w, ps, al, out)
	case ideal.TokenBucket, ideal.GCRA:
		for i := range adm {
			maxRecv := int64(math.MinInt64)
			for j := i; j < len(adm); j++ {
				maxRecv = max(maxRecv, adm[j].recv)
				k := phaseOf(ps, maxRecv)
				if k < 0 {
					continue
				}
				q := al.of(adm[i].send, maxRecv)
				n := float64(j - i + 1)
				v := 1 + (n-q.capacity-q.refill*float64(maxRecv-adm[i].send))/q.capacity
				if math.IsNaN(out[k]) || v > out[k] {
					out[k] = v
				}
			}
		}
	default:
		return nil, fmt.Errorf("over_admission: unknown algorithm %q", p.Algorithm)
	}
	return out, nil
}

// windowLogRatios: per phase, the largest count over limit of a set with
// max(recv) - min(send) < w whose latest recv falls in the phase. For an
// anchor a (a send time of the set's earliest request) the largest such
// set within phase P is every request with send >= a and recv < min(a+w,
// P.end); it belongs to P if its latest recv is at least P.start. Where the
// allowance changes with the set's latest recv, the set cut there is tried
// too.
func windowLogRatios(adm []bracket, w int64, ps []phaseSpan, al allowance, out []float64) {
	var recvs []int64
	for i := range adm {
		a := adm[i].send
		recvs = recvs[:0]
		for j := i; j < len(adm) && adm[j].send < a+w; j++ {
			if adm[j].recv < a+w {
				recvs = append(recvs, adm[j].recv)
			}
		}
		ratiosInPhases(recvs, a, a+w, ps, al, out)
	}
}

// alignedWindowRatios: per phase, the largest count over limit of the
// requests certainly decided within one aligned window [k*w, (k+1)*w),
// attributed like windowLogRatios. With a change, the window's requests
// sent from the time its allowance becomes the new policy's are tried as a
// set of their own as well.
func alignedWindowRatios(adm []bracket, w int64, ps []phaseSpan, al allowance, out []float64) {
	byWindow := map[int64][]bracket{}
	var order []int64
	for _, b := range adm {
		k := floorDiv(b.send, w)
		if b.recv >= (k+1)*w {
			continue // straddles the boundary: not certainly in window k
		}
		if _, ok := byWindow[k]; !ok {
			order = append(order, k)
		}
		byWindow[k] = append(byWindow[k], b)
	}
	var recvs []int64
	for _, k := range order {
		bs := byWindow[k] // in send order (adm is)
		anchors := []int64{bs[0].send}
		if al.changed {
			for _, b := range bs {
				if b.send >= al.settled {
					anchors = append(anchors, b.send)
					break
				}
			}
		}
		for _, a := range anchors {
			recvs = recvs[:0]
			for _, b := range bs {
				if b.send >= a {
					recvs = append(recvs, b.recv)
				}
			}
			ratiosInPhases(recvs, a, (k+1)*w, ps, al, out)
		}
	}
}

// ratiosInPhases: recvs are the receive times of one candidate set whose
// earliest send is at least anchor, every subset of which cut at limit is
// valid. For each phase, the set's members with recv < min(limit, phase
// end) (and, where the allowance changes below that, < that change) form
// the largest subsets ending no later than the phase; each counts for the
// phase if its latest recv lies in it, as its size over its allowance's
// limit.
func ratiosInPhases(recvs []int64, anchor, limit int64, ps []phaseSpan, al allowance, out []float64) {
	slices.Sort(recvs)
	for pi, p := range ps {
		cut := min(limit, p.end)
		try := func(c int64) {
			n, _ := slices.BinarySearch(recvs, c) // members with recv < c
			if n == 0 || recvs[n-1] < p.start {
				return
			}
			v := float64(n) / al.of(anchor, recvs[n-1]).limit
			if math.IsNaN(out[pi]) || v > out[pi] {
				out[pi] = v
			}
		}
		try(cut)
		for _, c := range al.cuts() {
			if c < cut {
				try(c)
			}
		}
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
