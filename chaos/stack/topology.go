package stack

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scale-out topologies: a stack started with Up(ctx, "sentinel") runs a
// master, a replica and three Sentinels; with Up(ctx, "cluster"), a Redis
// Cluster of three masters with a replica each. Their faults act on one
// data node at a time.

// Topology is a stack that can run the scale-out topologies and inject
// their faults.
type Topology interface {
	// KillNode SIGKILLs the Redis data node name (one of Info.RedisNodes).
	KillNode(ctx context.Context, name string) error
	// StartNode starts a killed data node again, with its data or (wipe)
	// without (a Cluster node keeps its node id and slots), and returns
	// once it answers.
	StartNode(ctx context.Context, name string, wipe bool) error
	// CutReplication stops (on) or lets resume the Sentinel topology's
	// replica's replication from its first master, so that the replica
	// falls behind.
	CutReplication(ctx context.Context, on bool) error
	// RedisPassword is the data nodes' password.
	RedisPassword() string
}

// The needs (Stack.Up) that start each topology.
const (
	NeedsSentinel = "sentinel"
	NeedsCluster  = "cluster"
)

// The needs (Stack.Up) of the faults that need a fault proxy between the
// apps and Redis: the native stack puts one there only for them.
const (
	NeedsLatency   = "latency"
	NeedsPartition = "partition"
	// NeedsResetPartition is reset-partition's: the proxy of a partition,
	// and each app's own URL, to which the scenario sends its reset keys'
	// requests (the compose stack publishes no app port).
	NeedsResetPartition = "reset-partition"
)

// NeedsReload (Stack.Up) gives each app a policy file and a rate limit
// service configuration of its own, so that a change reaches the instances
// one at a time (Stack.SetPolicies, Stack.SetRLSConfig).
const NeedsReload = "reload"

// nodeAt returns the data node listening on addr.
func nodeAt(info Info, addr string) (Node, error) {
	for _, n := range info.RedisNodes {
		if n.Addr == addr {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("no data node at %s (nodes: %v)", addr, info.RedisNodes)
}

// SentinelMaster returns the data node that the first Sentinel to answer
// names as master.
func SentinelMaster(ctx context.Context, info Info) (Node, error) {
	var last error
	for _, s := range info.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
		addr, err := sc.GetMasterAddrByName(ctx, info.MasterName).Result()
		sc.Close()
		if err != nil {
			last = fmt.Errorf("sentinel %s: %w", s.Addr, err)
			continue
		}
		if len(addr) != 2 {
			last = fmt.Errorf("sentinel %s: master address %v", s.Addr, addr)
			continue
		}
		return nodeAt(info, net.JoinHostPort(addr[0], addr[1]))
	}
	if last == nil {
		last = fmt.Errorf("no Sentinel in the stack")
	}
	return Node{}, last
}

// WaitSentinelMaster polls until every Sentinel names a master other than
// old, and returns it.
func WaitSentinelMaster(ctx context.Context, info Info, old Node, d time.Duration) (Node, error) {
	var got Node
	err := waitFor(ctx, d, func(ctx context.Context) error {
		for _, s := range info.Sentinels {
			one := info
			one.Sentinels = []Node{s}
			m, err := SentinelMaster(ctx, one)
			if err != nil {
				return err
			}
			if m.Name == old.Name {
				return fmt.Errorf("sentinel %s still names %s", s.Addr, old.Name)
			}
			got = m
		}
		return nil
	})
	return got, err
}

// ClusterShard is one master of a Cluster with the slot ranges it serves.
type ClusterShard struct {
	Master Node
	Slots  [][2]int64
}

// Serves reports whether the shard serves slot.
func (s ClusterShard) Serves(slot int64) bool {
	return slices.ContainsFunc(s.Slots, func(r [2]int64) bool { return slot >= r[0] && slot <= r[1] })
}

// ClusterShards returns the Cluster's masters and their slots, as the
// first data node that answers (other than skip) sees them.
func ClusterShards(ctx context.Context, info Info, password string, skip ...string) ([]ClusterShard, error) {
	var last error
	for _, n := range info.RedisNodes {
		if slices.Contains(skip, n.Name) {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: n.Addr, Password: password, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
		shards, err := c.ClusterShards(ctx).Result()
		c.Close()
		if err != nil {
			last = fmt.Errorf("%s: cluster shards: %w", n.Name, err)
			continue
		}
		var out []ClusterShard
		for _, sh := range shards {
			var master *redis.Node
			for i, nd := range sh.Nodes {
				if nd.Role == "master" && nd.Health == "online" {
					master = &sh.Nodes[i]
				}
			}
			if master == nil || len(sh.Slots) == 0 {
				continue
			}
			node, err := nodeAt(info, net.JoinHostPort(master.IP, fmt.Sprint(master.Port)))
			if err != nil {
				return nil, err
			}
			cs := ClusterShard{Master: node}
			for _, r := range sh.Slots {
				cs.Slots = append(cs.Slots, [2]int64{r.Start, r.End})
			}
			out = append(out, cs)
		}
		return out, nil
	}
	if last == nil {
		last = fmt.Errorf("no data node in the stack")
	}
	return nil, last
}

// KeySlot returns the Cluster slot of key, as a data node computes it.
func KeySlot(ctx context.Context, info Info, password, key string) (int64, error) {
	var last error
	for _, n := range info.RedisNodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr, Password: password, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
		slot, err := c.ClusterKeySlot(ctx, key).Result()
		c.Close()
		if err == nil {
			return slot, nil
		}
		last = err
	}
	return 0, fmt.Errorf("cluster keyslot %s: %w", key, last)
}
