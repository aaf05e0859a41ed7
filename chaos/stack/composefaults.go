// The compose stack's faults: Redis and the apps killed, paused and
// started through the Docker CLI, an app cut off by dropping its packets
// to Redis, latency through the proxy override.

package stack

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClient returns a client of the stack's Redis through its published
// port (for the checks after settle).
func (c *Compose) RedisClient() *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: c.info.RedisAddr, Password: RedisPassword(c.r.root, nil),
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1,
	})
}

// Flush implements Stack: FLUSHALL and BGREWRITEAOF.
func (c *Compose) Flush(ctx context.Context) error { return flush(ctx, c.RedisClient()) }

// KillRedis implements Stack: SIGKILL to the Redis server from the host
// (docker kill where that is refused).
func (c *Compose) KillRedis(ctx context.Context) error {
	return c.kill(ctx, "redis")
}

// kill SIGKILLs the service container's first process from the host, as on
// the native stack: the container exits as if the process had crashed. When
// the host may not signal it, docker kill does.
func (c *Compose) kill(ctx context.Context, service string) error {
	if err := c.signal(ctx, service, syscall.SIGKILL); err != nil {
		c.r.logf("compose: SIGKILL from the host failed (%v); docker kill instead", err)
		return c.docker(ctx, service, "kill", "--signal", "KILL")
	}
	return nil
}

// StartRedis implements Stack. A wipe first empties the data volume from a
// one-off container of the Redis image that mounts the stopped container's
// volumes.
func (c *Compose) StartRedis(ctx context.Context, wipe bool) error {
	id, err := c.container("redis")
	if err != nil {
		return err
	}
	if wipe {
		image, err := c.r.output(ctx, "docker", "inspect", "-f", "{{.Config.Image}}", id)
		if err != nil {
			return err
		}
		if err := c.r.run(ctx, "docker", "run", "--rm", "--volumes-from", id, "--entrypoint", "sh",
			strings.TrimSpace(string(image)), "-c", "rm -rf /data/appendonlydir /data/*.aof /data/*.rdb"); err != nil {
			return err
		}
	}
	if err := c.r.run(ctx, "docker", "start", id); err != nil {
		return err
	}
	c.prioritize("redis")
	rdb := c.RedisClient()
	defer rdb.Close()
	return waitFor(ctx, 60*time.Second, func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
}

// PauseRedis implements Stack: SIGSTOP to the Redis server (the
// container's first process), sent from the host as on the native stack;
// its connections hang. `docker pause` (the cgroup freezer) does the same
// but costs runc and containerd a burst of CPU just as the fault begins,
// which the requests in flight would wait for. Where the host may
// not signal the process (not root), docker pause is used instead.
func (c *Compose) PauseRedis(ctx context.Context) error {
	if err := c.signal(ctx, "redis", syscall.SIGSTOP); err != nil {
		c.r.logf("compose: SIGSTOP failed (%v); docker pause instead", err)
		c.paused = true
		return c.docker(ctx, "redis", "pause")
	}
	return nil
}

// ResumeRedis implements Stack: SIGCONT (or docker unpause, after a pause).
func (c *Compose) ResumeRedis(ctx context.Context) error {
	if c.paused {
		c.paused = false
		return c.docker(ctx, "redis", "unpause")
	}
	return c.signal(ctx, "redis", syscall.SIGCONT)
}

// signal sends sig to the service container's first process from the host.
func (c *Compose) signal(ctx context.Context, service string, sig syscall.Signal) error {
	pid, err := c.pid(ctx, service)
	if err != nil {
		return err
	}
	c.r.logf("compose: %v to %s (pid %d)", sig, service, pid)
	return syscall.Kill(pid, sig)
}

// pid returns the host pid of the service container's first process: from
// /proc (no docker call), else from docker inspect.
func (c *Compose) pid(ctx context.Context, service string) (int, error) {
	id, err := c.container(service)
	if err != nil {
		return 0, err
	}
	if _, first, err := containerPIDs(id); err == nil {
		return first, nil
	}
	out, err := c.r.output(ctx, "docker", "inspect", "-f", "{{.State.Pid}}", id)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("compose: %s is not running", service)
	}
	return pid, nil
}

// KillApp implements Stack: SIGKILL from the host (see kill).
func (c *Compose) KillApp(ctx context.Context, app string) error {
	return c.kill(ctx, app)
}

// StartApp implements Stack.
func (c *Compose) StartApp(ctx context.Context, app string) error {
	if err := c.docker(ctx, app, "start"); err != nil {
		return err
	}
	c.prioritize(app)
	return c.waitReady(ctx, c.info, app, 60*time.Second)
}

// Partition implements Stack: the app's packets to Redis are dropped, as a
// network partition drops them. The rule goes into the container's own
// network namespace (nsenter + iptables, one cheap process each way), so
// Docker's network plumbing is not touched while latency is measured:
// `docker network disconnect` rewrites iptables and the embedded DNS, a
// burst of engine CPU while latency is measured. Where nsenter is not
// possible (not root, no iptables), the app's container is disconnected
// from the network it reaches Redis on instead.
func (c *Compose) Partition(ctx context.Context, app string, on bool) error {
	id, err := c.container(app)
	if err != nil {
		return err
	}
	err = c.dropTo(ctx, app, c.redisIP, on)
	if err == nil {
		return nil
	}
	c.r.logf("compose: partition through nsenter failed (%v); disconnecting the container instead", err)
	verb := "connect"
	if on {
		verb = "disconnect"
	}
	return c.r.run(ctx, "docker", "network", verb, c.redisNet, id)
}

// dropTo adds (on) or deletes the rule that drops the app's packets to
// ip:6379, inside the app container's network namespace.
func (c *Compose) dropTo(ctx context.Context, app, ip string, on bool) error {
	if ip == "" {
		return errors.New("redis has no address")
	}
	pid, err := c.pid(ctx, app)
	if err != nil {
		return err
	}
	op := "-D"
	if on {
		op = "-I"
	}
	return c.r.run(ctx, "nsenter", "-t", strconv.Itoa(pid), "-n", "--",
		"iptables", "-w", "5", op, "OUTPUT", "-p", "tcp", "-d", ip, "--dport", "6379", "-j", "DROP")
}

// Latency implements Stack: a latency toxic on every app's proxy (Up adds
// the proxies for a fault that needs latency).
func (c *Compose) Latency(ctx context.Context, d, jitter time.Duration) error {
	if c.info.ProxyAPI == "" {
		return &UnsupportedError{Fault: "latency", Reason: "the stack was started without the fault proxy (Up with needs \"latency\")"}
	}
	return c.latency(ctx, c.info, d, jitter)
}

// SetClock implements Stack, on the app's published admin port.
func (c *Compose) SetClock(ctx context.Context, app string, offset time.Duration) error {
	return c.setClock(ctx, c.info, app, offset)
}

// Status implements Stack: GET the app's published admin /status.
func (c *Compose) Status(ctx context.Context, app string) ([]byte, error) {
	return c.status(ctx, c.info, app)
}
