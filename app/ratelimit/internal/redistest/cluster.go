package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterSlots is the number of hash slots of a Redis Cluster.
	clusterSlots = 16384
	// clusterTimeout bounds cluster creation and WaitHealthy.
	clusterTimeout = 60 * time.Second
)

// Cluster is a Redis Cluster of three masters without replicas, started by
// StartCluster or StartClusterTLS; the zero value is not usable. Its methods are safe for concurrent use; WaitHealthy must be
// called from the test's goroutine.
type Cluster struct {
	nodes []*Server
	tls   *TLSOptions // nil: plaintext

	mu    sync.Mutex
	owner [clusterSlots]int8 // index in nodes of each slot's master, from WaitHealthy

	clientOnce sync.Once
	client     *redis.ClusterClient
}

// StartCluster starts three cluster-enabled redis-server processes
// (--cluster-enabled yes --cluster-config-file nodes.conf
// --cluster-node-timeout 2000), joins them with
// `redis-cli --cluster create ... --cluster-yes`, and returns once every node
// reports cluster_state:ok and a key can be written and read on each master.
// Everything is stopped in t.Cleanup. Kill or Stop a node to make the cluster
// fail (there are no replicas to take over); after Restart, WaitHealthy waits
// for it to recover.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, nil)
}

// StartClusterTLS is StartCluster with every node speaking TLS only, with
// certs (TLSOptions{Certs: certs}: a client certificate is required), the
// cluster bus included (--tls-cluster yes). The nodes announce their TLS
// ports, so a TLS cluster client finds every node; ClusterOptions and
// Client carry certs.ClientTLS.
func StartClusterTLS(t testing.TB, certs *Certificates) *Cluster {
	t.Helper()
	return startCluster(t, &TLSOptions{Certs: certs})
}

// startCluster starts a cluster, plaintext or with tlsOpts.
func startCluster(t testing.TB, tlsOpts *TLSOptions) *Cluster {
	t.Helper()
	cli := Require(t, "redis-cli")
	c := &Cluster{tls: tlsOpts}
	for range 3 {
		c.nodes = append(c.nodes, startServer(t, serverSpec{
			clusterBus: true,
			opts: ServerOptions{
				Args: []string{
					"--cluster-enabled", "yes",
					"--cluster-config-file", "nodes.conf",
					"--cluster-node-timeout", "2000",
				},
				TLS: tlsOpts,
			},
		}))
	}
	t.Cleanup(func() {
		c.clientOnce.Do(func() {}) // no client can be created from now on
		if c.client != nil {
			c.client.Close()
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	var args []string
	if tlsOpts != nil {
		args = tlsOpts.cliArgs()
	}
	args = append(append(append(args, "--cluster", "create"), c.Addrs()...), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(t)
	return c
}

// Nodes returns the three master nodes, in the order of Addrs.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// Addrs returns the addresses of the nodes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// ClusterOptions returns fresh go-redis cluster options for the cluster, for
// tests that need a client with their own timeouts. The caller closes the
// clients it makes.
func (c *Cluster) ClusterOptions() *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: c.Addrs(), TLSConfig: c.nodes[0].ClientTLS(), DisableIdentity: true}
}

// Client returns a go-redis cluster client with default options. It is the
// same client on every call and is closed in t.Cleanup.
func (c *Cluster) Client() *redis.ClusterClient {
	c.clientOnce.Do(func() { c.client = redis.NewClusterClient(c.ClusterOptions()) })
	return c.client
}

// MasterFor returns the node that serves key's hash slot, according to the
// slot map read by the last WaitHealthy (slots do not move unless a test
// reshards), or nil if no node serves it.
func (c *Cluster) MasterFor(key string) *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.owner[keySlot(key)]
	if i < 0 {
		return nil
	}
	return c.nodes[i]
}

// WaitHealthy polls until every node reports cluster_state:ok with all slots
// assigned and agrees on the slot map, and a fresh cluster client can SET and
// GET a key on every master. It fails the test after 60 s. StartCluster calls
// it; call it again after restarting a node.
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	err := pollFor(clusterTimeout, func(ctx context.Context) error {
		owner, err := c.readSlots(ctx)
		if err != nil {
			return err
		}
		if err := c.probeMasters(ctx, &owner); err != nil {
			return err
		}
		c.mu.Lock()
		c.owner = owner
		c.mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: cluster %v not healthy: %v", c.Addrs(), err)
	}
}

// readSlots checks that every node reports a healthy cluster and that all
// nodes agree on which node serves each slot, and returns that map.
func (c *Cluster) readSlots(ctx context.Context) ([clusterSlots]int8, error) {
	var owner [clusterSlots]int8
	for i, n := range c.nodes {
		nc := redis.NewClient(n.probeOptions())
		info, err := nc.ClusterInfo(ctx).Result()
		var shards []redis.ClusterShard
		if err == nil {
			shards, err = nc.ClusterShards(ctx).Result()
		}
		nc.Close()
		if err != nil {
			return owner, fmt.Errorf("node %s: %w", n.Addr(), err)
		}
		if st := infoField(info, "cluster_state"); st != "ok" {
			return owner, fmt.Errorf("node %s: cluster_state:%s", n.Addr(), st)
		}
		var view [clusterSlots]int8
		for s := range view {
			view[s] = -1
		}
		for _, sh := range shards {
			master := ""
			for _, node := range sh.Nodes {
				port := node.Port
				if c.tls != nil {
					port = node.TLSPort // Port is 0: there is no plaintext port
				}
				if node.Role == "master" {
					master = net.JoinHostPort(node.IP, strconv.FormatInt(port, 10))
				}
			}
			if master == "" {
				continue
			}
			m := c.nodeIndex(master)
			for _, r := range sh.Slots {
				if m < 0 {
					return owner, fmt.Errorf("node %s: slots %d-%d served by unknown node %s", n.Addr(), r.Start, r.End, master)
				}
				for s := r.Start; s <= r.End && s < clusterSlots; s++ {
					view[s] = int8(m)
				}
			}
		}
		for s, m := range view {
			if m < 0 {
				return owner, fmt.Errorf("node %s: slot %d not served", n.Addr(), s)
			}
		}
		if i > 0 && view != owner {
			return owner, fmt.Errorf("nodes %s and %s disagree on the slot map", c.nodes[0].Addr(), n.Addr())
		}
		owner = view
	}
	return owner, nil
}

// probeMasters writes and reads back, through a fresh cluster client, a key
// served by each node, and checks that the key landed on that node.
func (c *Cluster) probeMasters(ctx context.Context, owner *[clusterSlots]int8) error {
	opts := c.ClusterOptions()
	opts.MaxRetries = 2
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
	cc := redis.NewClusterClient(opts)
	defer cc.Close()
	for i, n := range c.nodes {
		key := keyServedBy(owner, i)
		if key == "" {
			return fmt.Errorf("node %s serves no slot", n.Addr())
		}
		if err := cc.Set(ctx, key, n.Addr(), time.Minute).Err(); err != nil {
			return fmt.Errorf("set %s via cluster client: %w", key, err)
		}
		if got, err := cc.Get(ctx, key).Result(); err != nil || got != n.Addr() {
			return fmt.Errorf("get %s via cluster client: %q, %v", key, got, err)
		}
		nc := redis.NewClient(n.probeOptions())
		got, err := nc.Get(ctx, key).Result()
		if err == nil {
			err = nc.Del(ctx, key).Err()
		}
		nc.Close()
		if err != nil || got != n.Addr() {
			return fmt.Errorf("get %s on node %s: %q, %v", key, n.Addr(), got, err)
		}
	}
	return nil
}

// nodeIndex returns the index of the node with the port of addr, or -1.
func (c *Cluster) nodeIndex(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return -1
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return -1
	}
	for i, n := range c.nodes {
		if n.port == port {
			return i
		}
	}
	return -1
}

// keyServedBy returns a key whose slot is served by node i, or "" if none.
func keyServedBy(owner *[clusterSlots]int8, i int) string {
	for n := range 100 * clusterSlots {
		key := "redistest:probe:" + strconv.Itoa(n)
		if owner[keySlot(key)] == int8(i) {
			return key
		}
	}
	return ""
}

// keySlot returns the cluster hash slot of key: CRC16 (XMODEM) of the key, or
// of its hash tag (the part between the first '{' and the next '}', when not
// empty), modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % clusterSlots
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := range len(s) {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
