package main

// The cluster rows: our GCRA as deployed on a Redis Cluster and on the
// single Redis, measured in turns, each with the Redis CPU a decision costs
// (on the Cluster, summed over its masters).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// The names of the cluster rows: clusterName's suffix is the Cluster's
// number of masters.
const (
	clusterSingleName = "cluster/gcra-single"
	clusterNamePrefix = "cluster/gcra-"
	clusterNameSuffix = "-masters"
)

// clusterSetup is what clusterRows needs of the run.
type clusterSetup struct {
	addrs    []string // the Cluster's nodes
	pool     int
	coalesce int
	logger   *slog.Logger
	// single is the ours/* rows' limiter on the single Redis, singleSrc
	// their source.
	single    *resilient.Limiter
	singleSrc source
	levels    []int
	add       func(name string, g int, d decider, src source)
}

// clusterRows adds, at each concurrency, a row of our GCRA on the single
// Redis and one on the Cluster: the resilient layer over redisstore on a
// Cluster client with the ours/* rows' settings. It returns what closes
// the Cluster's limiter and client.
func clusterRows(ctx context.Context, s clusterSetup) (func(), error) {
	cc := redisstore.ClientConfig{Addrs: s.addrs, Cluster: true, Timeout: 50 * time.Millisecond, PoolSize: s.pool}
	uc, err := redisstore.NewClient(cc)
	if err != nil {
		return nil, err
	}
	client, ok := uc.(*redis.ClusterClient)
	if !ok {
		uc.Close()
		return nil, errors.New("-cluster: no Cluster client")
	}
	var masters atomic.Int64
	err = client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		return m.Ping(ctx).Err()
	})
	if err == nil && masters.Load() == 0 {
		err = errors.New("no masters")
	}
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("-cluster %s: %w", strings.Join(s.addrs, ","), err)
	}
	rs := redisstore.New(client, redisstore.Config{Timeout: 50 * time.Millisecond, Coalescing: s.coalesce})
	lim, err := resilient.New(rs, resilient.Config{Instance: "bench-cluster", Logger: s.logger})
	if err != nil {
		client.Close()
		return nil, err
	}
	stop := func() {
		_ = lim.Close(context.Background())
		client.Close()
	}
	src := source{redis: client, cluster: client, inProcess: true,
		elsewhere: func() int64 {
			st := lim.Status()
			return int64(st.LocalDecisions + st.CachedRefusals)
		}}
	p := ratelimit.Policy{Name: "bench-" + string(ratelimit.GCRA), Algorithm: ratelimit.GCRA, Limit: limit, Window: time.Second}
	decide := func(l *resilient.Limiter) decider {
		return func(ctx context.Context, key string) error {
			_, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
			return err
		}
	}
	name := fmt.Sprintf("%s%d%s", clusterNamePrefix, masters.Load(), clusterNameSuffix)
	for _, g := range s.levels {
		s.add(clusterSingleName, g, decide(s.single), s.singleSrc)
		s.add(name, g, decide(lim), src)
	}
	return stop, nil
}

// clusterRatios compares, at each concurrency, the decisions per Redis
// CPU-second on the Cluster (summed over its masters) with those on the
// single Redis.
func clusterRatios(res *Results) {
	for _, r := range res.Rows {
		if !strings.HasPrefix(r.Name, clusterNamePrefix) || !strings.HasSuffix(r.Name, clusterNameSuffix) || r.NotInRedis > 0 || r.RedisCPUus <= 0 {
			continue
		}
		if one := find(*res, clusterSingleName, r.Goroutines); one != nil && one.RedisCPUus > 0 {
			res.Ratios[fmt.Sprintf("cluster_vs_single_decisions_per_redis_cpu_s_at_%d", r.Goroutines)] = round(one.RedisCPUus/r.RedisCPUus*100) / 100
		}
	}
}
