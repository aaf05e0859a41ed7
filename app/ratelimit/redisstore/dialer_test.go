package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// TestDialerSurvivesDNS: once a name has resolved, a lookup that hangs or
// fails (Docker's DNS while the Redis container restarts) costs at most
// knownHostLookup, and the last address is dialled; a name never resolved
// fails with the lookup's error.
func TestDialerSurvivesDNS(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	_, port, _ := net.SplitHostPort(srv.Addr())

	var mode atomic.Int32 // 0 answers, 1 hangs until the context ends, 2 fails
	lookups := 0
	d := newDialer(time.Second, nil)
	d.lookup = func(ctx context.Context, host string) ([]string, error) {
		lookups++
		switch mode.Load() {
		case 1:
			<-ctx.Done()
			return nil, ctx.Err()
		case 2:
			return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
		}
		return []string{"127.0.0.1"}, nil
	}
	dial := func(host string) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
		if err == nil {
			_ = c.Close()
		}
		return time.Since(start), err
	}

	if _, err := dial("redis"); err != nil {
		t.Fatalf("first dial: %v", err)
	}
	mode.Store(1)
	// Without the memory this dial waits for the lookup until the caller's
	// deadline and fails.
	if _, err := dial("redis"); err != nil {
		t.Fatalf("dial with a hanging lookup: %v", err)
	}
	mode.Store(2)
	if _, err := dial("redis"); err != nil {
		t.Fatalf("dial with a failing lookup: %v", err)
	}
	var dnsErr *net.DNSError
	if _, err := dial("other"); !errors.As(err, &dnsErr) {
		t.Fatalf("dial of a name never resolved: %v, want the lookup's error", err)
	}
	if lookups != 4 {
		t.Errorf("lookups = %d, want 4 (every dial asks)", lookups)
	}
}

// TestRestartedRedisIsDialledAtOnce: after refused dials, more of them than
// the pool's size over outages, the first call once Redis is back reaches
// it. (go-redis fails a pool's dials at once after PoolSize failed ones, and
// dials again only once a second.)
func TestRestartedRedisIsDialledAtOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c, err := NewClient(ClientConfig{Addrs: []string{srv.Addr()}, Timeout: 200 * time.Millisecond, PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := New(c, Config{Timeout: 200 * time.Millisecond})
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for outage := range 3 {
		srv.Kill()
		for range 5 {
			if err := s.Ping(ctx); err == nil {
				t.Fatalf("outage %d: a ping answered with Redis down", outage)
			} else if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("outage %d: ping with Redis down: %v, want the dial's refusal", outage, err)
			}
		}
		srv.Restart(t)
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("outage %d: the first ping after Redis was back: %v", outage, err)
		}
	}
}
