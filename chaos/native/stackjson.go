package native

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Info is <run>/stack.json: where the running stack's services listen and
// their pids, what the chaos suite (chaos/stack.ReadInfo), the scripts
// (scripts/lib/stack-json.sh) and people read. The first keys are the
// contract's (CONTRACT.md, ".run/stack.json").
type Info struct {
	NginxURL  string `json:"nginx_url"`
	RedisAddr string `json:"redis_addr"`
	RedisPID  int    `json:"redis_pid"` // 0: not running
	ProxyAPI  string `json:"proxy_api"`
	// UpstreamURL is the static site through nginx (auth_request), RLSAddr
	// nginx's balanced gRPC (Envoy's rate limit service).
	UpstreamURL string `json:"upstream_url"`
	RLSAddr     string `json:"rls_addr"`
	// PrometheusURL is not in the contract's keys: "" when the stack runs
	// no prometheus.
	PrometheusURL string `json:"prometheus_url"`
	Apps          []App  `json:"apps"`
	Topology      string `json:"topology"`
	// RedisNodes are every data node, "redis" (RedisAddr) first.
	RedisNodes []Node `json:"redis_nodes"`
	// Sentinels, MasterName and ReplicationProxy: the sentinel topology's
	// only.
	Sentinels        []Node `json:"sentinels,omitempty"`
	MasterName       string `json:"master_name,omitempty"`
	ReplicationProxy string `json:"replication_proxy,omitempty"`
}

// App is one rate-limiter instance. In the cluster topology the apps have
// no proxy: RedisVia and Proxy are "".
type App struct {
	Name     string `json:"name"`
	URL      string `json:"url"`
	AdminURL string `json:"admin_url"`
	PID      int    `json:"pid"` // 0: not running
	// RedisVia is the address of the fault-injection proxy through which
	// the app reaches Redis (unless LOCAL_REDIS_DIRECT), Proxy its name.
	RedisVia string `json:"redis_via"`
	Proxy    string `json:"proxy"`
}

// Node is a Redis process: a data node or a Sentinel.
type Node struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
	PID  int    `json:"pid"` // 0: not running
}

// info describes the stack as it runs now (the pids of its pid files).
func (s Settings) info() Info {
	pid := func(name string) int { return ServicePID(s.RunDir, name) }
	nodes := func(names []string) []Node {
		out := []Node{}
		for _, n := range names {
			out = append(out, Node{Name: n, Addr: s.addr(n), PID: pid(n)})
		}
		return out
	}
	info := Info{
		NginxURL:    s.url(s.NginxPort),
		RedisAddr:   s.hostPort(s.RedisPort),
		RedisPID:    pid("redis"),
		ProxyAPI:    s.url(s.ProxyAPIPort),
		UpstreamURL: s.url(s.NginxPort) + "/static/",
		RLSAddr:     s.hostPort(s.RLSPort),
		Topology:    string(s.Topology),
		RedisNodes:  nodes(s.RedisNodes()),
	}
	if s.Prometheus {
		info.PrometheusURL = s.url(s.PrometheusPort)
	}
	for _, a := range Apps {
		app := App{Name: a, URL: s.url(s.appPort(a)), AdminURL: s.AdminURL(a), PID: pid(a),
			RedisVia: s.hostPort(s.viaPort(a)), Proxy: a + "-redis"}
		if s.Topology == Cluster {
			app.RedisVia, app.Proxy = "", ""
		}
		info.Apps = append(info.Apps, app)
	}
	if s.Topology == Sentinel {
		info.Sentinels = nodes(s.Sentinels())
		info.MasterName = MasterName
		info.ReplicationProxy = ReplicationProxy
	}
	return info
}

// writeStackJSON writes <run>/stack.json.
func (s Settings) writeStackJSON() error {
	b, err := json.MarshalIndent(s.info(), "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(s.RunDir, stackJSON), append(b, '\n'), 0o644)
}

// readInfo reads the stack.json of the stack in runDir.
func readInfo(runDir string) (Info, error) {
	b, err := os.ReadFile(filepath.Join(runDir, stackJSON))
	if err != nil {
		return Info{}, err
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("%s: %w", filepath.Join(runDir, stackJSON), err)
	}
	return info, nil
}
