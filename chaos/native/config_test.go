package native

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigs: the files the stack writes for redis-server and prometheus.
func TestConfigs(t *testing.T) {
	s := topologySettings(t, "sentinel", "REDIS_PASSWORD=pa\"ss\\")
	master := s.nodeConf("/co", "redis", "/run/sentinel/redis")
	replica := s.nodeConf("/co", "redis2", "/run/sentinel/redis2")
	for _, want := range []string{
		`include "/co/redis/redis.conf"`, `masterauth "pa\"ss\\"`, "repl-diskless-sync-delay 0",
		"replica-announce-ip 127.0.0.1", "replica-announce-port 6390",
	} {
		if !strings.Contains(master, want+"\n") {
			t.Errorf("master's node.conf lacks %q:\n%s", want, master)
		}
	}
	if strings.Contains(master, "replicaof") || !strings.Contains(replica, "replicaof 127.0.0.1 6390\n") ||
		!strings.Contains(replica, "replica-announce-port 6391\n") {
		t.Errorf("node.conf: the master\n%s\nthe replica\n%s", master, replica)
	}
	sc := s.sentinelConf("sentinel2")
	for _, want := range []string{"sentinel resolve-hostnames no", "sentinel monitor fleet 127.0.0.1 6390 2",
		`sentinel auth-pass fleet "pa\"ss\\"`, "sentinel down-after-milliseconds fleet 1000",
		"sentinel failover-timeout fleet 5000", "sentinel parallel-syncs fleet 1"} {
		if !strings.Contains(sc, want+"\n") {
			t.Errorf("sentinel.conf lacks %q:\n%s", want, sc)
		}
	}

	c := topologySettings(t, "cluster")
	node := c.nodeConf("/co", "redis4", "/run/cluster/redis4")
	for _, want := range []string{"cluster-enabled yes", `cluster-config-file "/run/cluster/redis4/nodes.conf"`,
		"cluster-node-timeout 2000", "cluster-require-full-coverage no", "cluster-replica-validity-factor 0",
		"cluster-announce-ip 127.0.0.1"} {
		if !strings.Contains(node, want+"\n") {
			t.Errorf("cluster node.conf lacks %q:\n%s", want, node)
		}
	}
	if strings.Contains(node, "replica") && !strings.Contains(node, "cluster-replica-validity-factor") {
		t.Errorf("cluster node.conf:\n%s", node)
	}

	p := topologySettings(t, "single").prometheusConfig("/co")
	for _, want := range []string{`  - "` + filepath.Join("/co", "prometheus", "rules.yml") + `"`, "  - job_name: fleetlimit",
		`      - targets: ["127.0.0.1:9081"]` + "\n        labels: {instance: app1}",
		`      - targets: ["127.0.0.1:9084"]` + "\n        labels: {instance: app4}"} {
		if !strings.Contains(p, want+"\n") {
			t.Errorf("prometheus.yml lacks %q:\n%s", want, p)
		}
	}
}
