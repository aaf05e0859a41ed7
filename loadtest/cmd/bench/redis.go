package main

// What a row costs Redis, and whether its decisions were all Redis'.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// redisCPU returns the CPU time the Redis process behind c has used so far
// (INFO cpu: used_cpu_user plus used_cpu_sys), in µs; false if it cannot be
// read.
func redisCPU(ctx context.Context, c redis.UniversalClient) (float64, bool) {
	if c == nil {
		return 0, false
	}
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	return cpuOf(info)
}

// cpuOf reads used_cpu_user plus used_cpu_sys from an INFO cpu reply, in
// µs.
func cpuOf(info string) (float64, bool) {
	var us float64
	n := 0
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return 0, false
			}
			us += f * 1e6
			n++
		}
	}
	return us, n == 2
}

// sumMasters returns read summed over the masters of a Redis Cluster;
// false if one cannot be read.
func sumMasters(ctx context.Context, c *redis.ClusterClient, read func(context.Context, redis.UniversalClient) (float64, bool)) (float64, bool) {
	var mu sync.Mutex
	var sum float64
	masters := 0
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		us, ok := read(ctx, m)
		if !ok {
			return errUnreadable
		}
		mu.Lock()
		sum += us
		masters++
		mu.Unlock()
		return nil
	})
	return sum, err == nil && masters > 0
}

var errUnreadable = errors.New("INFO unreadable")

// infoInt returns the integer field name of an INFO reply, and whether it
// was there.
func infoInt(info, name string) (int64, bool) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// source is where a row's decisions are made: the Redis whose CPU they
// cost (redis, or the sum over cluster's masters when set), whether they
// are made in this process, and a count of the decisions made anywhere
// else so far (a local fallback decision, a cached refusal, a failed
// call), or nil when every answered decision is Redis'.
type source struct {
	redis     redis.UniversalClient
	cluster   *redis.ClusterClient
	elsewhere func() int64
	// inProcess: the limiter runs in this process (a library call, not a
	// request to a stack), so the row reports this process' CPU per
	// decision: the limiter's Go side, its Redis client and the measuring
	// loop.
	inProcess bool
	// apps are the pids of a stack's app instances, whose CPU the row
	// reports per request (stackcpu.go).
	apps []int
}

// redisCPU returns the CPU time the source's Redis has used so far, in µs.
func (s source) redisCPU(ctx context.Context) (float64, bool) {
	if s.cluster != nil {
		return sumMasters(ctx, s.cluster, redisCPU)
	}
	return redisCPU(ctx, s.redis)
}
