package invariant

import (
	"strings"
	"testing"
)

// TestRLSConfigChecks: a change of the rate limit service's configuration
// passes when it reached every instance with one new version, each runs
// it after settle without a reload error, and the judged door's requests
// after each change are in the log; each way to miss that fails the row
// with the instance's problem.
func TestRLSConfigChecks(t *testing.T) {
	const door = "rls:chaos/gcra"
	status := func(app, version, rerr string) InstanceStatus {
		return InstanceStatus{Instance: app, Final: true,
			Body: map[string]any{"rls_config_version": version, "rls_config_reload_error": rerr}}
	}
	events := func(v2 string) []Event {
		return []Event{
			{Event: EventRLSConfig, Instance: "app1", Version: "v1"},
			{Event: EventRLSConfig, Instance: "app2", Version: "v1"},
			{Event: EventRLSReload, Instance: "app1", Route: door, Version: "v2", TSendMS: 1000, TRecvMS: 1100},
			{Event: EventRLSReload, Instance: "app2", Route: door, Version: v2, TSendMS: 2000, TRecvMS: 2100},
		}
	}
	reqs := []Request{
		{Route: door, Instance: "app1", TSendMS: 1500, TRecvMS: 1501, Status: 200},
		{Route: door, Instance: "app2", TSendMS: 1500, TRecvMS: 1501, Status: 200}, // while mixed, before its change
		{Route: door, Instance: "app2", TSendMS: 2500, TRecvMS: 2501, Status: 429},
		{Route: door, Instance: "app2", TSendMS: 2600, TRecvMS: 2601, Aborted: true}, // not judged
		{Route: "/api/gcra", Instance: "app1", TSendMS: 2500, TRecvMS: 2501, Status: 200},
	}
	judged := map[string]Policy{door: {Algorithm: "gcra", Limit: 100}}
	ok := []InstanceStatus{status("app1", "v2", ""), status("app2", "v2", "")}
	cases := []struct {
		name     string
		reqs     []Request
		policies map[string]Policy
		events   []Event
		statuses []InstanceStatus
		problem  string // "": passes; else the row's measured text
	}{
		{"every instance at the new version", reqs, judged, events("v2"), ok, ""},
		{"another version reported", reqs, judged, events("v3"), ok, "app2: the change reported version v3"},
		{"the version before", reqs, judged, events("v1"), ok, "app2: the change reported version v1"},
		{"an old version after settle", reqs, judged, events("v2"), []InstanceStatus{status("app1", "v2", ""), status("app2", "v1", "")},
			`app2: version "v1" in force after settle`},
		{"a reload error", reqs, judged, events("v2"), []InstanceStatus{status("app1", "v2", "bad yaml"), status("app2", "v2", "")},
			"app1: reload error: bad yaml"},
		{"an instance not changed", reqs, judged, events("v2"), append(ok, status("app3", "v1", "")),
			"app3: its configuration was not changed"},
		{"no door request after the change", reqs[:2], judged, events("v2"), ok,
			"app2: no door request answered after its change"},
		{"the door not judged", reqs[:2], nil, events("v2"), ok, ""},
		{"no status after settle", reqs, judged, events("v2"), ok[:1], "app2: no /status after settle"},
		{"no new version", reqs, judged, []Event{events("v1")[0], {Event: EventRLSReload, Instance: "app1", Route: door, Version: "v1"}},
			ok[:1], "app1: the change left version v1 in force"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows := RLSConfigRow(c.reqs, c.policies, c.events, c.statuses)
			if len(rows) != 1 {
				t.Fatalf("rows %+v", rows)
			}
			row := rows[0]
			if row.Name != RLSConfig || row.Route != door || row.Phase != Settle {
				t.Errorf("row %+v", row)
			}
			if c.problem == "" {
				if !row.Pass || row.Measured != 0 {
					t.Errorf("row %+v: want a pass", row)
				}
				return
			}
			m, _ := row.Measured.(string)
			if row.Pass || !strings.HasPrefix(m, c.problem) {
				t.Errorf("row %+v: want a failure %q", row, c.problem)
			}
		})
	}

	checks := RLSConfigChecks(reqs, judged, events("v2"), ok)
	want := []RLSConfigCheck{
		{Instance: "app1", Before: "v1", Changed: "v2", Final: "v2", TSendMS: 1000, TRecvMS: 1100, DoorRequests: 1, DoorWhileMixed: 1},
		{Instance: "app2", Before: "v1", Changed: "v2", Final: "v2", TSendMS: 2000, TRecvMS: 2100, DoorRequests: 1, DoorWhileMixed: 1},
	}
	if len(checks) != len(want) {
		t.Fatalf("checks %+v", checks)
	}
	for i := range want {
		if checks[i] != want[i] {
			t.Errorf("check %d: %+v, want %+v", i, checks[i], want[i])
		}
	}
	if RLSConfigRow(reqs, judged, nil, ok) != nil || RLSConfigChecks(reqs, judged, nil, ok) != nil {
		t.Error("a run without a change has no rls_config_reloaded")
	}
}
