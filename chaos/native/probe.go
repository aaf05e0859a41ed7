package native

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Readiness: each service's probe, and the waits for the Redis topologies
// to settle.

// pollInterval is the pause between two rounds of probes.
const pollInterval = 200 * time.Millisecond

// probeTimeout bounds one probe.
const probeTimeout = 2 * time.Second

// redisClient is a client of data node name (with the password) or, for a
// Sentinel, of the Sentinel (none: the Sentinels have no password). Close
// it after use.
func (st *Stack) redisClient(name string) *redis.Client {
	o := &redis.Options{
		Addr: st.s.addr(name), Protocol: 2, DisableIdentity: true,
		DialTimeout: probeTimeout, ReadTimeout: probeTimeout, WriteTimeout: probeTimeout,
		MaxRetries: -1, PoolSize: 1,
	}
	if !strings.HasPrefix(name, "sentinel") {
		o.Password = st.s.RedisPassword
	}
	return redis.NewClient(o)
}

// do runs one command against data node or Sentinel name.
func (st *Stack) do(ctx context.Context, name string, args ...any) (any, error) {
	c := st.redisClient(name)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// info runs INFO section (or CLUSTER INFO) on data node name.
func (st *Stack) info(ctx context.Context, name string, args ...any) (string, error) {
	v, err := st.do(ctx, name, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: %v: reply %T", name, args, v)
	}
	return s, nil
}

// infoField returns the value of field:value in INFO (or CLUSTER INFO)
// output, "" when absent.
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), field+":"); ok {
			return v
		}
	}
	return ""
}

// probe returns nil when service name answers as a ready one does.
func (st *Stack) probe(ctx context.Context, name string) error {
	s := st.s
	switch {
	case strings.HasPrefix(name, "redis"), strings.HasPrefix(name, "sentinel"):
		v, err := st.do(ctx, name, "ping")
		if err != nil {
			return err
		}
		if v != "PONG" {
			return fmt.Errorf("PING: %v", v)
		}
		return nil
	case name == "toxiproxy":
		return st.httpOK(ctx, s.url(s.ProxyAPIPort)+"/version")
	case strings.HasPrefix(name, "app"):
		return st.httpOK(ctx, s.AdminURL(name)+"/readyz")
	case name == "nginx":
		return st.httpOK(ctx, s.url(s.NginxPort)+"/healthz")
	case name == "static":
		return st.httpOK(ctx, s.url(s.StaticPort)+"/healthz")
	case name == "prometheus":
		return st.httpOK(ctx, s.url(s.PrometheusPort)+"/-/ready")
	}
	return fmt.Errorf("no probe for %s", name)
}

// httpClient is the probes' and the toxiproxy API's: no proxy from the
// environment, no idle connections left behind.
var httpClient = &http.Client{
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
}

// httpOK GETs url and wants a status below 400.
func (st *Stack) httpOK(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// sleep waits d, or returns why ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// waitReady waits until every name answers its probe, failing fast when
// one of them exits, and at deadline.
func (st *Stack) waitReady(ctx context.Context, deadline time.Time, names ...string) error {
	pending := names
	for len(pending) > 0 {
		var still []string
		for _, name := range pending {
			if st.probe(ctx, name) == nil {
				st.logf("  %s ready", name)
			} else if ServicePID(st.s.RunDir, name) == 0 {
				return fmt.Errorf("%s exited during startup", name)
			} else {
				still = append(still, name)
			}
		}
		pending = still
		if len(pending) == 0 {
			break
		}
		if !st.now().Before(deadline) {
			return fmt.Errorf("not ready within %v: %s", st.s.ReadyTimeout, strings.Join(pending, " "))
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return err
		}
	}
	return nil
}

// waitUntil runs check until it returns nil, failing when deadline passes
// or a started data node or Sentinel exits. check's error says what it
// still waits for, which the failure shows.
func (st *Stack) waitUntil(ctx context.Context, deadline time.Time, what string, check func(context.Context) error) error {
	for {
		waiting := check(ctx)
		if waiting == nil {
			st.logf("  %s", what)
			return nil
		}
		for _, n := range append(st.s.RedisNodes(), st.s.Sentinels()...) {
			if _, err := os.Stat(pidFile(st.s.RunDir, n)); err == nil && ServicePID(st.s.RunDir, n) == 0 {
				return fmt.Errorf("%s exited (waiting for: %s)", n, what)
			}
		}
		if !st.now().Before(deadline) {
			return fmt.Errorf("not within %v: %s (%v)", st.s.ReadyTimeout, what, waiting)
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return err
		}
	}
}

// checkReplication (sentinel topology): the replica (the second data
// node) replicates from the master (the first) with its link up, and the
// master lists it, at its own address, as online.
func (st *Stack) checkReplication(ctx context.Context) error {
	nodes := st.s.RedisNodes()
	master, replica := nodes[0], nodes[1]
	info, err := st.info(ctx, replica, "info", "replication")
	if err != nil {
		return fmt.Errorf("%s does not answer", replica)
	}
	if infoField(info, "role") != "slave" {
		return fmt.Errorf("%s is not a replica", replica)
	}
	if v := infoField(info, "master_link_status"); v != "up" {
		return fmt.Errorf("%s: master_link_status:%s", replica, v)
	}
	if info, err = st.info(ctx, master, "info", "replication"); err != nil {
		return fmt.Errorf("%s does not answer", master)
	}
	port := st.s.redisPort(replica)
	online := regexp.MustCompile(`(?m)^slave[0-9]+:ip=` + regexp.QuoteMeta(st.s.Host) + `,port=` + strconv.Itoa(port) + `,state=online,`)
	if !online.MatchString(info) {
		return fmt.Errorf("%s does not list %s as an online replica", master, st.s.hostPort(port))
	}
	return nil
}

// checkSentinels (sentinel topology): every Sentinel lists the replica
// (flags exactly "slave") and knows the other Sentinels. (A Sentinel reads
// the master's INFO, and so learns the replica, when it connects and then
// every 10 s: start the Sentinels once the replica is attached.)
func (st *Stack) checkSentinels(ctx context.Context) error {
	sentinels := st.s.Sentinels()
	replica := st.s.RedisNodes()[1]
	port := strconv.Itoa(st.s.redisPort(replica))
	for _, s := range sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: st.s.addr(s), Protocol: 2, DisableIdentity: true,
			DialTimeout: probeTimeout, ReadTimeout: probeTimeout, MaxRetries: -1, PoolSize: 1})
		cctx, cancel := context.WithTimeout(ctx, 2*probeTimeout)
		peers, _ := sc.Sentinels(cctx, MasterName).Result()
		replicas, _ := sc.Replicas(cctx, MasterName).Result()
		cancel()
		sc.Close()
		if want := len(sentinels) - 1; len(peers) != want {
			return fmt.Errorf("%s knows %d other Sentinels, want %d", s, len(peers), want)
		}
		found := false
		for _, r := range replicas {
			if r["port"] == port && r["flags"] == "slave" {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%s does not list %s as a replica of %s", s, replica, MasterName)
		}
	}
	return nil
}

// The cluster's states at Up (clusterState).
const (
	clusterNew    = "new"    // no node knows another one or has a slot: to be created
	clusterExists = "exists" // every node knows others
	clusterMixed  = "mixed"  // some of each
)

func (st *Stack) clusterState(ctx context.Context) (string, error) {
	fresh, old := 0, 0
	for _, n := range st.s.RedisNodes() {
		info, err := st.info(ctx, n, "cluster", "info")
		if err != nil {
			return "", fmt.Errorf("CLUSTER INFO failed on %s: %w", n, err)
		}
		if infoField(info, "cluster_known_nodes") == "1" && infoField(info, "cluster_slots_assigned") == "0" {
			fresh++
		} else {
			old++
		}
	}
	switch {
	case old == 0:
		return clusterNew, nil
	case fresh == 0:
		return clusterExists, nil
	}
	return clusterMixed, nil
}

// createCluster runs redis-cli --cluster create, 3 masters and a replica
// each, until deadline; its output goes to <run>/cluster-create.log.
func (st *Stack) createCluster(ctx context.Context, deadline time.Time) error {
	var addrs []string
	for _, n := range st.s.RedisNodes() {
		addrs = append(addrs, st.s.addr(n))
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")
	logf, err := os.OpenFile(filepath.Join(st.s.RunDir, "cluster-create.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== %s  redis-cli %s\n", st.now().UTC().Format("2006-01-02T15:04:05Z"), strings.Join(args, " "))
	ctx, cancel := context.WithTimeout(ctx, max(time.Until(deadline), time.Second))
	defer cancel()
	cmd := exec.CommandContext(ctx, st.tools.redisCLI, args...)
	// The password through REDISCLI_AUTH, off the command line.
	cmd.Env = command{env: []string{"REDISCLI_AUTH=" + st.s.RedisPassword}}.environ()
	cmd.Stdout, cmd.Stderr = logf, logf
	return cmd.Run()
}

// replicaLine is a master's INFO replication line about a replica.
var replicaLine = regexp.MustCompile(`^slave[0-9]+:`)

// checkCluster (cluster topology): every node says cluster_state:ok,
// knows every node and sees all slots served; every replica's link to its
// master is up and every master has an online replica.
func (st *Stack) checkCluster(ctx context.Context) error {
	nodes := st.s.RedisNodes()
	for _, n := range nodes {
		info, err := st.info(ctx, n, "cluster", "info")
		if err != nil {
			return fmt.Errorf("%s does not answer", n)
		}
		if v := infoField(info, "cluster_state"); v != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", n, v)
		}
		if v := infoField(info, "cluster_known_nodes"); v != strconv.Itoa(len(nodes)) {
			return fmt.Errorf("%s: cluster_known_nodes:%s", n, v)
		}
		if v := infoField(info, "cluster_slots_ok"); v != "16384" {
			return fmt.Errorf("%s: cluster_slots_ok:%s", n, v)
		}
		if info, err = st.info(ctx, n, "info", "replication"); err != nil {
			return fmt.Errorf("%s does not answer", n)
		}
		if infoField(info, "role") == "slave" {
			if v := infoField(info, "master_link_status"); v != "up" {
				return fmt.Errorf("%s (replica): master_link_status:%s", n, v)
			}
			continue
		}
		if v, _ := strconv.Atoi(infoField(info, "connected_slaves")); v < 1 {
			return fmt.Errorf("%s (master): no replica", n)
		}
		for line := range strings.SplitSeq(info, "\n") {
			if replicaLine.MatchString(line) && !strings.Contains(line, "state=online") {
				return fmt.Errorf("%s (master): a replica is not online yet", n)
			}
		}
	}
	return nil
}

// populateProxies creates the topology's proxies through toxiproxy's API
// (or leaves them as they are, if they exist).
func (st *Stack) populateProxies(ctx context.Context) error {
	proxies := st.s.proxies()
	if len(proxies) == 0 {
		return nil
	}
	body, err := json.Marshal(proxies)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.s.url(st.s.ProxyAPIPort)+"/populate", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 400 {
		return errors.New("POST /populate: " + resp.Status)
	}
	return nil
}
