package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Compose is the compose stack of `make up`, driven through
// scripts/compose.sh (compose v2 or v1, whichever the machine has) and the
// docker CLI. The apps' admin port is not published: /status is fetched
// from inside the nginx container, which shares the apps' front network.
//
// Compose is not safe for concurrent use.
type Compose struct {
	r    runner
	info Info
}

// NewCompose returns the compose stack of the repository at root.
func NewCompose(root string, log io.Writer) *Compose {
	return &Compose{r: runner{root: root, log: log}}
}

// Name implements Stack.
func (c *Compose) Name() string { return "compose" }

// LatencyUnsupported is why the compose stack skips redis-latency.
const LatencyUnsupported = "the compose stack has no fault-injection proxy between the apps and Redis " +
	"(toxiproxy runs in the native stack only), and delaying Redis replies inside the containers " +
	"would need tc and NET_ADMIN, which the stack does not grant; run it with make chaos-local"

// Unsupported implements Stack.
func (c *Compose) Unsupported(fault string) string {
	if fault == "latency" {
		return LatencyUnsupported
	}
	return ""
}

func (c *Compose) compose(ctx context.Context, args ...string) error {
	return c.r.run(ctx, "scripts/compose.sh", args...)
}

// Up implements Stack: make down (volumes are kept), make up (waits until
// healthy).
func (c *Compose) Up(ctx context.Context) (Info, error) {
	if err := c.r.run(ctx, "make", "--no-print-directory", "down"); err != nil {
		return Info{}, err
	}
	if err := c.r.run(ctx, "make", "--no-print-directory", "up"); err != nil {
		return Info{}, err
	}
	port := os.Getenv("NGINX_PORT")
	if port == "" {
		port = "8080"
	}
	info := Info{NginxURL: "http://127.0.0.1:" + port}
	out, err := c.r.output(ctx, "scripts/compose.sh", "ps", "--services")
	if err != nil {
		return Info{}, err
	}
	for s := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(s, "app") {
			info.Apps = append(info.Apps, App{Name: s})
		}
	}
	if len(info.Apps) == 0 {
		return Info{}, errors.New("compose: no app services")
	}
	c.info = info
	return info, nil
}

// Down implements Stack: make down.
func (c *Compose) Down(ctx context.Context) error {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	return c.r.run(stopCtx, "make", "--no-print-directory", "down")
}

func (c *Compose) container(ctx context.Context, service string) (string, error) {
	out, err := c.r.output(ctx, "scripts/compose.sh", "ps", "-q", service)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(out))
	if id == "" {
		return "", fmt.Errorf("compose: no container for %s", service)
	}
	return strings.Fields(id)[0], nil
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

// Flush implements Stack: FLUSHALL and BGREWRITEAOF through redis-cli in
// the Redis container (its REDISCLI_AUTH holds the password).
func (c *Compose) Flush(ctx context.Context) error {
	for _, cmd := range []string{"FLUSHALL", "BGREWRITEAOF"} {
		if err := c.compose(ctx, "exec", "-T", "redis", "redis-cli", cmd); err != nil {
			return err
		}
	}
	return nil
}

// KillRedis implements Stack.
func (c *Compose) KillRedis(ctx context.Context) error {
	return c.compose(ctx, "kill", "-s", "SIGKILL", "redis")
}

// StartRedis implements Stack. A wipe empties the data volume from a
// one-off container of the Redis image first.
func (c *Compose) StartRedis(ctx context.Context, wipe bool) error {
	if wipe {
		if err := c.compose(ctx, "run", "--rm", "--no-deps", "-T", "--entrypoint", "sh", "redis",
			"-c", "rm -rf /data/appendonlydir /data/*.aof /data/*.rdb"); err != nil {
			return err
		}
	}
	if err := c.compose(ctx, "start", "redis"); err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, func(ctx context.Context) error {
		out, err := c.r.output(ctx, "scripts/compose.sh", "exec", "-T", "redis", "redis-cli", "ping")
		if err != nil {
			return err
		}
		if !strings.Contains(string(out), "PONG") {
			return fmt.Errorf("redis-cli ping: %q", out)
		}
		return nil
	})
}

// PauseRedis implements Stack: docker pause (the cgroup freezer: like
// SIGSTOP, connections hang).
func (c *Compose) PauseRedis(ctx context.Context) error { return c.compose(ctx, "pause", "redis") }

// ResumeRedis implements Stack.
func (c *Compose) ResumeRedis(ctx context.Context) error { return c.compose(ctx, "unpause", "redis") }

// KillApp implements Stack.
func (c *Compose) KillApp(ctx context.Context, app string) error {
	return c.compose(ctx, "kill", "-s", "SIGKILL", app)
}

// StartApp implements Stack.
func (c *Compose) StartApp(ctx context.Context, app string) error {
	if err := c.compose(ctx, "start", app); err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, func(ctx context.Context) error {
		_, err := c.admin(ctx, app, "/readyz")
		return err
	})
}

// Partition implements Stack: disconnects the app's container from the
// back network (the one it reaches Redis on), or connects it again.
func (c *Compose) Partition(ctx context.Context, app string, on bool) error {
	id, err := c.container(ctx, app)
	if err != nil {
		return err
	}
	if on {
		net, _, err := c.network(ctx, id, "_back")
		if err != nil {
			return err
		}
		return c.r.run(ctx, "docker", "network", "disconnect", net, id)
	}
	redisID, err := c.container(ctx, "redis")
	if err != nil {
		return err
	}
	net, _, err := c.network(ctx, redisID, "_back")
	if err != nil {
		return err
	}
	return c.r.run(ctx, "docker", "network", "connect", net, id)
}

// Latency implements Stack: not supported.
func (c *Compose) Latency(context.Context, time.Duration) error {
	return &UnsupportedError{Fault: "latency", Reason: LatencyUnsupported}
}

// Status implements Stack.
func (c *Compose) Status(ctx context.Context, app string) ([]byte, error) {
	return c.admin(ctx, app, "/status")
}

// admin GETs path on the app's admin port from inside the nginx container
// (busybox wget in the alpine image, curl in the Debian ones).
func (c *Compose) admin(ctx context.Context, app, path string) ([]byte, error) {
	id, err := c.container(ctx, app)
	if err != nil {
		return nil, err
	}
	_, ip, err := c.network(ctx, id, "_front")
	if err != nil {
		return nil, err
	}
	url := "http://" + ip + ":9090" + path
	return c.r.output(ctx, "scripts/compose.sh", "exec", "-T", "nginx", "sh", "-c",
		"wget -q -O - "+url+" 2>/dev/null || curl -fsS "+url)
}
