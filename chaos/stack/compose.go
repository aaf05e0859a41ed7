// The compose stack: one implementation of Stack (up, down, each fault,
// status); what it shares with local.go is in stack.go and http.go.

package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/loadtest"
)

// Compose is the compose stack of `make up`, started through
// scripts/compose.sh (compose v2 or v1, whichever the machine has) and
// faulted through the docker CLI on the containers' ids: compose v1 is a
// Python program whose every start costs about a second of CPU, too much to
// run while latency is measured. It adds docker-compose.chaos.yml (Docker's
// healthchecks pushed out of the run: each is an exec, a burst of engine
// CPU, and the suite checks readiness itself over HTTP) and, for the
// scenarios that need a fault proxy, docker-compose.toxiproxy.yml: a
// toxiproxy between each app and Redis, which costs CPU and a connection
// per connection, so no other scenario runs with it
// (docs/MEASURING.md). Redis,
// the apps' admin ports and toxiproxy's API are published on the host's
// loopback, so the suite reaches them directly.
//
// Compose is not safe for concurrent use.
type Compose struct {
	httpAPI
	r    runner
	info Info
	ids  map[string]string // service -> container id, from Up
	// paused: Redis was paused with docker pause (SIGSTOP was refused).
	paused bool
	// redisNet and redisIP are the network the apps reach Redis on and
	// Redis' address there, read at Up.
	redisNet, redisIP string
	// reniced: the stack's processes were given stackNice (see prioritize).
	reniced bool
	// LogFile, if set, receives the last lines of every service's log
	// before each Down (the containers go with it).
	LogFile string
}

// The compose files (COMPOSE_FILE): the stack with Docker's healthchecks off
// (the suite checks readiness itself), and the same with the fault proxy.
const (
	ComposeFile      = "docker-compose.yml:docker-compose.chaos.yml"
	ComposeFileProxy = ComposeFile + ":docker-compose.toxiproxy.yml"
)

// NewCompose returns the compose stack of the repository at root.
func NewCompose(root string, log io.Writer) *Compose {
	return &Compose{httpAPI: newHTTPAPI(), r: runner{root: root, log: log}}
}

// Name implements Stack.
func (c *Compose) Name() string { return "compose" }

// Unsupported implements Stack: the compose stack injects every fault of
// the single-Redis topology.
func (c *Compose) Unsupported(needs string) string {
	switch needs {
	case NeedsSentinel, NeedsCluster:
		return "the compose stack's " + needs + " topology is not in the chaos suite yet (make chaos-local runs it)"
	case NeedsResetPartition:
		return "the compose stack publishes no app port, and the reset keys' requests go straight to app1 (make chaos-local runs it)"
	case NeedsReload:
		return "the compose stack's apps share one bind-mounted policy file and RLS configuration, so a change reaches them all at once (make chaos-local runs it)"
	}
	return ""
}

// SetPolicies implements Stack: not on the compose stack (Unsupported).
func (c *Compose) SetPolicies(context.Context, string, string) (string, error) {
	return "", &UnsupportedError{Fault: NeedsReload, Reason: c.Unsupported(NeedsReload)}
}

// SetRLSConfig implements Stack: not on the compose stack (Unsupported).
func (c *Compose) SetRLSConfig(context.Context, string, string) (string, error) {
	return "", &UnsupportedError{Fault: NeedsReload, Reason: c.Unsupported(NeedsReload)}
}

// Up implements Stack: make down (volumes are kept), make up (waits until
// healthy), then the published addresses of nginx, the apps' admin ports and
// (for latency) toxiproxy's API.
func (c *Compose) Up(ctx context.Context, needs string) (Info, error) {
	files := ComposeFile
	if needs == NeedsLatency {
		files = ComposeFileProxy
	}
	// --remove-orphans in make down takes away a proxy the last run added.
	tokens, token := AdminTokens()
	c.r.env = []string{"COMPOSE_FILE=" + files, "RL_ADMIN_TOKEN=" + tokens}
	if err := c.r.run(ctx, "make", "--no-print-directory", "down"); err != nil {
		return Info{}, err
	}
	// make up would wait for Docker's healthchecks, which this stack pushes
	// out of the run: build and start, then check readiness here.
	if err := c.r.run(ctx, "scripts/compose.sh", "build", "app1"); err != nil {
		return Info{}, err
	}
	if err := c.r.run(ctx, "scripts/compose.sh", "up", "-d"); err != nil {
		return Info{}, err
	}
	nginx, err := c.published(ctx, "nginx", "8080")
	if err != nil {
		return Info{}, err
	}
	redisAddr, err := c.published(ctx, "redis", "6379")
	if err != nil {
		return Info{}, err
	}
	rls, err := c.published(ctx, "nginx", "8090")
	if err != nil {
		return Info{}, err
	}
	info := Info{NginxURL: "http://" + nginx, RedisAddr: redisAddr, UpstreamURL: "http://" + nginx + "/static/", RLSAddr: rls, AdminToken: token}
	if needs == NeedsLatency {
		api, err := c.published(ctx, "toxiproxy", "8474")
		if err != nil {
			return Info{}, err
		}
		info.ProxyAPI = "http://" + api
	}
	out, err := c.r.output(ctx, "scripts/compose.sh", "ps", "--services")
	if err != nil {
		return Info{}, err
	}
	for s := range strings.FieldsSeq(string(out)) {
		if !strings.HasPrefix(s, "app") {
			continue
		}
		admin, err := c.published(ctx, s, "9090")
		if err != nil {
			return Info{}, err
		}
		a := App{Name: s, AdminURL: "http://" + admin}
		if info.ProxyAPI != "" {
			a.Proxy = s + "-redis"
		}
		info.Apps = append(info.Apps, a)
	}
	if len(info.Apps) == 0 {
		return Info{}, errors.New("compose: no app services")
	}
	slices.SortFunc(info.Apps, func(a, b App) int { return strings.Compare(a.Name, b.Name) })
	c.info = info
	c.ids = map[string]string{}
	services := append([]string{"redis", "nginx"}, info.AppNames()...)
	if info.ProxyAPI != "" {
		services = append(services, "toxiproxy")
	}
	for _, svc := range services {
		out, err := c.r.output(ctx, "scripts/compose.sh", "ps", "-q", svc)
		if err != nil {
			return Info{}, err
		}
		id, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		if id == "" {
			return Info{}, fmt.Errorf("compose: no container for %s", svc)
		}
		c.ids[svc] = id
	}
	if c.redisNet, c.redisIP, err = c.network(ctx, c.ids["redis"], "_back"); err != nil {
		return Info{}, err
	}
	if direct, ok := c.bridged(ctx, info); ok {
		info, c.info = direct, direct
	}
	rdb := c.RedisClient()
	defer rdb.Close()
	if err := waitFor(ctx, 60*time.Second, func(ctx context.Context) error { return rdb.Ping(ctx).Err() }); err != nil {
		return Info{}, fmt.Errorf("compose: redis: %w", err)
	}
	for _, a := range info.Apps {
		if err := c.waitReady(ctx, info, a.Name, 60*time.Second); err != nil {
			return Info{}, fmt.Errorf("compose: %s: %w", a.Name, err)
		}
	}
	if err := waitFor(ctx, 60*time.Second, func(ctx context.Context) error {
		_, err := c.get(ctx, info.NginxURL+"/healthz")
		return err
	}); err != nil {
		return Info{}, fmt.Errorf("compose: nginx: %w", err)
	}
	c.prioritize("")
	return info, nil
}

// stackNice is the nice value prioritize gives the stack's processes.
const stackNice = -10

// prioritize gives the processes that serve and measure requests (every
// container of the stack, or only service's when set; docker-proxy; this
// process, which generates the load and times it) precedence over
// everything else on the host, in particular over the Docker engine
// (dockerd, containerd, runc, the shims, fuse-overlayfs) while it starts,
// kills or rewires containers for a fault. A `docker start` costs the
// engine a burst of CPU; at the same priority it would stall the requests
// in flight, a cost of the test's fault injection, not of the limiter,
// which in a deployment does not share its cores with the engine
// restarting its store. Needs root (CAP_SYS_NICE);
// without it the run goes on at the default priority, and says so once.
func (c *Compose) prioritize(service string) {
	var pids []int
	for svc, id := range c.ids {
		if service != "" && svc != service {
			continue
		}
		ps, _, err := containerPIDs(id)
		if err != nil {
			c.r.logf("compose: priority of %s: %v", svc, err)
			continue
		}
		pids = append(pids, ps...)
	}
	if service == "" {
		pids = append(pids, pidsNamed("docker-proxy")...)
		pids = append(pids, os.Getpid())
	}
	n := 0
	for _, pid := range pids {
		if err := renice(pid, stackNice); err != nil {
			if !c.reniced {
				c.r.logf("compose: cannot raise the stack's priority (%v): the Docker engine's work for a fault competes with the requests", err)
			}
			return
		}
		n++
	}
	if service == "" {
		c.r.logf("compose: %d processes of the stack (containers, docker-proxy, the load generator) at nice %d; the docker and compose commands at %d", n, stackNice, scriptNice)
	}
	c.reniced = true
	// The commands that inject faults below the stack: started by this
	// process, they would inherit its stackNice, and the compose CLI's
	// own CPU would compete with the stack at its priority.
	nice := scriptNice
	c.r.nice = &nice
}

// published returns the host address (127.0.0.1:port) of a service's
// container port.
func (c *Compose) published(ctx context.Context, service, port string) (string, error) {
	out, err := c.r.output(ctx, "scripts/compose.sh", "port", service, port)
	if err != nil {
		return "", err
	}
	addr := strings.TrimSpace(string(out))
	if addr == "" || strings.HasSuffix(addr, ":0") {
		return "", fmt.Errorf("compose: %s publishes no port for %s", service, port)
	}
	// "0.0.0.0:8080" when bound to every address: reach it on loopback.
	if host, p, err := net.SplitHostPort(addr); err == nil && (host == "0.0.0.0" || host == "::") {
		addr = net.JoinHostPort("127.0.0.1", p)
	}
	return addr, nil
}

// bridged returns info with nginx reached on its address on the front
// network, which this host routes to directly (a Docker bridge), instead of
// its published loopback ports: a client on another host reaches it that
// way too (the kernel forwards), while the loopback ports go through
// docker-proxy, a userland relay that took a sixth of a CPU under the
// suite's load and added its hop to every request's latency. Not ok (the
// published ports stay) when the address does not answer, as with a
// rootless engine.
func (c *Compose) bridged(ctx context.Context, info Info) (Info, bool) {
	_, ip, err := c.network(ctx, c.ids["nginx"], "_front")
	if err != nil {
		return info, false
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil || loadtest.AllowTarget(addr) != nil {
		return info, false
	}
	host := addr.String()
	if addr.Is6() {
		host = "[" + host + "]"
	}
	direct := info
	direct.NginxURL = "http://" + host + ":8080"
	direct.UpstreamURL = direct.NginxURL + "/static/"
	direct.RLSAddr = net.JoinHostPort(addr.String(), "8090")
	if err := waitFor(ctx, 10*time.Second, func(ctx context.Context) error {
		_, err := c.get(ctx, direct.NginxURL+"/healthz")
		return err
	}); err != nil {
		c.r.logf("compose: nginx does not answer on %s (%v): the load goes through its published ports", direct.NginxURL, err)
		return info, false
	}
	c.r.logf("compose: the load reaches nginx on %s, not through docker-proxy", direct.NginxURL)
	return direct, true
}

// Down implements Stack: saves the logs' tails to LogFile, then make down.
func (c *Compose) Down(ctx context.Context) error {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	if c.LogFile != "" {
		if out, err := c.r.output(stopCtx, "scripts/compose.sh", "logs", "--no-color", "--tail", "100"); err == nil {
			if f, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
				fmt.Fprintf(f, "==== compose logs before down, %s\n", time.Now().UTC().Format(time.RFC3339))
				_, _ = f.Write(out)
				_ = f.Close()
			}
		}
	}
	return c.r.run(stopCtx, "make", "--no-print-directory", "down")
}

func (c *Compose) container(service string) (string, error) {
	id := c.ids[service]
	if id == "" {
		return "", fmt.Errorf("compose: no container for %s (Up first)", service)
	}
	return id, nil
}

// docker runs the docker CLI on a service's container: docker VERB [ARGS] ID.
func (c *Compose) docker(ctx context.Context, service string, verb ...string) error {
	id, err := c.container(service)
	if err != nil {
		return err
	}
	return c.r.run(ctx, "docker", append(verb, id)...)
}

// network returns the container's network whose name ends in suffix, and
// its address there.
func (c *Compose) network(ctx context.Context, id, suffix string) (name, ip string, err error) {
	out, err := c.r.output(ctx, "docker", "inspect", "-f",
		`{{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}} {{end}}`, id)
	if err != nil {
		return "", "", err
	}
	for f := range strings.FieldsSeq(string(out)) {
		n, addr, _ := strings.Cut(f, "=")
		if strings.HasSuffix(n, suffix) {
			return n, addr, nil
		}
	}
	return "", "", fmt.Errorf("container %s: no network *%s", id, suffix)
}
