package invariant

// reset_held: from a reset on, a reset key is judged against a fresh quota.
// No usage from before the reset comes back (a journal replayed after it
// must not bring its grants back), and none made after it is lost.

import (
	"fmt"
	"math"
	"slices"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
)

// ResetCheck is what reset_held found for one reset key.
type ResetCheck struct {
	Key    string `json:"key"`
	Route  string `json:"route"`
	Policy string `json:"policy"`
	// Before and After are the key's requests admitted before the reset
	// and after it (up to the probe); Probe those the probe admitted, and
	// ProbeSent the probe's requests.
	Before    int `json:"before_admitted"`
	After     int `json:"after_admitted"`
	Probe     int `json:"probe_admitted"`
	ProbeSent int `json:"probe_sent"`
	// InStore is the usage the store held for the key when probed: the
	// limit minus what the probe admitted (at least that when it admitted
	// nothing).
	InStore int `json:"in_store"`
	// Measured is InStore - After: what came back from before the reset
	// (positive) or was lost after it (negative). A string says why the
	// key could not be measured exactly.
	Measured any    `json:"measured"`
	Phase    string `json:"phase,omitempty"`
}

// ResetChecks measures every reset key (an EventReset with a Key, probed by
// an EventResetProbe). The measure is exact on a sliding window log route,
// where the store's usage of a key is the number of its admissions in the
// last window:
//
//   - every request of the key is sequenced by the scenario: none overlaps
//     the reset's bracket (those before were answered before it was sent,
//     those after sent once it was answered), so each is certainly before
//     or after it;
//   - the probe, after the fault, sends the key's requests one at a time
//     through a healthy instance until it is refused: in a sliding window
//     log the store then admits exactly limit - usage of them, where usage
//     counts every admission of the last window that the store holds;
//   - every admission of the key, before and after the reset, was sent
//     less than a window before the probe's last answer: each one the
//     store holds still counts when the probe is decided.
//
// Then usage = limit - probe admitted, and a fleet that held the reset has
// usage = the admissions after it, exactly: Measured = usage - After, bound
// 0. A probe answered by anything but the store (mode redis), a request
// overlapping the reset, or an admission that could have aged out before
// the probe makes the measure uncertain, and the key's Measured says why.
func ResetChecks(reqs []Request, phases []Phase, policies map[string]Policy, events []Event) []ResetCheck {
	probes := map[string]Event{}
	for _, e := range events {
		if e.Event == EventResetProbe && e.Key != "" {
			probes[e.Key] = e
		}
	}
	byK := map[string][]Request{}
	for _, r := range reqs {
		byK[r.Key] = append(byK[r.Key], r)
	}
	ps := spans(phases)
	var out []ResetCheck
	seen := map[string]bool{}
	for _, e := range events {
		if e.Event != EventReset || e.Key == "" || seen[e.Key] {
			continue
		}
		seen[e.Key] = true
		c := ResetCheck{Key: e.Key, Route: e.Route, Policy: e.Policy}
		c.Measured = resetHeld(&c, e, probes, byK[e.Key], policies, ps)
		out = append(out, c)
	}
	return out
}

// resetHeld fills c for the reset e and returns its measure, or why there
// is none.
func resetHeld(c *ResetCheck, e Event, probes map[string]Event, reqs []Request, policies map[string]Policy, ps []phaseSpan) any {
	p, ok := policies[e.Route]
	switch {
	case !ok:
		return fmt.Sprintf("route %q has no policy", e.Route)
	case p.Algorithm != ideal.SlidingWindowLog:
		return fmt.Sprintf("not exact on %s: reset keys must be on a sliding window log route", p.Algorithm)
	}
	probe, ok := probes[e.Key]
	if !ok {
		return "no probe of the key after the fault"
	}
	rs, rr := msToUS(e.TSendMS), msToUS(e.TRecvMS)
	ps0, ps1 := msToUS(probe.TSendMS), msToUS(probe.TRecvMS)
	if k := phaseOf(ps, ps1); k >= 0 {
		c.Phase = ps[k].name
	}
	w := p.Window.Microseconds()
	refused := false
	earliest := int64(math.MaxInt64)
	for _, r := range reqs {
		s, v := sendUS(r), recvUS(r)
		inProbe := s >= ps0 && v <= ps1
		switch {
		case r.Aborted:
			return "a request of the key was aborted"
		case inProbe && r.Mode != "redis":
			return fmt.Sprintf("a probe request was answered %d in mode %q by %s, not by the store", r.Status, r.Mode, r.Instance)
		case inProbe && r.Admitted():
			c.ProbeSent++
			c.Probe++
		case inProbe && r.Limited():
			c.ProbeSent++
			refused = true
		case inProbe:
			return fmt.Sprintf("a probe request was answered %d", r.Status)
		case !r.Admitted():
		case v < rs:
			c.Before++
		case s > rr && v < ps0:
			c.After++
		case s > rr:
			return "an admitted request of the key overlaps the probe"
		default:
			return "an admitted request of the key overlaps the reset"
		}
		if r.Admitted() && !inProbe {
			earliest = min(earliest, s)
		}
	}
	switch {
	case c.ProbeSent == 0:
		return "the probe sent nothing"
	case !refused:
		return "the probe was never refused: it did not reach the limit"
	case earliest != math.MaxInt64 && earliest <= ps1-w:
		return fmt.Sprintf("an admission %.0f ms before the probe's end could have aged out of the window", float64(ps1-earliest)/1000)
	}
	c.InStore = int(p.Limit) - c.Probe
	return c.InStore - c.After
}

// ResetHeldRows are the reset_held rows: per route with reset keys, in the
// phase of its probes' last answer, the measure of largest magnitude over
// its keys (or the first reason one could not be measured). Bound 0: a
// fleet that holds a reset gets exactly 0.
func ResetHeldRows(reqs []Request, phases []Phase, policies map[string]Policy, events []Event) []Row {
	checks := ResetChecks(reqs, phases, policies, events)
	var rows []Row
	byRoute := map[string]*Row{}
	var routes []string
	for _, c := range checks {
		row := byRoute[c.Route]
		if row == nil {
			phase := c.Phase
			if phase == "" {
				phase = Recovery
			}
			row = &Row{Name: ResetHeld, Route: c.Route, Phase: phase, Bound: 0.0, Measured: 0.0, Pass: true}
			byRoute[c.Route] = row
			routes = append(routes, c.Route)
		}
		if !row.Pass && isText(row.Measured) {
			continue // the first reason stays
		}
		switch m := c.Measured.(type) {
		case int:
			cur, _ := row.Measured.(float64)
			if math.Abs(float64(m)) > math.Abs(cur) {
				row.Measured = float64(m)
			}
			row.Pass = row.Pass && m == 0
		default:
			row.Measured, row.Pass = fmt.Sprintf("%s: %v", c.Key, m), false
		}
	}
	slices.Sort(routes)
	for _, r := range routes {
		rows = append(rows, *byRoute[r])
	}
	return rows
}

func isText(v any) bool { _, ok := v.(string); return ok }
