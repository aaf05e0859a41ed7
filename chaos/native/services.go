package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// How each service starts.

// start starts service name (wipe: a data node without its data).
func (st *Stack) start(name string, wipe bool) error {
	var c command
	var err error
	switch {
	case strings.HasPrefix(name, "redis"):
		c, err = st.redisCommand(name, wipe)
	case strings.HasPrefix(name, "sentinel"):
		c, err = st.sentinelCommand(name)
	case name == "toxiproxy":
		c = command{
			argv: []string{filepath.Join(st.root, "bin", "toxiproxy-server"), "-host", st.s.Host, "-port", strconv.Itoa(st.s.ProxyAPIPort)},
			env:  []string{"GOMAXPROCS=" + strconv.Itoa(st.s.GOMAXPROCS)},
		}
	case strings.HasPrefix(name, "app"):
		c, err = st.appCommand(name)
	case name == "static", name == "nginx":
		c, err = st.nginxCommand(name)
	case name == "prometheus":
		c, err = st.prometheusCommand()
	default:
		return fmt.Errorf("unknown service: %s (one of: %s)", name, strings.Join(st.s.Services(), " "))
	}
	if err != nil {
		return err
	}
	_, err = st.spawn(name, c)
	return err
}

// redisArgs are the arguments every data node gets after its config file.
func (st *Stack) redisArgs(name, dir string) []string {
	return []string{"--port", strconv.Itoa(st.s.redisPort(name)), "--bind", st.s.Host, "--dir", dir,
		"--daemonize", "no", "--protected-mode", "no", "--requirepass", st.s.RedisPassword}
}

func (st *Stack) redisCommand(name string, wipe bool) (command, error) {
	if st.s.Topology == Single {
		dir := filepath.Join(st.s.RunDir, "redis")
		if wipe {
			st.logf("redis: wiping its data (%s)", dir)
			if err := os.RemoveAll(dir); err != nil {
				return command{}, err
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return command{}, err
		}
		argv := append([]string{st.tools.redisServer, filepath.Join(st.root, "redis", "redis.conf")}, st.redisArgs(name, dir)...)
		return command{argv: argv}, nil
	}
	// sentinel, cluster: the data goes, the node's config (its role; its
	// cluster node id and slots) stays.
	dir, err := st.nodeDir(name)
	if err != nil {
		return command{}, err
	}
	data := filepath.Join(dir, "data")
	if wipe {
		st.logf("%s: wiping its data (%s)", name, data)
		if err := os.RemoveAll(data); err != nil {
			return command{}, err
		}
	}
	if err := os.MkdirAll(data, 0o755); err != nil {
		return command{}, err
	}
	conf := filepath.Join(dir, "node.conf")
	if _, err := os.Stat(conf); err != nil {
		if err := st.writeNodeConf(name); err != nil {
			return command{}, err
		}
	}
	return command{argv: append([]string{st.tools.redisServer, conf}, st.redisArgs(name, data)...)}, nil
}

func (st *Stack) sentinelCommand(name string) (command, error) {
	dir, err := st.nodeDir(name)
	if err != nil {
		return command{}, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	if _, err := os.Stat(conf); err != nil {
		if err := st.writeSentinelConf(name); err != nil {
			return command{}, err
		}
	}
	return command{argv: []string{st.tools.redisServer, conf, "--sentinel",
		"--port", strconv.Itoa(st.s.sentinelPort(name)), "--bind", st.s.Host, "--dir", dir, "--daemonize", "no"}}, nil
}

// appUnset are settings from the caller's environment that would change
// the topology: the apps never see them.
var appUnset = []string{"RL_REDIS_URL", "RL_REDIS_ADDRS", "RL_REDIS_MASTER_NAME", "RL_REDIS_USERNAME",
	"RL_REDIS_PASSWORD", "RL_POLICY_FILE", "RL_RLS_CONFIG_DIR"}

func (st *Stack) appCommand(a string) (command, error) {
	s := st.s
	journal := filepath.Join(s.RunDir, a, "journal")
	if err := os.MkdirAll(journal, 0o755); err != nil {
		return command{}, err
	}
	rlsDir, err := st.rlsConfigDir(a)
	if err != nil {
		return command{}, err
	}
	env := []string{
		"RL_INSTANCE=" + a,
		"RL_LISTEN_ADDR=" + s.hostPort(s.appPort(a)),
		"RL_ADMIN_ADDR=" + s.hostPort(s.adminPort(a)),
		"RL_REDIS_TIMEOUT=" + s.RedisTimeout.String(),
		"RL_LOG_LEVEL=" + s.LogLevel,
		"GOMAXPROCS=" + strconv.Itoa(s.GOMAXPROCS),
		"RL_EXPECTED_INSTANCES=" + strconv.Itoa(len(Apps)),
		"RL_DEBUG_HEADERS=true",
		"RL_TRUSTED_PROXIES=127.0.0.1/32,::1/128",
		"RL_JOURNAL_DIR=" + journal,
		"RL_API_KEY_SECRET=" + s.APIKeySecret,
		"RL_ADMIN_TOKEN=" + s.AdminToken,
		// The default secret and token are published: allowed only in demo
		// mode (RL_DEMO=false with a secret and a token of your own leaves
		// it).
		"RL_DEMO=" + strconv.FormatBool(s.Demo),
		// nginx overwrites X-Request-Id ($request_id): a resend is counted
		// once.
		"RL_TRUST_REQUEST_ID=true",
		// The chaos suite's clock-step moves an instance's wall clock
		// (POST /debug/clock on its admin port); off unless asked.
		"RL_DEBUG_CLOCK=" + strconv.FormatBool(s.DebugClock),
		"RL_GRPC_ADDR=" + s.hostPort(s.grpcPort(a)),
		"RL_RLS_CONFIG_DIR=" + rlsDir,
		"RL_RLS_RESPONSE_HEADERS=true",
	}
	switch s.Topology {
	case Single:
		// Through the app's fault proxy, unless LOCAL_REDIS_DIRECT=1 (make
		// bench: the proxy's hop is not part of the deployment it measures).
		port := s.viaPort(a)
		if s.RedisDirect {
			port = s.RedisPort
		}
		env = append(env, "RL_REDIS_URL=redis://:"+urlEncode(s.RedisPassword)+"@"+s.hostPort(port)+"/0")
	case Sentinel:
		// The Sentinels have no password: go-redis sends RL_REDIS_PASSWORD
		// to the master only.
		env = append(env, "RL_REDIS_ADDRS="+s.addrs(s.Sentinels()), "RL_REDIS_MASTER_NAME="+MasterName,
			"RL_REDIS_PASSWORD="+s.RedisPassword)
	case Cluster:
		env = append(env, "RL_REDIS_ADDRS="+s.addrs(s.RedisNodes()), "RL_REDIS_PASSWORD="+s.RedisPassword)
	}
	policy := s.PolicyFile
	if s.PolicyDir != "" {
		if err := os.MkdirAll(s.PolicyDir, 0o755); err != nil {
			return command{}, err
		}
		policy = filepath.Join(s.PolicyDir, a+".json")
		if _, err := os.Stat(policy); err != nil {
			if err := copyFile(s.PolicyFile, policy); err != nil {
				return command{}, err
			}
		}
	}
	if policy != "" {
		env = append(env, "RL_POLICY_FILE="+policy)
	}
	return command{argv: []string{filepath.Join(st.root, "bin", "ratelimiter")}, env: env, unset: appUnset}, nil
}

// nginxCommand is the front nginx (nginx/nginx.conf.template) or the static
// site's, a second nginx serving nginx/site/ (nginx/static.conf.template),
// each rendered under <run>/<name>/.
func (st *Stack) nginxCommand(name string) (command, error) {
	template := "nginx.conf.template"
	if name == "static" {
		template = "static.conf.template"
	}
	dir, err := st.renderNginx(name, template)
	if err != nil {
		return command{}, err
	}
	return command{argv: []string{st.tools.nginx, "-p", dir + "/", "-c", filepath.Join(dir, "nginx.conf"),
		"-e", filepath.Join(dir, "error.log"), "-g", "daemon off;"}}, nil
}

func (st *Stack) prometheusCommand() (command, error) {
	dir := filepath.Join(st.s.RunDir, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return command{}, err
	}
	conf := filepath.Join(dir, "prometheus.yml")
	if err := writeFile(conf, []byte(st.s.prometheusConfig(st.root)), 0o644); err != nil {
		return command{}, err
	}
	return command{argv: []string{st.tools.prometheus, "--config.file=" + conf,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"), "--storage.tsdb.retention.time=2d",
		"--web.listen-address=" + st.s.hostPort(st.s.PrometheusPort)}}, nil
}
