// The native stack's Redis: its password, flushing it between scenarios,
// and the faults of its topologies' nodes (a data node killed or started,
// a replica's replication cut).

package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisPassword is the demo Redis' password: $REDIS_PASSWORD, else the
// --requirepass argument of its command line, else requirepass in
// redis/redis.conf.
func RedisPassword(root string, redisArgs []string) string {
	if p := os.Getenv("REDIS_PASSWORD"); p != "" {
		return p
	}
	for i, a := range redisArgs {
		if a == "--requirepass" && i+1 < len(redisArgs) {
			return redisArgs[i+1]
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "redis", "redis.conf"))
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "requirepass" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// Flush implements Stack: FLUSHALL and BGREWRITEAOF (on every master of a
// Cluster).
func (l *Local) Flush(ctx context.Context) error {
	if l.info.Topology != NeedsCluster {
		return flush(ctx, l.RedisClient())
	}
	shards, err := ClusterShards(ctx, l.info, l.RedisPassword())
	if err != nil {
		return err
	}
	for _, sh := range shards {
		c := redis.NewClient(&redis.Options{Addr: sh.Master.Addr, Password: l.RedisPassword(), DialTimeout: time.Second, ReadTimeout: 5 * time.Second, MaxRetries: -1})
		if err := flush(ctx, c); err != nil {
			return fmt.Errorf("%s: %w", sh.Master.Name, err)
		}
	}
	return nil
}

// RedisPassword implements Topology.
func (l *Local) RedisPassword() string { return RedisPassword(l.r.root, cmdline(l.info.RedisPID)) }

// KillNode implements Topology: SIGKILL.
func (l *Local) KillNode(_ context.Context, name string) error {
	info, err := l.readInfo()
	if err != nil {
		return err
	}
	for _, n := range info.RedisNodes {
		if n.Name != name {
			continue
		}
		if !strings.Contains(strings.Join(cmdline(n.PID), " "), "redis-server") {
			return fmt.Errorf("%s: pid %d is not redis-server", name, n.PID)
		}
		if err := syscall.Kill(n.PID, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill %s (pid %d): %w", name, n.PID, err)
		}
		return nil
	}
	return fmt.Errorf("%s: no such data node in stack.json", name)
}

// StartNode implements Topology: the data node started again (wipe:
// without its data), as scripts/local-service.sh start <node> [--wipe]
// does.
func (l *Local) StartNode(ctx context.Context, name string, wipe bool) error {
	return l.startService(ctx, name, wipe)
}

// CutReplication implements Topology. On: the toxiproxy proxy
// replication is pointed at the current master, the replica is pointed at
// the proxy (REPLICAOF) and, once it has caught up through it, the proxy is
// disabled: the replica stops there. Off: the proxy is enabled again. (The
// Sentinels point a replica that replicates from another address back at
// the master, failover-timeout after they notice: a failover must follow
// the cut within that, 5 s.)
func (l *Local) CutReplication(ctx context.Context, on bool) error {
	name := l.info.ReplicationProxy
	if name == "" {
		return fmt.Errorf("stack.json names no replication proxy (topology %q)", l.info.Topology)
	}
	if !on {
		return l.proxyCall(ctx, l.info.ProxyAPI, http.MethodPost, "/proxies/"+name, `{"enabled":true}`, false)
	}
	master, err := SentinelMaster(ctx, l.info)
	if err != nil {
		return err
	}
	var replica Node
	for _, n := range l.info.RedisNodes {
		if n.Name != master.Name {
			replica = n
		}
	}
	if replica.Name == "" {
		return fmt.Errorf("no replica beside %s", master.Name)
	}
	body := fmt.Sprintf(`{"upstream":%q,"enabled":true}`, master.Addr)
	if err := l.proxyCall(ctx, l.info.ProxyAPI, http.MethodPost, "/proxies/"+name, body, false); err != nil {
		return err
	}
	listen, err := l.proxyListen(ctx, name)
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("proxy %s listens on %q: %w", name, listen, err)
	}
	pw := l.RedisPassword()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, Password: pw, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1})
	defer rc.Close()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, Password: pw, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1})
	defer mc.Close()
	if err := rc.ReplicaOf(ctx, host, port).Err(); err != nil {
		return fmt.Errorf("%s: replicaof %s: %w", replica.Name, listen, err)
	}
	err = waitFor(ctx, 10*time.Second, func(ctx context.Context) error {
		m, err := mc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		r, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if infoField(r, "master_port") != port || infoField(r, "master_link_status") != "up" {
			return fmt.Errorf("%s does not replicate through %s yet", replica.Name, listen)
		}
		mo, _ := strconv.ParseInt(infoField(m, "master_repl_offset"), 10, 64)
		ro, _ := strconv.ParseInt(infoField(r, "slave_repl_offset"), 10, 64)
		if ro < mo {
			return fmt.Errorf("%s at offset %d, %s at %d", replica.Name, ro, master.Name, mo)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return l.proxyCall(ctx, l.info.ProxyAPI, http.MethodPost, "/proxies/"+name, `{"enabled":false}`, false)
}

// proxyListen returns the listen address of a toxiproxy proxy.
func (l *Local) proxyListen(ctx context.Context, name string) (string, error) {
	b, err := l.get(ctx, strings.TrimRight(l.info.ProxyAPI, "/")+"/proxies/"+name)
	if err != nil {
		return "", err
	}
	var p struct {
		Listen string `json:"listen"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return "", fmt.Errorf("toxiproxy proxy %s: %w", name, err)
	}
	return p.Listen, nil
}

// infoField returns a field of an INFO reply ("" if absent).
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// flush empties Redis and compacts its AOF, then closes rdb.
func flush(ctx context.Context, rdb *redis.Client) error {
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("redis flushall: %w", err)
	}
	if err := rdb.BgRewriteAOF(ctx).Err(); err != nil {
		return fmt.Errorf("redis bgrewriteaof: %w", err)
	}
	return nil
}

// RedisClient returns a client of the stack's Redis (for the checks after
// settle).
func (l *Local) RedisClient() *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: l.info.RedisAddr, Password: l.RedisPassword(),
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1,
	})
}
