package redisstore

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"syscall"
	"time"
)

// knownHostLookup bounds a name lookup for a host that has resolved
// before. Past it, the last address is dialled.
const knownHostLookup = 50 * time.Millisecond

// dialer dials Redis by name and remembers the last address each name
// resolved to. When Redis restarts in a container, Docker's DNS forgets
// its name while it is down and may answer slowly or not at all for a
// while after: without a memory, every reconnect waits for that lookup, up
// to the dial timeout (TestDialerSurvivesDNS). With one, a lookup of a
// known name gets knownHostLookup, and the last address is tried when the
// lookup fails or is slow. A name that moved resolves anew at the next dial.
type dialer struct {
	net    net.Dialer
	lookup func(ctx context.Context, host string) ([]string, error)
	tls    *tls.Config

	mu   sync.Mutex
	last map[string]string // host → last IP it resolved to (bounded by the configured hosts)
}

func newDialer(timeout time.Duration, tlsConfig *tls.Config) *dialer {
	return &dialer{
		net:    net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute},
		lookup: net.DefaultResolver.LookupHost,
		tls:    tlsConfig,
		last:   make(map[string]string),
	}
}

// DialContext has the signature of go-redis' Options.Dialer.
func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := d.dialTCP(ctx, network, addr)
	if err != nil || d.tls == nil {
		return conn, err
	}
	cfg := d.tls.Clone()
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return tc, nil
}

func (d *dialer) dialTCP(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || (network != "tcp" && network != "tcp4" && network != "tcp6") || net.ParseIP(host) != nil {
		return d.net.DialContext(ctx, network, addr)
	}
	ip, err := d.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	return d.net.DialContext(ctx, network, net.JoinHostPort(ip, port))
}

// resolve returns an address for host: a fresh one when the lookup answers
// in time, else the last one known.
func (d *dialer) resolve(ctx context.Context, host string) (string, error) {
	d.mu.Lock()
	known, ok := d.last[host]
	d.mu.Unlock()
	lctx := ctx
	if ok {
		var cancel context.CancelFunc
		lctx, cancel = context.WithTimeout(ctx, knownHostLookup)
		defer cancel()
	}
	addrs, err := d.lookup(lctx, host)
	if err != nil || len(addrs) == 0 {
		if ok {
			return known, nil
		}
		if err == nil {
			err = &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
		return "", err
	}
	ip := addrs[0]
	if ok {
		// Keep the known address while the name still resolves to it, so
		// a name with several addresses does not hop between them.
		for _, a := range addrs {
			if a == known {
				ip = known
				break
			}
		}
	}
	d.mu.Lock()
	d.last[host] = ip
	d.mu.Unlock()
	return ip, nil
}

// poolDial is DialContext as go-redis' pool is given it (Options.Dialer): a
// dial that fails returns, instead of its error, a connection that fails
// every read and write with it (failedConn), so the call that needed the
// connection fails as the dial did, with the dial's error. go-redis counts
// a pool's failed dials over its whole life (a success does not reset the
// count), and once they reach PoolSize it fails every dial at once with
// the last error and dials again only once a second, in the background.
// An instance that had probed a few outages' worth of refused dials came
// back after the next restart up to a second later than Redis did, deciding
// locally meanwhile, while the instances already back waited for it
// (chaos redis-flap; TestRestartedRedisIsDialledAtOnce).
func (d *dialer) poolDial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return failedConn{err: err, addr: dialAddr{network, addr}}, nil
	}
	return c, nil
}

// failedConn is a dial that failed with err, as a connection. go-redis
// hands a dial whose caller gave up meanwhile to another caller or to its
// idle list; an idle one fails the pool's health check (SyscallConn), so
// that no later call meets a stale refusal.
type failedConn struct {
	err  error
	addr net.Addr
}

func (c failedConn) SyscallConn() (syscall.RawConn, error) { return nil, c.err }

func (c failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c failedConn) Close() error                     { return nil }
func (c failedConn) LocalAddr() net.Addr              { return c.addr }
func (c failedConn) RemoteAddr() net.Addr             { return c.addr }
func (c failedConn) SetDeadline(time.Time) error      { return nil }
func (c failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c failedConn) SetWriteDeadline(time.Time) error { return nil }

// dialAddr is the address a dial was for.
type dialAddr struct{ network, addr string }

func (a dialAddr) Network() string { return a.network }
func (a dialAddr) String() string  { return a.addr }
