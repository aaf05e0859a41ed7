package native

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The configuration files the stack writes for its processes.

// nodeDir returns the directory of a data node or Sentinel of the sentinel
// and cluster topologies, <run>/<topology>/<name>, made when missing (the
// topology's directory with mode 700: the files in it hold the password).
func (st *Stack) nodeDir(name string) (string, error) {
	top := filepath.Join(st.s.RunDir, string(st.s.Topology))
	if _, err := os.Stat(top); err != nil {
		if err := os.MkdirAll(top, 0o700); err != nil {
			return "", err
		}
		if err := os.Chmod(top, 0o700); err != nil {
			return "", err
		}
	}
	dir := filepath.Join(top, name)
	return dir, os.MkdirAll(dir, 0o755)
}

// confQuote is a string in a Redis config file: double-quoted, \ and "
// escaped.
func confQuote(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}

// nodeConf is a data node's own config file, read by redis-server in place
// of redis/redis.conf (which it includes; the command line still sets
// port, bind, dir and requirepass, and wins). In the sentinel topology the
// first node starts as the master and the second as its replica; Sentinel
// rewrites the file when it changes a node's role.
func (s Settings) nodeConf(root, name, dir string) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("# written by the native stack (chaos/native) for %s (%s topology);", name, s.Topology)
	if s.Topology == Sentinel {
		line("# Sentinel rewrites it (CONFIG REWRITE) when it changes the node's role.")
	}
	line("include %s", confQuote(filepath.Join(root, "redis", "redis.conf")))
	line("masterauth %s", confQuote(s.RedisPassword))
	line("# a replica's full sync starts at once, not after 5 s (Redis 7's default waits for more)")
	line("repl-diskless-sync-delay 0")
	switch s.Topology {
	case Sentinel:
		line("replica-announce-ip %s", s.Host)
		line("replica-announce-port %d", s.redisPort(name))
		if first := s.RedisNodes()[0]; name != first {
			line("replicaof %s %d", s.Host, s.redisPort(first))
		}
	case Cluster:
		line("cluster-enabled yes")
		line("cluster-config-file %s", confQuote(filepath.Join(dir, "nodes.conf")))
		line("cluster-node-timeout 2000")
		line("cluster-require-full-coverage no")
		line("cluster-replica-validity-factor 0")
		line("cluster-announce-ip %s", s.Host)
	}
	return b.String()
}

// sentinelConf is a Sentinel's config, monitoring the first data node as
// the master. Sentinel adds what it learns (its id, the replica, the other
// Sentinels, a new master) to it.
func (s Settings) sentinelConf(name string) string {
	return fmt.Sprintf(`# written by the native stack (chaos/native) for %s; Sentinel rewrites it.
sentinel resolve-hostnames no
sentinel monitor %s %s %d 2
sentinel auth-pass %s %s
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 5000
sentinel parallel-syncs %s 1
`, name, MasterName, s.Host, s.redisPort(s.RedisNodes()[0]), MasterName, confQuote(s.RedisPassword),
		MasterName, MasterName, MasterName)
}

func (st *Stack) writeNodeConf(name string) error {
	dir, err := st.nodeDir(name)
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "node.conf"), []byte(st.s.nodeConf(st.root, name, dir)), 0o600)
}

func (st *Stack) writeSentinelConf(name string) error {
	dir, err := st.nodeDir(name)
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "sentinel.conf"), []byte(st.s.sentinelConf(name)), 0o600)
}

// writeConfigs writes the configs Up starts a stack from: every node's and
// Sentinel's afresh (in the sentinel topology: redis the master again,
// fresh Sentinels).
func (st *Stack) writeConfigs() error {
	if st.s.Topology == Single {
		return nil
	}
	for _, n := range st.s.RedisNodes() {
		if err := st.writeNodeConf(n); err != nil {
			return err
		}
	}
	for _, n := range st.s.Sentinels() {
		if err := st.writeSentinelConf(n); err != nil {
			return err
		}
	}
	return nil
}

// prometheusConfig is what prometheus/prometheus.yml is to the compose
// stack: job fleetlimit, one target per app's admin port with the app's
// name as its instance, and the checkout's prometheus/rules.yml.
func (s Settings) prometheusConfig(root string) string {
	rules, _ := json.Marshal(filepath.Join(root, "prometheus", "rules.yml")) // a JSON string is a YAML one
	var b strings.Builder
	fmt.Fprintf(&b, `# written by the native stack (chaos/native, make local-up); see prometheus/prometheus.yml
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - %s
scrape_configs:
  - job_name: fleetlimit
    static_configs:
`, rules)
	for _, a := range Apps {
		fmt.Fprintf(&b, "      - targets: [%q]\n        labels: {instance: %s}\n", s.hostPort(s.adminPort(a)), a)
	}
	return b.String()
}

// rlsConfigDir returns an app's RL_RLS_CONFIG_DIR. With
// LOCAL_RLS_CONFIG_PER_APP_DIR, <dir>/<app>/, made when missing as kubelet
// lays out a ConfigMap volume: the files in ..<timestamp>/, ..data a
// symlink to it, each file a symlink through ..data (an update writes a
// new ..<timestamp>/ and renames a new ..data over the old one).
func (st *Stack) rlsConfigDir(app string) (string, error) {
	if st.s.RLSConfigPerAppDir == "" {
		return st.s.RLSConfigDir, nil
	}
	dir := filepath.Join(st.s.RLSConfigPerAppDir, app)
	if _, err := os.Lstat(filepath.Join(dir, "..data")); err == nil {
		return dir, nil
	}
	ts := ".." + st.now().UTC().Format("2006_01_02_15_04_05.000000000")
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		return "", err
	}
	for _, pattern := range []string{"*.yaml", "*.yml"} {
		files, _ := filepath.Glob(filepath.Join(st.s.RLSConfigDir, pattern))
		for _, f := range files {
			if fi, err := os.Stat(f); err != nil || !fi.Mode().IsRegular() {
				continue
			}
			name := filepath.Base(f)
			if err := copyFile(f, filepath.Join(dir, ts, name)); err != nil {
				return "", err
			}
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				return "", err
			}
		}
	}
	return dir, os.Symlink(ts, filepath.Join(dir, "..data"))
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// renderNginx renders an nginx template for this stack into
// <run>/<name>/nginx.conf with scripts/render-nginx.sh (which `make
// nginx-conf` also uses for the compose stack's), the settings passed in
// its environment.
func (st *Stack) renderNginx(name, template string) (string, error) {
	dir := filepath.Join(st.s.RunDir, name)
	out := filepath.Join(dir, "nginx.conf")
	cmd := exec.Command(filepath.Join(st.root, "scripts", "render-nginx.sh"), "native", out, dir)
	cmd.Dir = st.root
	cmd.Env = command{env: []string{
		"NGINX_TEMPLATE=" + filepath.Join(st.root, "nginx", template),
		"LOCAL_HOST=" + st.s.Host,
		"LOCAL_NGINX_PORT=" + strconv.Itoa(st.s.NginxPort),
		"LOCAL_APP_PORT_BASE=" + strconv.Itoa(st.s.AppPortBase),
		"LOCAL_STATIC_PORT=" + strconv.Itoa(st.s.StaticPort),
		"LOCAL_RLS_PORT=" + strconv.Itoa(st.s.RLSPort),
		"LOCAL_GRPC_PORT_BASE=" + strconv.Itoa(st.s.GRPCPortBase),
	}}.environ()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("scripts/render-nginx.sh native %s: %v\n%s", out, err, b)
	}
	return dir, nil
}
