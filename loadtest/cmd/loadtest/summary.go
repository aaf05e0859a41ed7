package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/loadtest"
)

// maxRefusers bounds the policy names a tally keeps (the names come from
// the service's answers); more are counted as "other".
const maxRefusers = 32

// tally counts the answers of one route and class.
type tally struct {
	route              string
	class              loadtest.Class
	sent, ok, limited  int64
	errors             int64
	refusedBy          map[string]int64 // 429s by the policy that refused
	refusedUnannounced int64            // 429s that named no policy
}

// summary is what the command prints at the end of a run.
type summary struct {
	tallies map[string]*tally // by "route class"
}

func newSummary() *summary { return &summary{tallies: map[string]*tally{}} }

// add counts one record (called from one goroutine at a time).
func (s *summary) add(r loadtest.Record) {
	k := r.Route + " " + string(r.Class)
	t := s.tallies[k]
	if t == nil {
		t = &tally{route: r.Route, class: r.Class, refusedBy: map[string]int64{}}
		s.tallies[k] = t
	}
	t.sent++
	switch {
	case r.Admitted():
		t.ok++
	case r.Limited():
		t.limited++
		switch name := r.RefusedBy; {
		case name == "":
			t.refusedUnannounced++
		case t.refusedBy[name] > 0 || len(t.refusedBy) < maxRefusers:
			t.refusedBy[name]++
		default:
			t.refusedBy["other"]++
		}
	case r.Failed():
		t.errors++
	}
}

// write prints the run, each route's policy, and per route and class the
// answers and the policies that refused; then a warning when polite keys
// were refused by a policy other than their route's own, a ceiling they
// share with every key (in the demo stacks, the per-address one).
func (s *summary) write(w io.Writer, res loadtest.Result) {
	fmt.Fprintf(w, "run %s: %d requests in %v\n", res.RunID, res.Sent, res.End.Sub(res.Start).Round(time.Millisecond))
	routes := make([]string, 0, len(res.Policies))
	for r := range res.Policies {
		routes = append(routes, r)
	}
	sort.Strings(routes)
	for _, r := range routes {
		p := res.Policies[r]
		fmt.Fprintf(w, "  %-30s policy %q q=%d w=%v\n", r, p.Name, p.Quota, p.Window)
	}
	keys := make([]string, 0, len(s.tallies))
	for k := range s.tallies {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	shared := map[string]int64{} // polite 429s by a policy not the route's own
	var polite int64
	for _, k := range keys {
		t := s.tallies[k]
		fmt.Fprintf(w, "  %-38s sent %6d  2xx %6d  429 %6d  errors %d%s\n", k, t.sent, t.ok, t.limited, t.errors, t.refusers())
		if t.class != loadtest.Polite {
			continue
		}
		polite += t.sent
		for name, n := range t.refusedBy {
			if name != res.Policies[t.route].Name {
				shared[name] += n
			}
		}
	}
	if len(shared) == 0 {
		return
	}
	names := make([]string, 0, len(shared))
	var refused int64
	for name, n := range shared {
		names = append(names, fmt.Sprintf("%q (%d)", name, n))
		refused += n
	}
	slices.Sort(names)
	fmt.Fprintf(w, "warning: %d of %d polite requests were refused by %s, not by their route's own policy:\n"+
		"  a ceiling every key of one client address shares (in the demo stacks, \"per-address\": 1000 requests\n"+
		"  per 10 s).\n", refused, polite, strings.Join(names, ", "))
	if res.Sources > 1 {
		fmt.Fprintf(w, "  The keys were sent from %d loopback addresses, but the service saw fewer: a container engine's\n"+
			"  port proxy (docker-proxy, behind make up's published ports) replaces the client's address with\n"+
			"  its own. The native stack (make local-up) sees each one; or load a stack on chaos/policies.json\n"+
			"  (loadtest/README.md, \"The per-address ceiling\").\n", res.Sources)
		return
	}
	fmt.Fprintf(w, "  This load comes from one address, so the ceiling refuses it, as it should. To load the stack\n"+
		"  without it: -sources -1 against a loopback IPv4 target (an address per key), or a stack on\n"+
		"  chaos/policies.json (loadtest/README.md, \"The per-address ceiling\").\n")
}

// refusers is ", 429 by: a 3, b 5" (sorted by name), or "".
func (t *tally) refusers() string {
	if t.limited == 0 {
		return ""
	}
	names := make([]string, 0, len(t.refusedBy))
	for name := range t.refusedBy {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names)+1)
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %d", name, t.refusedBy[name]))
	}
	if t.refusedUnannounced > 0 {
		parts = append(parts, fmt.Sprintf("unnamed %d", t.refusedUnannounced))
	}
	return "  (429 by " + strings.Join(parts, ", ") + ")"
}
