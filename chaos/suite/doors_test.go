package suite

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
	"github.com/fleetlimit/fleetlimit/chaos/stack"
)

// TestDoorRoutes: the stack's doors become routes of the load: the path of
// the upstream URL through nginx, and the rate limit service's route.
func TestDoorRoutes(t *testing.T) {
	cases := []struct {
		info stack.Info
		want []string
		fail bool
	}{
		{stack.Info{NginxURL: "http://127.0.0.1:8080"}, nil, false},
		{stack.Info{NginxURL: "http://127.0.0.1:8080", UpstreamURL: "http://127.0.0.1:8080/static/", RLSAddr: "127.0.0.1:8090"},
			[]string{"/static/", RLSRoute}, false},
		{stack.Info{NginxURL: "http://127.0.0.1:8080", RLSAddr: "127.0.0.1:8090"}, []string{RLSRoute}, false},
		{stack.Info{NginxURL: "http://127.0.0.1:8080", UpstreamURL: "http://127.0.0.1:9999/static/"}, nil, true},
	}
	for _, c := range cases {
		got, err := DoorRoutes(c.info)
		if (err != nil) != c.fail || !slices.Equal(got, c.want) {
			t.Errorf("%+v: %v %v, want %v (error: %v)", c.info, got, err, c.want, c.fail)
		}
	}
}

// TestDoorPoliciesNameTheirAlgorithm: the doors' policies in the chaos
// stacks are named after their algorithms, as the invariants need.
func TestDoorPoliciesNameTheirAlgorithm(t *testing.T) {
	for _, c := range []struct{ route, policy, want string }{
		{"/static/", "static-sliding-window-counter", ideal.SlidingWindowCounter},
		{"/static/files/", "static-files-token-bucket", ideal.TokenBucket},
		{RLSRoute, "chaos.gcra", ideal.GCRA},
		{"/static/", "static", ""},
		{RLSRoute, "chaos.client", ""},
	} {
		if got := AlgorithmOf(c.route, c.policy); got != c.want {
			t.Errorf("AlgorithmOf(%s, %s) = %q, want %q", c.route, c.policy, got, c.want)
		}
	}
}

// TestRouteMixes: the lease route is loaded with LeaseMix and each door
// with DoorMix, with or without doors; the other routes take Mix.
func TestRouteMixes(t *testing.T) {
	for _, info := range []stack.Info{
		{NginxURL: "http://127.0.0.1:8080"},
		{NginxURL: "http://127.0.0.1:8080", UpstreamURL: "http://127.0.0.1:8080/static/"},
	} {
		cfg := Config{}
		cfg.setDefaults()
		cfg, _, err := withDoors(cfg, info)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(cfg.Routes, LeaseRoute) || !slices.Equal(cfg.routeMix[LeaseRoute], LeaseMix) {
			t.Errorf("%+v: routes %v, lease route's mix %v", info, cfg.Routes, cfg.routeMix[LeaseRoute])
		}
		if info.UpstreamURL != "" && !slices.Equal(cfg.routeMix["/static/"], DoorMix) {
			t.Errorf("%+v: the door's mix %v", info, cfg.routeMix["/static/"])
		}
		if _, ok := cfg.routeMix["/api/gcra"]; ok {
			t.Errorf("%+v: /api/gcra has a mix of its own", info)
		}
	}
}

// TestReloadRLSKeepsTheDoorsDescriptor: reload-under-load's RLS
// configuration is the stack's file as it is with a descriptor added after
// it, so the door's descriptor (its limit, its counts) stays and only the
// version changes.
func TestReloadRLSKeepsTheDoorsDescriptor(t *testing.T) {
	before, err := os.ReadFile(filepath.Join("..", "..", stack.RLSConfigDir, "chaos.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(filepath.Join("..", "..", ReloadRLS, "chaos.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(after, before) || !bytes.Contains(after[len(before):], []byte("\n  - key: ")) {
		t.Errorf("%s/chaos.yaml is not %s/chaos.yaml with a descriptor added", ReloadRLS, stack.RLSConfigDir)
	}
	entries, err := os.ReadDir(filepath.Join("..", "..", ReloadRLS))
	if err != nil || len(entries) != 1 {
		t.Errorf("%s: %d entries (%v), want chaos.yaml only", ReloadRLS, len(entries), err)
	}
}
