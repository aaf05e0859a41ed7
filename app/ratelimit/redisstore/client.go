package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientConfig describes how to reach Redis: one standalone server, a
// Cluster, or a Sentinel-monitored master, through go-redis' universal
// client.
type ClientConfig struct {
	// URL is a redis:// or rediss:// URL of a standalone server. It
	// excludes Addrs. A rediss:// URL turns TLS on, verifying the server
	// against the system's roots and the URL's host (or, with TLS set,
	// as TLS says).
	URL string
	// Addrs are host:port addresses: one standalone server; several
	// Cluster nodes (or set Cluster); or Sentinels when MasterName is set.
	Addrs []string
	// Cluster forces a Cluster client for a single seed address.
	Cluster bool
	// MasterName selects Sentinel mode.
	MasterName string
	Username   string
	Password   string
	// Timeout bounds every call (dial, read, write, pool wait). A limiter
	// call that takes longer has failed. Default 50 ms.
	Timeout time.Duration
	// PoolSize is the number of connections per node. Default 64.
	PoolSize int
	// LateReplies is how long a reply is still read after its caller's
	// deadline (Store.OnLate): the client's read timeout is Timeout plus
	// this, and every call is bounded by its context instead. 0: none.
	LateReplies time.Duration
	// TLS, when set, makes every connection TLS: to a standalone server,
	// to every Cluster node (the seeds and those the slot map names), to
	// every Sentinel and to the master (or replica) it names. It wins over
	// a rediss:// URL's own settings; a redis:// URL with TLS set is an
	// error (no silent plaintext). Without a ServerName, each connection
	// verifies the host it dials (a rediss:// URL's host, a node's address
	// as the Cluster or the Sentinels announce it): set ServerName when
	// the certificates name a host that the announced addresses do not.
	// The config is cloned, not kept. Nil: plaintext, unless the URL is
	// rediss://.
	TLS *tls.Config
}

// options returns the universal options for the configuration, tuned for a
// rate limiter: no automatic retries (a retried decision could be counted
// twice, and a failed call must fail fast so the fallback can take over),
// timeouts that bound socket reads through the context, and a pool sized
// for concurrent decisions.
func (c ClientConfig) options() (*redis.UniversalOptions, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 50 * time.Millisecond
	}
	pool := c.PoolSize
	if pool <= 0 {
		pool = 64
	}
	o := &redis.UniversalOptions{
		Addrs:      c.Addrs,
		MasterName: c.MasterName,
		Username:   c.Username,
		Password:   c.Password,
	}
	switch {
	case c.URL != "" && len(c.Addrs) > 0:
		return nil, errors.New("redisstore: set either a URL or addresses, not both")
	case c.URL != "":
		u, err := redis.ParseURL(c.URL)
		if err != nil {
			return nil, fmt.Errorf("redisstore: %w", err)
		}
		o.Addrs = []string{u.Addr}
		o.DB = u.DB
		switch {
		case c.TLS == nil:
			o.TLSConfig = u.TLSConfig
		case u.TLSConfig == nil:
			return nil, errors.New("redisstore: a redis:// URL with TLS set: use rediss://")
		default:
			o.TLSConfig = c.TLS.Clone()
			if o.TLSConfig.ServerName == "" {
				o.TLSConfig.ServerName = u.TLSConfig.ServerName
			}
		}
		if o.Username == "" {
			o.Username = u.Username
		}
		if o.Password == "" {
			o.Password = u.Password
		}
	case len(c.Addrs) == 0:
		return nil, errors.New("redisstore: no Redis URL or addresses")
	case c.TLS != nil:
		o.TLSConfig = c.TLS.Clone()
	}
	o.IsClusterMode = c.Cluster
	o.MaxRetries = -1
	// One redirect, not go-redis' three: a MOVED or ASK is still followed
	// once, but a connection error (the EOF of a killed master, then its
	// refused dial) is retried once on the same node and then returned.
	// With three, the Cluster client retries with back-off until the
	// deadline, and a dead master's refusal comes back as a timeout, of
	// which heartbeats need three in a row to open the breaker: meanwhile
	// the instances decide in Redis and take places their peers' local
	// shares counted free (TestClusterDeadMasterFailsAtOnce). Fewer
	// retries also mean fewer decisions counted twice.
	o.MaxRedirects = 1
	// That one retry goes at once: go-redis' default back-off before it,
	// and before the layout's re-read, can outlast a heartbeat's timeout
	// (TestClusterDeadMasterFailsAtOnce).
	o.MinRetryBackoff = -1
	o.DialTimeout = max(timeout, 250*time.Millisecond)
	// One dial per attempt, not five 100 ms apart: a refused dial (Redis'
	// process is down) fails the call at once with the refusal, which opens
	// the breaker at once. With five, go-redis sleeps between them until
	// the call's deadline, and the refusal comes back as a timeout
	// (TestClusterDeadMasterFailsAtOnce). The limiter tries again by
	// itself, at the next heartbeat or probe.
	o.DialerRetries = 1
	o.ReadTimeout = timeout + max(c.LateReplies, 0)
	o.WriteTimeout = timeout
	o.PoolTimeout = timeout
	o.ContextTimeoutEnabled = true
	o.PoolSize = pool
	// No idle connections kept warm: while Redis is unreachable go-redis
	// refills them in the background, each a failed dial, and once PoolSize
	// dials have failed it fails every new dial at once with the last error
	// until its own prober (once a second) gets through, which holds a
	// recovered instance's replay off after Redis is back (poolDial keeps
	// the calls' own failed dials out of that count). The limiter opens
	// connections itself, at start and when a probe succeeds
	// (resilient's Warm; TestWarm, TestRecoveryWarmsThePool).
	o.MinIdleConns = 0
	o.DisableIdentity = true
	// Our dialer does the TLS handshake. go-redis hands Dialer to every
	// connection it makes (Cluster nodes, Sentinels, the master a Sentinel
	// names) and wraps TLSConfig around a connection only in its own
	// default dialers, which Dialer replaces: TLSConfig stays set only so
	// that go-redis knows TLS is on, and no handshake happens twice.
	o.Dialer = newDialer(o.DialTimeout, o.TLSConfig).poolDial
	return o, nil
}

// NewClient returns a client for the configuration. Nothing is dialled
// yet: an unreachable Redis is not an error here.
func NewClient(c ClientConfig) (redis.UniversalClient, error) {
	o, err := c.options()
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(o), nil
}
