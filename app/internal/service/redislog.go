package service

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// redisLogger is go-redis' logger (redis.SetLogger) as slog lines at warn
// level, so that the service's log stays one JSON document per line: left
// alone, go-redis writes plain "redis: <date> sentinel.go:1069: ...
// failed" lines to stderr. During an outage it repeats the same line for
// every failed call; the breaker's transition lines already say Redis is
// out, so each message format is logged at most once per interval, with the
// number of lines held back since ("suppressed"). The formats are go-redis'
// own constants, so the map stays small; it is cleared should it ever hold
// maxRedisFormats of them. Safe for concurrent use. TestRedisLogIsJSON
// guards it.
type redisLogger struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	last map[string]*redisLine // by format
}

type redisLine struct {
	at         time.Time
	suppressed int
}

const maxRedisFormats = 256

func newRedisLogger(log *slog.Logger, interval time.Duration, now func() time.Time) *redisLogger {
	return &redisLogger{log: log, interval: interval, now: now, last: map[string]*redisLine{}}
}

// Printf implements go-redis' internal.Logging.
func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	now := l.now()
	l.mu.Lock()
	line := l.last[format]
	if line != nil && now.Sub(line.at) < l.interval {
		line.suppressed++
		l.mu.Unlock()
		return
	}
	if line == nil {
		if len(l.last) >= maxRedisFormats {
			clear(l.last)
		}
		line = &redisLine{}
		l.last[format] = line
	}
	suppressed := line.suppressed
	line.at, line.suppressed = now, 0
	l.mu.Unlock()

	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	attrs := []slog.Attr{slog.String("component", "go-redis"), slog.String("detail", msg)}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	l.log.LogAttrs(ctx, slog.LevelWarn, "redis client", attrs...)
}
