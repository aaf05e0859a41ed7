package suite

// The doors for other languages in the suite's load: the stacks protect a
// static site with nginx auth_request (stack.Info.UpstreamURL) and balance
// Envoy's rate limit service (stack.Info.RLSAddr); each is one more route of
// the load, learned, loaded and judged as the service's own routes are.

import (
	"fmt"
	"maps"
	"net/url"
	"slices"

	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// RLSRoute is the gRPC door's route: the descriptor of chaos/rls, whose
// policy (chaos.gcra) names its algorithm.
const RLSRoute = loadtest.RLSPrefix + "chaos/gcra"

// DoorRoutes returns the routes through the doors that the stack offers:
// the path of its upstream URL when nginx serves it (the auth_request
// door), and RLSRoute when it has a rate limit service.
func DoorRoutes(info stack.Info) ([]string, error) {
	var routes []string
	if info.UpstreamURL != "" {
		u, err := url.Parse(info.UpstreamURL)
		if err != nil {
			return nil, fmt.Errorf("upstream_url: %w", err)
		}
		base, err := url.Parse(info.NginxURL)
		if err != nil || u.Scheme != base.Scheme || u.Host != base.Host || u.Path == "" {
			return nil, fmt.Errorf("upstream_url %s: not a path of nginx_url %s", info.UpstreamURL, info.NginxURL)
		}
		routes = append(routes, u.Path)
	}
	if info.RLSAddr != "" {
		routes = append(routes, RLSRoute)
	}
	return routes, nil
}

// DoorMix is the load on each door route: 2 polite keys at 40% of the
// quota and 2 abusive keys at 2x (48 requests/s, against the contract's
// 196 on each of the four routes). Every class the invariants judge is
// there; the 10x key is not, so that the stack's CPU stays with the load
// the contract sizes (its latency bounds are for that load).
var DoorMix = []loadtest.KeySpec{
	{Class: loadtest.Polite, Factor: 0.4, Count: 2},
	{Class: loadtest.Abusive, Factor: 2, Count: 2},
}

// withDoors returns cfg with the stack's door routes added to its routes,
// each with cfg.DoorMix, and the client of its rate limit service (nil:
// none; the caller closes it).
func withDoors(cfg Config, info stack.Info) (Config, *loadtest.RLSClient, error) {
	doors, err := DoorRoutes(info)
	if err != nil || len(doors) == 0 {
		return cfg, nil, err
	}
	cfg.Routes = append(slices.Clone(cfg.Routes), doors...)
	cfg.routeMix = maps.Clone(cfg.routeMix)
	if cfg.routeMix == nil {
		cfg.routeMix = make(map[string][]loadtest.KeySpec, len(doors))
	}
	for _, r := range doors {
		cfg.routeMix[r] = cfg.DoorMix
	}
	if info.RLSAddr == "" {
		return cfg, nil, nil
	}
	rls, err := loadtest.DialRLS(info.RLSAddr)
	if err != nil {
		return cfg, nil, err
	}
	cfg.rls = rls
	return cfg, rls, nil
}
