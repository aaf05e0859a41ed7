package service

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetlimit/fleetlimit/app/internal/topk"
	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// The size of GET /admin/top's tracker (metrics.top): topEntries
// identities per policy and half-window, looking back topWindow at most.
// Memory: at most 2·topEntries entries per policy, whatever the clients.
const (
	topEntries = topk.DefaultK
	topWindow  = topk.DefaultWindow
)

// topResponse is the body of GET /admin/top.
type topResponse struct {
	Instance string `json:"instance"`
	// WindowSeconds is the longest time looked back; Since is where the
	// window starts now: the start of the previous half-window period
	// (aligned to the Unix epoch), so the refusals of the last 30 to 60 s.
	WindowSeconds int         `json:"window_seconds"`
	Since         time.Time   `json:"since"`
	Policies      []topPolicy `json:"policies"`
}

type topPolicy struct {
	Policy string `json:"policy"`
	// Shadow: the policy in force under this name is a dry run; its
	// refusals were reported, not enforced.
	Shadow bool       `json:"shadow,omitempty"`
	Top    []topEntry `json:"top"`
}

// topRow is one identity of one policy on one instance: the body of GET
// /admin/top?format=rows is a flat array of them, for tools that read a
// table (a Grafana table through a JSON data source: grafana/fleetlimit.json).
type topRow struct {
	Instance string `json:"instance"`
	Policy   string `json:"policy"`
	Shadow   bool   `json:"shadow"`
	Identity string `json:"identity"`
	Refused  uint64 `json:"refused"`
	Error    uint64 `json:"error"`
}

// topEntry is one identity: refused is an upper bound of its refusals in
// the window, refused - error a lower bound (Space-Saving; error is 0 while
// a policy refused at most topEntries distinct identities per period).
type topEntry struct {
	Identity string `json:"identity"`
	Refused  uint64 `json:"refused"`
	Error    uint64 `json:"error"`
}

// top serves GET /admin/top: per policy, the identities this instance
// refused most over the last minute, most refused first. Every refusal a
// limiter decided counts once (whatever its cost), through any door (HTTP,
// /check, Envoy's rate limit service), fail-closed refusals included, a
// shadow policy's too (marked "shadow" when the policy in force under that
// name is one; an RLS shadow descriptor's refusals are not told apart); a
// read-only request (a read, an Envoy hits_addend of 0) counts nothing.
// Query: policy=<name> (repeatable) lists those policies only, each even
// without refusals; n=<1..topEntries> (default topEntries) the identities
// per policy; format=rows answers a flat array of topRow instead. Anything
// else is a 400 problem.
func (s *Server) top(w http.ResponseWriter, r *http.Request) {
	tr := s.metrics.top
	q := r.URL.Query()
	n := tr.K()
	var names []string
	rows := false
	for key, values := range q {
		switch key {
		case "format":
			if f := values[len(values)-1]; f != "rows" {
				badAdminRequest(w, r, fmt.Sprintf("format must be rows (or absent), got %q", f))
				return
			}
			rows = true
		case "n":
			v, err := strconv.Atoi(values[len(values)-1])
			if err != nil || v < 1 || v > tr.K() {
				badAdminRequest(w, r, fmt.Sprintf("n must be a whole number from 1 to %d, got %q", tr.K(), values[len(values)-1]))
				return
			}
			n = v
		case "policy":
			for _, name := range values {
				if err := ratelimit.ValidateName(name); err != nil {
					badAdminRequest(w, r, fmt.Sprintf("policy %q: %v", name, err))
					return
				}
				names = append(names, name)
			}
		default:
			badAdminRequest(w, r, fmt.Sprintf("unknown parameter %q: want policy=<name>, n=<1..%d> or format=rows", key, tr.K()))
			return
		}
	}
	now := time.Now()
	if names == nil {
		names = tr.Policies(now)
	}
	set := s.Policies()
	out := topResponse{Instance: s.cfg.Instance, WindowSeconds: int(tr.Window() / time.Second),
		Since: tr.Since(now).UTC(), Policies: make([]topPolicy, 0, len(names))}
	for _, name := range names {
		p := topPolicy{Policy: name, Top: []topEntry{}}
		if in, ok := set.Policy(name); ok {
			p.Shadow = in.Shadow
		}
		for _, e := range tr.Top(now, name, n) {
			p.Top = append(p.Top, topEntry{Identity: e.Identity, Refused: e.Refused, Error: e.Error})
		}
		out.Policies = append(out.Policies, p)
	}
	if rows {
		flat := []topRow{}
		for _, p := range out.Policies {
			for _, e := range p.Top {
				flat = append(flat, topRow{Instance: out.Instance, Policy: p.Policy, Shadow: p.Shadow, Identity: e.Identity, Refused: e.Refused, Error: e.Error})
			}
		}
		writeJSON(w, http.StatusOK, flat)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
