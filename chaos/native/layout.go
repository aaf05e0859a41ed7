package native

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// The stack's names: services, the Sentinels' master, the proxy the
// replica can be pointed at.
var (
	// Apps are the rate-limiter instances.
	Apps = []string{"app1", "app2", "app3", "app4"}
	// allRedisNodes and allSentinels are every data node and Sentinel any
	// topology has (Down stops whichever of them left a pid file).
	allRedisNodes = []string{"redis", "redis2", "redis3", "redis4", "redis5", "redis6"}
	allSentinels  = []string{"sentinel1", "sentinel2", "sentinel3"}
)

const (
	// MasterName is the name the Sentinels monitor the master under.
	MasterName = "fleet"
	// ReplicationProxy is the toxiproxy proxy the replica can be pointed
	// at (sentinel topology).
	ReplicationProxy = "replication"
)

// RedisNodes returns the topology's data nodes, the first master first.
func (s Settings) RedisNodes() []string {
	switch s.Topology {
	case Sentinel:
		return slices.Clone(allRedisNodes[:2])
	case Cluster:
		return slices.Clone(allRedisNodes)
	}
	return []string{"redis"}
}

// Sentinels returns the topology's Sentinels (none but in the sentinel
// topology).
func (s Settings) Sentinels() []string {
	if s.Topology == Sentinel {
		return slices.Clone(allSentinels)
	}
	return nil
}

// Services returns every service of the stack, in start order.
func (s Settings) Services() []string {
	out := append(s.RedisNodes(), s.Sentinels()...)
	out = append(out, "toxiproxy")
	out = append(out, Apps...)
	out = append(out, "static", "nginx")
	if s.Prometheus {
		out = append(out, "prometheus")
	}
	return out
}

// index returns N of appN, redisN or sentinelN; 1 for redis.
func index(name string) int {
	for _, p := range []string{"app", "redis", "sentinel"} {
		if rest, ok := strings.CutPrefix(name, p); ok {
			if rest == "" {
				return 1
			}
			n, _ := strconv.Atoi(rest)
			return n
		}
	}
	return 0
}

// appPort, adminPort, grpcPort and viaPort are an app's public port, admin
// port, rate limit service port and its fault proxy's port.
func (s Settings) appPort(app string) int   { return s.AppPortBase + index(app) }
func (s Settings) adminPort(app string) int { return s.AdminPortBase + index(app) }
func (s Settings) grpcPort(app string) int  { return s.GRPCPortBase + index(app) }
func (s Settings) viaPort(app string) int   { return s.ViaPortBase + index(app) }

// AdminURL is an app's admin base URL.
func (s Settings) AdminURL(app string) string { return s.url(s.adminPort(app)) }

func (s Settings) url(port int) string { return "http://" + s.hostPort(port) }

func (s Settings) hostPort(port int) string { return net.JoinHostPort(s.Host, strconv.Itoa(port)) }

// redisPort is a data node's port, sentinelPort a Sentinel's.
func (s Settings) redisPort(node string) int    { return s.RedisPort + index(node) - 1 }
func (s Settings) sentinelPort(name string) int { return s.SentinelPortBase + index(name) - 1 }

// replicationPort is the listen port of the proxy replication.
func (s Settings) replicationPort() int { return s.ViaPortBase + 9 }

// addr is a data node's or a Sentinel's host:port.
func (s Settings) addr(name string) string {
	if strings.HasPrefix(name, "sentinel") {
		return s.hostPort(s.sentinelPort(name))
	}
	return s.hostPort(s.redisPort(name))
}

// addrs are the host:ports of names, comma separated.
func (s Settings) addrs(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = s.addr(n)
	}
	return strings.Join(out, ",")
}

// proxy is a toxiproxy proxy of the stack.
type proxy struct {
	Name     string `json:"name"`
	Listen   string `json:"listen"`
	Upstream string `json:"upstream"`
	Enabled  bool   `json:"enabled"`
}

// proxies are the topology's toxiproxy proxies: appN-redis, and in the
// sentinel topology replication. The cluster's toxiproxy has none: their
// ports would be the bus ports of redis2-redis5.
func (s Settings) proxies() []proxy {
	if s.Topology == Cluster {
		return nil
	}
	var out []proxy
	for _, a := range Apps {
		out = append(out, proxy{a + "-redis", s.hostPort(s.viaPort(a)), s.hostPort(s.RedisPort), true})
	}
	if s.Topology == Sentinel {
		out = append(out, proxy{ReplicationProxy, s.hostPort(s.replicationPort()), s.hostPort(s.RedisPort), true})
	}
	return out
}

// listener is one port the stack listens on, the service that does and
// the variable that sets it.
type listener struct {
	port     int
	service  string
	variable string
}

// listeners returns every port of service (all of them without one).
func (s Settings) listeners(service ...string) []listener {
	var out []listener
	add := func(svc, variable string, ports ...int) {
		for _, p := range ports {
			out = append(out, listener{p, svc, variable})
		}
	}
	names := service
	if len(names) == 0 {
		names = s.Services()
	}
	for _, svc := range names {
		switch {
		case strings.HasPrefix(svc, "redis"):
			p := s.redisPort(svc)
			add(svc, "LOCAL_REDIS_PORT", p)
			if s.Topology == Cluster {
				add(svc, "LOCAL_REDIS_PORT", p+10000) // the cluster bus
			}
		case strings.HasPrefix(svc, "sentinel"):
			add(svc, "LOCAL_SENTINEL_PORT_BASE", s.sentinelPort(svc))
		case svc == "toxiproxy":
			add(svc, "LOCAL_PROXY_API_PORT", s.ProxyAPIPort)
			for _, p := range s.proxies() {
				_, port, _ := net.SplitHostPort(p.Listen)
				n, _ := strconv.Atoi(port)
				add(svc, "LOCAL_VIA_PORT_BASE", n)
			}
		case svc == "nginx":
			add(svc, "LOCAL_NGINX_PORT", s.NginxPort)
			add(svc, "LOCAL_RLS_PORT", s.RLSPort)
		case svc == "static":
			add(svc, "LOCAL_STATIC_PORT", s.StaticPort)
		case strings.HasPrefix(svc, "app"):
			add(svc, "LOCAL_APP_PORT_BASE", s.appPort(svc))
			add(svc, "LOCAL_ADMIN_PORT_BASE", s.adminPort(svc))
			add(svc, "LOCAL_GRPC_PORT_BASE", s.grpcPort(svc))
		case svc == "prometheus":
			add(svc, "LOCAL_PROMETHEUS_PORT", s.PrometheusPort)
		}
	}
	return out
}

// duplicatePorts describes each port that two listeners share, e.g.
// "8081 (app1, nginx)"; nil when there is none.
func (s Settings) duplicatePorts() []string {
	by := map[int][]string{}
	var order []int
	for _, l := range s.listeners() {
		if len(by[l.port]) == 0 {
			order = append(order, l.port)
		}
		by[l.port] = append(by[l.port], l.service)
	}
	slices.Sort(order)
	var out []string
	for _, p := range order {
		if len(by[p]) > 1 {
			out = append(out, fmt.Sprintf("%d (%s)", p, strings.Join(by[p], ", ")))
		}
	}
	return out
}
