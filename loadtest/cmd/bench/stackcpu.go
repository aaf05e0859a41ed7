package main

// The stack rows' costs beside the rate: the apps' CPU per request, from
// /proc/<pid>/stat, and the requests per read event of the stack's Redis
// (INFO stats total_reads_processed), which counts its round trips.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// userHZ is the unit of /proc/<pid>/stat's CPU times on Linux (USER_HZ,
// 100 on every architecture Go runs on).
const userHZ = 100

// procCPU returns the CPU time (user plus system) the processes pids have
// used so far, in µs; false if one cannot be read (not Linux, or gone).
func procCPU(pids []int) (float64, bool) {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		// The command name, field 2, is in parentheses and may hold
		// spaces: the fields after it start past the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			return 0, false
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			return 0, false
		}
		// utime and stime are fields 14 and 15: 12 and 13 after ')'.
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		s, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, false
		}
		ticks += u + s
	}
	return float64(ticks) * 1e6 / userHZ, len(pids) > 0
}

// redisReads returns the read events c's Redis has processed so far (one
// per round trip of a client, or more for a large pipeline).
func redisReads(ctx context.Context, c redis.UniversalClient) (int64, bool) {
	info, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, false
	}
	return infoInt(info, "total_reads_processed")
}

// parsePids reads -stack-pids: pids, comma separated.
func parsePids(s string) ([]int, error) {
	var pids []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pid, err := strconv.Atoi(f)
		if err != nil || pid < 1 {
			return nil, fmt.Errorf("-stack-pids: %q is not a pid", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
