package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// sentinelMasterName is the name under which the Sentinels monitor the
	// master.
	sentinelMasterName = "redistest"
	// sentinelTimeout bounds the waits for Sentinels to discover each other,
	// for a failover and for replication to resume.
	sentinelTimeout = 30 * time.Second
)

// Sentinel is a master and one replica monitored by three Sentinels, started
// by StartSentinel or StartSentinelTLS; the zero value is not usable. Its methods are safe for concurrent use; those taking a
// testing.TB must be called from the test's goroutine.
type Sentinel struct {
	sentinels []*Server

	mu      sync.Mutex
	master  *Server
	replica *Server

	clientOnce sync.Once
	client     *redis.Client
}

// StartSentinel starts a master, a replica of it (replicaof), and three
// Sentinels (redis-server sentinel.conf --sentinel) that monitor the master
// with quorum 2, down-after-milliseconds 1000 and failover-timeout 5000. It
// returns once the replica is in sync and every Sentinel knows the replica and
// the two other Sentinels. Everything is stopped in t.Cleanup.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return startSentinel(t, nil)
}

// StartSentinelTLS is StartSentinel with every process speaking TLS only,
// with certs (TLSOptions{Certs: certs}: a client certificate is
// required): the master, the replica, which replicates over TLS, and the
// Sentinels, which listen on their TLS port and reach the nodes and each
// other over TLS (--tls-replication yes). FailoverOptions and
// FailoverClient carry certs.ClientTLS.
func StartSentinelTLS(t testing.TB, certs *Certificates) *Sentinel {
	t.Helper()
	return startSentinel(t, &TLSOptions{Certs: certs})
}

// startSentinel starts a Sentinel set, plaintext or with tlsOpts.
func startSentinel(t testing.TB, tlsOpts *TLSOptions) *Sentinel {
	t.Helper()
	s := &Sentinel{}
	opts := ServerOptions{TLS: tlsOpts}
	// The nodes read redis.conf so that the CONFIG REWRITE that Sentinel sends
	// with each role change persists it, as in a real deployment: a node
	// restarted after a failover comes back with its new role. That is also
	// why the replica's replicaof is in its config rather than on its command
	// line, where it would win over the rewritten file.
	s.master = startServer(t, serverSpec{opts: opts, confFile: "redis.conf"})
	s.replica = startServer(t, serverSpec{
		opts:     opts,
		confFile: "redis.conf",
		conf:     fmt.Sprintf("replicaof 127.0.0.1 %d\n", s.master.port),
	})
	// Sentinels learn the replicas from the master's INFO, which they read on
	// connecting and then only every 10 s: let the replica attach first.
	s.WaitReplication(t)

	name := sentinelMasterName
	conf := strings.Join([]string{
		"bind 127.0.0.1",
		"sentinel resolve-hostnames no",
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", name, s.master.port),
		fmt.Sprintf("sentinel down-after-milliseconds %s 1000", name),
		fmt.Sprintf("sentinel failover-timeout %s 5000", name),
		"", // the port and dir are passed as arguments, see Server.argv
	}, "\n")
	for range 3 {
		s.sentinels = append(s.sentinels, startServer(t, serverSpec{opts: opts, confFile: "sentinel.conf", conf: conf, sentinel: true}))
	}
	t.Cleanup(func() {
		s.clientOnce.Do(func() {}) // no client can be created from now on
		if s.client != nil {
			s.client.Close()
		}
	})

	err := pollFor(sentinelTimeout, func(ctx context.Context) error {
		for _, sn := range s.sentinels {
			sc := redis.NewSentinelClient(sn.probeOptions())
			replicas, err := sc.Replicas(ctx, name).Result()
			var peers []map[string]string
			if err == nil {
				peers, err = sc.Sentinels(ctx, name).Result()
			}
			sc.Close()
			switch {
			case err != nil:
				return fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
			case len(replicas) < 1:
				return fmt.Errorf("sentinel %s knows no replica yet", sn.Addr())
			case len(peers) < len(s.sentinels)-1:
				return fmt.Errorf("sentinel %s knows %d other sentinels, want %d", sn.Addr(), len(peers), len(s.sentinels)-1)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: sentinels not ready: %v", err)
	}
	return s
}

// MasterName returns the name under which the Sentinels monitor the master.
func (s *Sentinel) MasterName() string { return sentinelMasterName }

// SentinelAddrs returns the addresses of the three Sentinels.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sn := range s.sentinels {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// Sentinels returns the three Sentinel processes, to kill or stop some.
func (s *Sentinel) Sentinels() []*Server { return append([]*Server(nil), s.sentinels...) }

// Master returns the node that is master as far as this helper knows: the
// first master until Failover, then the promoted replica.
func (s *Sentinel) Master() *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.master
}

// Replica returns the node that is not Master. Right after Failover it may
// still believe it is a master: the Sentinels turn it into a replica some
// seconds later (see WaitReplication).
func (s *Sentinel) Replica() *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replica
}

// FailoverOptions returns fresh go-redis options for a Sentinel-aware client
// of the master, for tests that need their own timeouts. The caller closes the
// clients it makes.
func (s *Sentinel) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:      sentinelMasterName,
		SentinelAddrs:   s.SentinelAddrs(),
		TLSConfig:       s.sentinels[0].ClientTLS(),
		DisableIdentity: true,
	}
}

// FailoverClient returns a go-redis client (redis.NewFailoverClient) that asks
// the Sentinels for the master and follows failovers. It is the same client
// on every call and is closed in t.Cleanup.
func (s *Sentinel) FailoverClient() *redis.Client {
	s.clientOnce.Do(func() { s.client = redis.NewFailoverClient(s.FailoverOptions()) })
	return s.client
}

// Failover forces a failover with SENTINEL FAILOVER and returns once every
// Sentinel reports the former replica as master and it accepts writes; Master
// and Replica are swapped. The former master keeps running; the Sentinels
// reconfigure it as a replica some seconds later (WaitReplication waits for
// that). The test fails if this takes more than 30 s.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	oldMaster, next := s.Master(), s.Replica()
	name := sentinelMasterName
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()

	// A Sentinel refuses with -NOGOODSLAVE while its view of the replica is
	// stale: ask again until it accepts. -INPROG means a failover runs already
	// (perhaps ours, if a reply got lost): asking again once it is over would
	// fail back, so wait for it instead.
	err := poll(ctx, func(ctx context.Context) error {
		sc := redis.NewSentinelClient(s.sentinels[0].probeOptions())
		defer sc.Close()
		err := sc.Failover(ctx, name).Err()
		if err != nil && strings.HasPrefix(err.Error(), "INPROG") {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatalf("redistest: SENTINEL FAILOVER %s: %v", name, err)
	}

	err = poll(ctx, func(ctx context.Context) error {
		for _, sn := range s.sentinels {
			sc := redis.NewSentinelClient(sn.probeOptions())
			addr, err := sc.GetMasterAddrByName(ctx, name).Result()
			sc.Close()
			if err != nil {
				return fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
			}
			if len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != next.Addr() {
				return fmt.Errorf("sentinel %s reports master %v, want %s", sn.Addr(), addr, next.Addr())
			}
		}
		nc := redis.NewClient(next.probeOptions())
		defer nc.Close()
		if err := nc.Set(ctx, "redistest:failover", oldMaster.Addr(), time.Minute).Err(); err != nil {
			return fmt.Errorf("write to new master %s: %w", next.Addr(), err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: failover from %s to %s: %v", oldMaster.Addr(), next.Addr(), err)
	}

	s.mu.Lock()
	s.master, s.replica = next, oldMaster
	s.mu.Unlock()
}

// WaitReplication polls until Replica replicates from Master with its link up
// and every Sentinel lists it as a replica of the master, and fails the test
// after 30 s. After Failover this takes about ten seconds: the Sentinels wait
// some seconds, then reconfigure the former master on their next INFO round.
// (The Sentinels' own view of the link, from INFO every 10 s, can lag behind
// by another ten seconds; Failover copes with that by retrying.)
func (s *Sentinel) WaitReplication(t testing.TB) {
	t.Helper()
	master, replica := s.Master(), s.Replica()
	err := pollFor(sentinelTimeout, func(ctx context.Context) error {
		rc := redis.NewClient(replica.probeOptions())
		info, err := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err != nil {
			return fmt.Errorf("replica %s: %w", replica.Addr(), err)
		}
		if role := infoField(info, "role"); role != "slave" {
			return fmt.Errorf("replica %s has role %s", replica.Addr(), role)
		}
		if port := infoField(info, "master_port"); port != strconv.Itoa(master.port) {
			return fmt.Errorf("replica %s replicates from port %s, want %d", replica.Addr(), port, master.port)
		}
		if st := infoField(info, "master_link_status"); st != "up" {
			return fmt.Errorf("replica %s: master_link_status:%s", replica.Addr(), st)
		}
		for _, sn := range s.sentinels {
			sc := redis.NewSentinelClient(sn.probeOptions())
			replicas, err := sc.Replicas(ctx, sentinelMasterName).Result()
			sc.Close()
			if err != nil {
				return fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
			}
			if !listsReplica(replicas, replica.port) {
				return fmt.Errorf("sentinel %s does not list %s as a replica", sn.Addr(), replica.Addr())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: replication from %s to %s: %v", master.Addr(), replica.Addr(), err)
	}
}

// CutReplication stops the replica replicating, so that it falls behind
// the master while the master keeps acknowledging writes, and returns once
// the replica has everything written before the call. It points the replica
// at the master through a Proxy, then disables the proxy. (A proxy in the
// replica's configuration from the start would not last: the Sentinels
// point a replica back at the master's own address some seconds after they
// see it replicate from elsewhere, failover-timeout after they notice, so
// a failover must follow the cut within that time: 5 s.)
func (s *Sentinel) CutReplication(t testing.TB) {
	t.Helper()
	master, replica := s.Master(), s.Replica()
	link := StartProxy(t, master.Addr())
	_, port, _ := net.SplitHostPort(link.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	rc := redis.NewClient(replica.probeOptions())
	defer rc.Close()
	if err := rc.ReplicaOf(ctx, "127.0.0.1", port).Err(); err != nil {
		t.Fatalf("redistest: replicaof the proxy: %v", err)
	}
	err := poll(ctx, func(ctx context.Context) error {
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if infoField(info, "master_port") != port || infoField(info, "master_link_status") != "up" {
			return fmt.Errorf("replica %s not yet replicating through the proxy", replica.Addr())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.WaitInSync(t)
	link.Disable()
}

// WaitInSync polls until the replica has applied everything the master had
// written when it was called, and fails the test after 30 s.
func (s *Sentinel) WaitInSync(t testing.TB) {
	t.Helper()
	master, replica := s.Master(), s.Replica()
	err := pollFor(sentinelTimeout, func(ctx context.Context) error {
		offset := func(srv *Server, field string) (string, error) {
			c := redis.NewClient(srv.probeOptions())
			defer c.Close()
			info, err := c.Info(ctx, "replication").Result()
			return infoField(info, field), err
		}
		m, err := offset(master, "master_repl_offset")
		if err != nil {
			return err
		}
		r, err := offset(replica, "slave_repl_offset")
		if err != nil {
			return err
		}
		// The master first: a replica at or past the offset the master had
		// then has everything written before the call.
		mo, err1 := strconv.ParseInt(m, 10, 64)
		ro, err2 := strconv.ParseInt(r, 10, 64)
		if err1 != nil || err2 != nil || ro < mo {
			return fmt.Errorf("replica at offset %q, master at %q", r, m)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: replica %s not in sync: %v", replica.Addr(), err)
	}
}

// listsReplica reports whether a SENTINEL REPLICAS reply lists the replica on
// port, not flagged as down or disconnected.
func listsReplica(replicas []map[string]string, port int) bool {
	for _, r := range replicas {
		if r["port"] == strconv.Itoa(port) && r["flags"] == "slave" {
			return true
		}
	}
	return false
}
