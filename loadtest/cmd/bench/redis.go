package main

// What a row costs Redis, and whether its decisions were all Redis'.

import (
	"context"
	"strconv"
	"strings"

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

// source is where a row's decisions are made: the Redis whose CPU they
// cost, and a count of the decisions made anywhere else so far (a local
// fallback decision, a cached refusal, a failed call), or nil when every
// answered decision is Redis'.
type source struct {
	redis     redis.UniversalClient
	elsewhere func() int64
}
