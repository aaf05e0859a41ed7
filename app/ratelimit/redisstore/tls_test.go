package redisstore_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// tlsLimit is the policy of the TLS tests: a sliding log admits exactly
// Limit decisions within the hour, whatever the pace.
var tlsLimit = ratelimit.Policy{Name: "tls", Algorithm: ratelimit.SlidingWindowLog, Limit: 5, Window: time.Hour}

// tlsStore returns a store on a client of cc, closed at the end of the
// test.
func tlsStore(t *testing.T, cc redisstore.ClientConfig) (*redisstore.Store, redis.UniversalClient) {
	t.Helper()
	if cc.Timeout == 0 {
		cc.Timeout = time.Second
	}
	c, err := redisstore.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return redisstore.New(c, redisstore.Config{Timeout: 2 * time.Second}), c
}

// admitted asks n decisions for key and returns how many were admitted;
// an error fails the test.
func admitted(t *testing.T, l *redisstore.Store, key string, n int) int {
	t.Helper()
	ok := 0
	for i := range n {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: tlsLimit, Key: key, ID: fmt.Sprintf("%s-%d", key, i)})
		if err != nil {
			t.Fatalf("decision %d for %s: %v", i, key, err)
		}
		if d.Mode != ratelimit.ModeRedis {
			t.Fatalf("decision %d for %s: mode %s, want redis", i, key, d.Mode)
		}
		if d.Allowed {
			ok++
		}
	}
	return ok
}

// decideErr returns the error of one decision.
func decideErr(l *redisstore.Store) error {
	_, err := l.Decide(context.Background(), ratelimit.Request{Policy: tlsLimit, Key: "refused"})
	return err
}

// TestTLSStandalone: over TLS, a standalone server counts the decisions
// (a limit of 5 admits 5 of 7, and the key's state is in Redis), whether
// reached by address with TLS, by a rediss:// URL with TLS, or under a
// ServerName that the address is not.
func TestTLSStandalone(t *testing.T) {
	certs := redistest.NewCertificates(t)
	srv := redistest.StartServer(t, redistest.ServerOptions{TLS: &redistest.TLSOptions{Certs: certs}})
	named := certs.ClientTLS()
	named.ServerName = "redis.test"
	for _, tc := range []struct {
		name string
		cc   redisstore.ClientConfig
	}{
		{"addrs", redisstore.ClientConfig{Addrs: []string{srv.Addr()}, TLS: certs.ClientTLS()}},
		{"rediss URL", redisstore.ClientConfig{URL: "rediss://" + srv.Addr() + "/0", TLS: certs.ClientTLS()}},
		{"server name", redisstore.ClientConfig{Addrs: []string{srv.Addr()}, TLS: named}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := tlsStore(t, tc.cc)
			key := "standalone-" + strings.ReplaceAll(tc.name, " ", "-")
			if got := admitted(t, l, key, 7); got != 5 {
				t.Errorf("%d of 7 admitted, want 5", got)
			}
			if n, err := srv.Client().Exists(context.Background(), l.Key(tlsLimit, key)).Result(); err != nil || n != 1 {
				t.Errorf("EXISTS %s = %d, %v; want 1", l.Key(tlsLimit, key), n, err)
			}
		})
	}
}

// TestTLSConfigErrors: TLS with a redis:// URL is an error, not plaintext.
func TestTLSConfigErrors(t *testing.T) {
	_, err := redisstore.ClientConfig{URL: "redis://127.0.0.1:6379/0", TLS: &tls.Config{}}.OptionsForTest()
	if err == nil || !strings.Contains(err.Error(), "use rediss://") {
		t.Errorf("redis:// URL with TLS: %v, want an error saying to use rediss://", err)
	}
	o, err := redisstore.ClientConfig{URL: "rediss://localhost:6380/0", TLS: &tls.Config{MinVersion: tls.VersionTLS13}}.OptionsForTest()
	if err != nil || o.TLSConfig == nil || o.TLSConfig.MinVersion != tls.VersionTLS13 || o.TLSConfig.ServerName != "localhost" {
		t.Errorf("rediss:// URL with TLS: %+v, %v; want TLS's config with the URL's host as ServerName", o.TLSConfig, err)
	}
}

// TestTLSRefusals: a TLS-only server refuses a plaintext client, and a TLS
// client fails on a server it must not trust, each with the error that
// says why. None of them decides.
func TestTLSRefusals(t *testing.T) {
	certs := redistest.NewCertificates(t)
	srv := redistest.StartServer(t, redistest.ServerOptions{TLS: &redistest.TLSOptions{Certs: certs}})
	expired := redistest.StartServer(t, redistest.ServerOptions{TLS: &redistest.TLSOptions{Certs: certs, ExpiredCert: true}})
	plain := redistest.StartServer(t, redistest.ServerOptions{})

	pem, err := os.ReadFile(certs.OtherCAFile)
	if err != nil {
		t.Fatal(err)
	}
	wrongCA := certs.ClientTLS()
	wrongCA.RootCAs = x509.NewCertPool()
	wrongCA.RootCAs.AppendCertsFromPEM(pem)
	noCert := certs.ClientTLS()
	noCert.Certificates = nil
	otherName := certs.ClientTLS()
	otherName.ServerName = "other.test"

	for _, tc := range []struct {
		name  string
		cc    redisstore.ClientConfig
		check func(err error) bool
	}{
		{"plaintext to TLS", redisstore.ClientConfig{Addrs: []string{srv.Addr()}},
			func(err error) bool { return err != nil }},
		{"wrong CA", redisstore.ClientConfig{Addrs: []string{srv.Addr()}, TLS: wrongCA},
			func(err error) bool { return errors.As(err, new(x509.UnknownAuthorityError)) }},
		{"expired server certificate", redisstore.ClientConfig{Addrs: []string{expired.Addr()}, TLS: certs.ClientTLS()},
			func(err error) bool {
				var ci x509.CertificateInvalidError
				return errors.As(err, &ci) && ci.Reason == x509.Expired
			}},
		{"wrong server name", redisstore.ClientConfig{Addrs: []string{srv.Addr()}, TLS: otherName},
			func(err error) bool { return errors.As(err, new(x509.HostnameError)) }},
		// TLS 1.3: the client's handshake ends before the server checks
		// its certificate, so the refusal comes as the server's alert on
		// the first read or, when the client's write of the command loses
		// the race with the server's close, as a reset.
		{"no client certificate", redisstore.ClientConfig{Addrs: []string{srv.Addr()}, TLS: noCert},
			func(err error) bool {
				return err != nil && (strings.Contains(err.Error(), "certificate required") || errors.Is(err, syscall.ECONNRESET))
			}},
		// A plaintext Redis never answers a ClientHello (its NUL bytes
		// stop the inline parser): the handshake times out.
		{"TLS to plaintext", redisstore.ClientConfig{Addrs: []string{plain.Addr()}, TLS: certs.ClientTLS(), Timeout: 200 * time.Millisecond},
			func(err error) bool { return err != nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := tlsStore(t, tc.cc)
			err := decideErr(l)
			if !tc.check(err) || !errors.Is(err, ratelimit.ErrUnavailable) {
				t.Errorf("decision: %v (%T), want ErrUnavailable saying why", err, errors.Unwrap(err))
			}
		})
	}
}

// TestTLSCluster: from one seed, a Cluster client over TLS reaches the
// three masters it learns from the slot map, and every master counts its
// keys' decisions (a limit of 5 admits 5 of 7 for each of 30 keys, whose
// states are on the master of their slot).
func TestTLSCluster(t *testing.T) {
	certs := redistest.NewCertificates(t)
	cl := redistest.StartClusterTLS(t, certs)
	l, _ := tlsStore(t, redisstore.ClientConfig{Addrs: cl.Addrs()[:1], Cluster: true, TLS: certs.ClientTLS()})
	masters := map[string]int{}
	for i := range 30 {
		key := fmt.Sprintf("cluster-%d", i)
		if got := admitted(t, l, key, 7); got != 5 {
			t.Errorf("%s: %d of 7 admitted, want 5", key, got)
		}
		m := cl.MasterFor(l.Key(tlsLimit, key))
		if n, err := m.Client().Exists(context.Background(), l.Key(tlsLimit, key)).Result(); err != nil || n != 1 {
			t.Errorf("EXISTS %s on %s = %d, %v; want 1", l.Key(tlsLimit, key), m.Addr(), n, err)
		}
		masters[m.Addr()]++
	}
	if len(masters) != 3 {
		t.Errorf("30 keys on %d masters (%v), want all 3", len(masters), masters)
	}
}

// TestTLSSentinel: through Sentinels over TLS, the master counts the
// decisions; after a failover the client follows to the new master, which
// has the state (replicated over TLS): the key stays limited.
func TestTLSSentinel(t *testing.T) {
	certs := redistest.NewCertificates(t)
	s := redistest.StartSentinelTLS(t, certs)
	l, _ := tlsStore(t, redisstore.ClientConfig{Addrs: s.SentinelAddrs(), MasterName: s.MasterName(), TLS: certs.ClientTLS()})
	if got := admitted(t, l, "sentinel", 7); got != 5 {
		t.Fatalf("%d of 7 admitted, want 5", got)
	}
	ctx := context.Background()
	if n, err := s.Master().Client().Wait(ctx, 1, 5000).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	s.Failover(t)
	// A few decisions may fail while the client notices the switch.
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := l.Decide(ctx, ratelimit.Request{Policy: tlsLimit, Key: "sentinel", ID: "after"})
		if err == nil {
			if d.Allowed {
				t.Error("the key was admitted after the failover: the new master lacks its state")
			}
			break
		}
		if !errors.Is(err, ratelimit.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := admitted(t, l, "sentinel-after", 7); got != 5 {
		t.Errorf("after failover: %d of 7 admitted, want 5", got)
	}
	if n, err := s.Master().Client().Exists(ctx, l.Key(tlsLimit, "sentinel-after")).Result(); err != nil || n != 1 {
		t.Errorf("EXISTS on the new master %s = %d, %v; want 1", s.Master().Addr(), n, err)
	}
}
