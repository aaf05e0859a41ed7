package service

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// minRedisMajor is the oldest Redis the store runs on: its decisions are
// Redis functions (FUNCTION LOAD, FCALL), new in 7.0.
const minRedisMajor = 7

// redisVersion reads redis_version from the text of INFO server: its
// major and minor numbers and the version as written, ok false when the
// field is missing or not a version.
func redisVersion(info string) (major, minor int, version string, ok bool) {
	for line := range strings.Lines(info) {
		v, found := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !found {
			continue
		}
		parts := strings.SplitN(v, ".", 3)
		if len(parts) < 2 {
			return 0, 0, v, false
		}
		maj, err1 := strconv.Atoi(parts[0])
		min, err2 := strconv.Atoi(parts[1])
		if err1 != nil || err2 != nil {
			return 0, 0, v, false
		}
		return maj, min, v, true
	}
	return 0, 0, "", false
}

// checkRedisVersion asks one node of client for its version (INFO
// server), within ctx, and returns a *ConfigError naming the Redis
// setting when it is older than Redis 7.0. A Redis that does not answer
// (or answers without a version) is logged and let through: the fallback
// serves until it comes, and a node that lacks functions then fails each
// call as unavailable.
func checkRedisVersion(ctx context.Context, cfg Config, client redis.UniversalClient, log *slog.Logger) error {
	info, err := client.Info(ctx, "server").Result()
	if err != nil {
		log.Warn("Redis not reached to check its version at start; the fallback serves until it answers",
			slog.String("error", err.Error()))
		return nil
	}
	major, _, version, ok := redisVersion(info)
	if !ok {
		log.Warn("Redis did not give its version at start", slog.String("redis_version", version))
		return nil
	}
	if major < minRedisMajor {
		name := "RL_REDIS_ADDRS"
		if cfg.RedisURL != "" {
			name = "RL_REDIS_URL"
		}
		return configErr(name, "Redis %s is too old: fleetlimit needs Redis %d.0 or later (functions)", version, minRedisMajor)
	}
	return nil
}
