package main

// The ceiling rows: redis-benchmark calling our GCRA decision function.

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// sumCeiling sums up slices of one ceiling row, each of the same number of
// calls: their rate over the slices' total time (the harmonic mean of
// the slices' rates), the median slice's p50 and p99 (redis-benchmark
// reports no latencies to merge), and the mean of their Redis CPU per call.
func sumCeiling(sl []Row) Row {
	var secsPerCall, cpu float64
	p50s, p99s := make([]float64, len(sl)), make([]float64, len(sl))
	for i, r := range sl {
		secsPerCall += 1 / r.DecisionsPerS
		cpu += r.RedisCPUus
		p50s[i], p99s[i] = r.P50us, r.P99us
	}
	slices.Sort(p50s)
	slices.Sort(p99s)
	row := sl[0]
	row.DecisionsPerS, row.P50us, row.P99us = round(float64(len(sl))/secsPerCall), p50s[len(sl)/2], p99s[len(sl)/2]
	row.RedisCPUus = round(cpu / float64(len(sl)))
	fmt.Fprintf(display, "%-28s %4d connections %9.0f/s  p50 %7.1f µs  p99 %8.1f µs%s (%d slices)\n", row.Name, row.Goroutines, row.DecisionsPerS, row.P50us, row.P99us, row.suffix(), len(sl))
	return row
}

// ceiling runs redis-benchmark against our GCRA decision function by
// FCALL, as redisstore calls it.
func ceiling(ctx context.Context, client redis.UniversalClient, addr string, depth, keys, n int) (Row, error) {
	code, fn := redisstore.Library(ratelimit.GCRA)
	if err := client.FunctionLoadReplace(ctx, code).Err(); err != nil {
		return Row{}, err
	}
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return Row{}, fmt.Errorf("-redis %q: want host:port", addr)
	}
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return Row{}, errors.New("redis-benchmark not found (apt-get install redis-server)")
	}
	const conns = 64
	// ARGV as redisstore sends them (lua/decide.lua): now override (0:
	// Redis TIME), limit, window µs, capacity, cost, request id, weight.
	args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(conns), "-P", strconv.Itoa(depth), "-n", strconv.Itoa(n),
		"-r", strconv.Itoa(keys), "--csv", "FCALL", fn, "1", "{rl:AA}ceilingX__rand_int__",
		"0", strconv.Itoa(limit), "1000000", strconv.Itoa(limit), "1", "", "1", "1"}
	cpu0, ok0 := redisCPU(ctx, client)
	outp, err := exec.CommandContext(ctx, bin, args...).Output()
	cpu1, ok1 := redisCPU(ctx, client)
	if err != nil {
		return Row{}, fmt.Errorf("redis-benchmark: %w", err)
	}
	recs, err := csv.NewReader(strings.NewReader(string(outp))).ReadAll()
	if err != nil || len(recs) < 2 {
		return Row{}, fmt.Errorf("redis-benchmark output %q: %v", outp, err)
	}
	col := func(name string) float64 {
		i := slices.Index(recs[0], name)
		if i < 0 || i >= len(recs[1]) {
			return 0
		}
		v, _ := strconv.ParseFloat(recs[1][i], 64)
		return v
	}
	row := Row{Name: "ceiling/redis-benchmark-P" + strconv.Itoa(depth), Goroutines: conns,
		DecisionsPerS: round(col("rps")), P50us: round(col("p50_latency_ms") * 1000), P99us: round(col("p99_latency_ms") * 1000)}
	if ok0 && ok1 && n > 0 {
		row.RedisCPUus = round((cpu1 - cpu0) / float64(n))
	}
	fmt.Fprintf(display, "%-28s %4d connections %9.0f/s  p50 %7.1f µs  p99 %8.1f µs%s\n", row.Name, conns, row.DecisionsPerS, row.P50us, row.P99us, row.suffix())
	return row, nil
}
