package native

import (
	"slices"
	"sort"
	"strings"
	"testing"
)

func topologySettings(t *testing.T, topology string, kv ...string) Settings {
	t.Helper()
	s, err := load(testLoader(fakeRoot(t), false), env(append(kv, "LOCAL_TOPOLOGY="+topology)...))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// portsOf is every listener's port of service, in order.
func portsOf(s Settings, service string) []int {
	var out []int
	for _, l := range s.listeners(service) {
		out = append(out, l.port)
	}
	return out
}

// TestLayout: each topology's services, in start order, and their ports
// with the default settings (the ports docs/SCALING.md and the package doc
// name).
func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		topology string
		services string
		ports    map[string][]int
		proxies  []string
	}{
		{"single", "redis toxiproxy app1 app2 app3 app4 static nginx",
			map[string][]int{"redis": {6390}, "toxiproxy": {8474, 16391, 16392, 16393, 16394},
				"app1": {8081, 9081, 7081}, "app4": {8084, 9084, 7084}, "static": {8070}, "nginx": {8080, 8090}},
			[]string{"app1-redis 127.0.0.1:16391 -> 127.0.0.1:6390", "app4-redis 127.0.0.1:16394 -> 127.0.0.1:6390"}},
		{"sentinel", "redis redis2 sentinel1 sentinel2 sentinel3 toxiproxy app1 app2 app3 app4 static nginx",
			map[string][]int{"redis": {6390}, "redis2": {6391}, "sentinel1": {26390}, "sentinel3": {26392},
				"toxiproxy": {8474, 16391, 16392, 16393, 16394, 16399}},
			[]string{"app1-redis 127.0.0.1:16391 -> 127.0.0.1:6390", "replication 127.0.0.1:16399 -> 127.0.0.1:6390"}},
		// The cluster's toxiproxy has no proxies: their ports would be the
		// bus ports of redis2-redis5.
		{"cluster", "redis redis2 redis3 redis4 redis5 redis6 toxiproxy app1 app2 app3 app4 static nginx",
			map[string][]int{"redis": {6390, 16390}, "redis2": {6391, 16391}, "redis6": {6395, 16395}, "toxiproxy": {8474}},
			nil},
	} {
		t.Run(tc.topology, func(t *testing.T) {
			s := topologySettings(t, tc.topology)
			if got := strings.Join(s.Services(), " "); got != tc.services {
				t.Errorf("services %q, want %q", got, tc.services)
			}
			for svc, want := range tc.ports {
				if got := portsOf(s, svc); !slices.Equal(got, want) {
					t.Errorf("%s: ports %v, want %v", svc, got, want)
				}
			}
			var proxies []string
			for _, p := range s.proxies() {
				proxies = append(proxies, p.Name+" "+p.Listen+" -> "+p.Upstream)
			}
			for _, want := range tc.proxies {
				if !slices.Contains(proxies, want) {
					t.Errorf("proxies %v, want %q among them", proxies, want)
				}
			}
			if tc.proxies == nil && len(proxies) > 0 {
				t.Errorf("proxies %v, want none", proxies)
			}
			if dup := s.duplicatePorts(); dup != nil {
				t.Errorf("the defaults share ports: %v", dup)
			}
			// Every port once: the defaults keep the services apart.
			var all []int
			for _, l := range s.listeners() {
				all = append(all, l.port)
			}
			sort.Ints(all)
			if len(slices.Compact(slices.Clone(all))) != len(all) {
				t.Errorf("ports %v repeat", all)
			}
		})
	}
	s := topologySettings(t, "single", "LOCAL_PROMETHEUS=1")
	if got := s.Services(); got[len(got)-1] != "prometheus" || !slices.Equal(portsOf(s, "prometheus"), []int{9089}) {
		t.Errorf("with prometheus: %v, its ports %v", got, portsOf(s, "prometheus"))
	}
}

func TestDuplicatePorts(t *testing.T) {
	s := topologySettings(t, "single", "LOCAL_STATIC_PORT=8082", "LOCAL_RLS_PORT=8474")
	got := strings.Join(s.duplicatePorts(), "; ")
	if want := "8082 (app2, static); 8474 (toxiproxy, nginx)"; got != want {
		t.Errorf("duplicatePorts: %q, want %q", got, want)
	}
}

func TestAddresses(t *testing.T) {
	s := topologySettings(t, "sentinel", "LOCAL_HOST=10.1.2.3", "LOCAL_REDIS_PORT=7000", "LOCAL_SENTINEL_PORT_BASE=27000")
	if got := s.addrs(s.Sentinels()); got != "10.1.2.3:27000,10.1.2.3:27001,10.1.2.3:27002" {
		t.Errorf("sentinel addrs %q", got)
	}
	if got := s.addrs(s.RedisNodes()); got != "10.1.2.3:7000,10.1.2.3:7001" {
		t.Errorf("node addrs %q", got)
	}
	if got := s.AdminURL("app3"); got != "http://10.1.2.3:9083" {
		t.Errorf("AdminURL(app3) = %q", got)
	}
}
