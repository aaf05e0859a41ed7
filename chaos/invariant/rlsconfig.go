package invariant

import (
	"cmp"
	"fmt"
	"slices"
)

// RLSConfigCheck is one instance's figures of rls_config_reloaded: a change
// of its rate limit service configuration during the run (EventRLSReload).
type RLSConfigCheck struct {
	Instance string `json:"instance"`
	// Before is its version before the load (EventRLSConfig; "": not
	// recorded), Changed the one it reported once the change reached it,
	// Final the one of its /status after settle.
	Before  string `json:"before,omitempty"`
	Changed string `json:"changed,omitempty"`
	Final   string `json:"final,omitempty"`
	// ReloadError is its /status rls_config_reload_error after settle.
	ReloadError string `json:"reload_error,omitempty"`
	// TSendMS and TRecvMS bracket its change.
	TSendMS float64 `json:"t_send_ms,omitempty"`
	TRecvMS float64 `json:"t_recv_ms,omitempty"`
	// DoorRequests counts the door route's requests (judged: not aborted)
	// it answered that were sent after its change was answered: decided by
	// the new configuration, and in the log the door's rows judge.
	// DoorWhileMixed counts those it answered between the first change's
	// send and the last change's answer, while the instances disagreed.
	DoorRequests   int `json:"door_requests"`
	DoorWhileMixed int `json:"door_while_mixed"`
	// Problem says why the instance fails the row ("": it passes).
	Problem string `json:"problem,omitempty"`
}

// RLSConfigChecks computes rls_config_reloaded's figures, one per instance
// (those changed and those reporting a /status after settle), in instance
// order; nil when the run changed no rate limit service configuration.
// An instance passes when it was changed, every change reported the same
// version and it differs from the instance's version before the load, its
// /status after settle reports that version and no reload error, and, when
// the door route is judged (it has a policy), it answered door requests
// after its change.
func RLSConfigChecks(reqs []Request, policies map[string]Policy, events []Event, statuses []InstanceStatus) []RLSConfigCheck {
	changes := map[string]Event{}
	before := map[string]string{}
	var route, want string
	var firstUS, lastUS int64
	for _, e := range events {
		switch e.Event {
		case EventRLSConfig:
			before[e.Instance] = e.Version
		case EventRLSReload:
			changes[e.Instance] = e // the last one counts
			if want == "" {
				want, route = e.Version, e.Route
				firstUS = msToUS(e.TSendMS)
			}
			firstUS, lastUS = min(firstUS, msToUS(e.TSendMS)), max(lastUS, msToUS(e.TRecvMS))
		}
	}
	if len(changes) == 0 {
		return nil
	}
	checks := map[string]*RLSConfigCheck{}
	get := func(instance string) *RLSConfigCheck {
		c := checks[instance]
		if c == nil {
			c = &RLSConfigCheck{Instance: instance, Before: before[instance]}
			checks[instance] = c
		}
		return c
	}
	for instance, e := range changes {
		c := get(instance)
		c.Changed, c.TSendMS, c.TRecvMS = e.Version, e.TSendMS, e.TRecvMS
	}
	finals := map[string]InstanceStatus{}
	for _, st := range statuses {
		if st.Final {
			finals[st.Instance] = st
			get(st.Instance)
		}
	}
	for _, r := range judgedRequests(reqs) {
		if r.Route != route || r.Instance == "" {
			continue
		}
		c := get(r.Instance)
		if e, ok := changes[r.Instance]; ok && sendUS(r) > msToUS(e.TRecvMS) {
			c.DoorRequests++
		}
		if sendUS(r) >= firstUS && recvUS(r) <= lastUS {
			c.DoorWhileMixed++
		}
	}
	_, judged := policies[route]
	out := make([]RLSConfigCheck, 0, len(checks))
	for _, c := range checks {
		st, final := finals[c.Instance]
		if final && st.Err == "" {
			c.Final, _ = stringField(st.Body, "rls_config_version")
			c.ReloadError, _ = stringField(st.Body, "rls_config_reload_error")
		}
		_, changed := changes[c.Instance]
		switch {
		case !changed:
			c.Problem = "its configuration was not changed"
		case c.Changed == "":
			c.Problem = "the change reported no version"
		case c.Changed != want:
			c.Problem = fmt.Sprintf("the change reported version %s, the first instance's %s", c.Changed, want)
		case c.Changed == c.Before:
			c.Problem = "the change left version " + c.Before + " in force"
		case !final:
			c.Problem = "no /status after settle"
		case st.Err != "":
			c.Problem = "no /status after settle: " + st.Err
		case c.Final != c.Changed:
			c.Problem = fmt.Sprintf("version %q in force after settle, not %s", c.Final, c.Changed)
		case c.ReloadError != "":
			c.Problem = "reload error: " + c.ReloadError
		case judged && c.DoorRequests == 0:
			c.Problem = "no door request answered after its change"
		}
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b RLSConfigCheck) int { return cmp.Compare(a.Instance, b.Instance) })
	return out
}

// RLSConfigRow judges rls_config_reloaded (RLSConfigChecks) as one row on
// the door route, in settle (read from the /status after it): the number of
// instances that fail it, bound 0, or the first one's problem. None when the
// run changed no rate limit service configuration.
func RLSConfigRow(reqs []Request, policies map[string]Policy, events []Event, statuses []InstanceStatus) []Row {
	checks := RLSConfigChecks(reqs, policies, events, statuses)
	if checks == nil {
		return nil
	}
	route := AllRoutes
	for _, e := range events {
		if e.Event == EventRLSReload && e.Route != "" {
			route = e.Route
			break
		}
	}
	row := Row{Name: RLSConfig, Route: route, Phase: Settle, Bound: 0, Measured: 0, Pass: true}
	for _, c := range checks {
		if c.Problem != "" {
			row.Measured, row.Pass = c.Instance+": "+c.Problem, false
			break
		}
	}
	return []Row{row}
}

// stringField finds the string name in a JSON document, breadth first.
func stringField(doc map[string]any, name string) (string, bool) {
	v, ok := lookup(doc, name, func(v any) bool { _, ok := v.(string); return ok })
	if !ok {
		return "", false
	}
	s, _ := v.(string)
	return s, true
}
