package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestMain fails the run if a test leaves a child process (redis-server,
// redis-cli) behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if kids := children(); len(kids) > 0 {
		fmt.Fprintf(os.Stderr, "redistest: processes left behind: %s\n", strings.Join(kids, ", "))
		code = 1
	}
	os.Exit(code)
}

// children lists the processes whose parent is this one, as "pid (name)",
// using /proc; it returns nothing where /proc is missing.
func children() []string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []string
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process has gone
		}
		// pid (comm) state ppid ...; comm may contain spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) {
			kids = append(kids, s[:i+1])
		}
	}
	return kids
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// eventually polls check until it returns nil and fails the test after d.
func eventually(t *testing.T, d time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	if err := pollFor(d, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// fastClient returns a client of o with a 100 ms read timeout and no retries,
// closed at the end of the test.
func fastClient(t *testing.T, o *redis.Options) *redis.Client {
	o.ReadTimeout = 100 * time.Millisecond
	o.DialTimeout = time.Second
	o.MaxRetries = -1
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRequire(t *testing.T) {
	if got := Require(t, "redis-server"); !filepath.IsAbs(got) {
		t.Errorf("Require(redis-server) = %q, want an absolute path", got)
	}
	for _, tc := range []struct {
		ci        string
		wantFatal bool // else a skip
	}{
		{ci: "", wantFatal: false},
		{ci: "true", wantFatal: true},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			rec := runRecording(t, func(tb testing.TB) { Require(tb, "redistest-no-such-binary") })
			msg, other := rec.skipped, rec.fatal
			if tc.wantFatal {
				msg, other = other, msg
			}
			if msg == "" || other != "" {
				t.Fatalf("Require: fatal %q, skip %q; want only a %s", rec.fatal, rec.skipped, map[bool]string{true: "fatal", false: "skip"}[tc.wantFatal])
			}
			if !strings.Contains(msg, "apt-get install redis-server") {
				t.Errorf("message %q lacks the install hint", msg)
			}
		})
	}
}

// recordingTB records Fatal and Skip instead of acting on them, and ends the
// goroutine like they would.
type recordingTB struct {
	testing.TB
	fatal, skipped string
}

func (r *recordingTB) Fatal(args ...any) { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recordingTB) Skip(args ...any) { r.skipped = fmt.Sprint(args...); runtime.Goexit() }

// runRecording runs f with a recordingTB in a goroutine of its own, which
// Fatal and Skip end, and returns the record.
func runRecording(t *testing.T, f func(tb testing.TB)) *recordingTB {
	rec := &recordingTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(rec)
	}()
	<-done
	return rec
}

func TestStartServerFailureShowsLog(t *testing.T) {
	t.Parallel()
	rec := runRecording(t, func(tb testing.TB) {
		StartServer(tb, ServerOptions{Args: []string{"--no-such-directive", "x"}})
	})
	if !strings.Contains(rec.fatal, "last lines of") || !strings.Contains(rec.fatal, "no-such-directive") {
		t.Errorf("failure message lacks the log tail:\n%s", rec.fatal)
	}
}

func TestServerPingAndPassword(t *testing.T) {
	t.Parallel()
	srv := StartServer(t, ServerOptions{Password: "s3cret"})
	ctx := t.Context()
	if err := srv.Client().Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	o := srv.Options()
	o.Password = ""
	anon := redis.NewClient(o)
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("PING without password: %v, want NOAUTH", err)
	}
	if fi, err := os.Stat(srv.LogPath()); err != nil || fi.Size() == 0 {
		t.Errorf("log %s: %v, want a non-empty file", srv.LogPath(), err)
	}
}

func TestServerKillRestartKeepsAOFData(t *testing.T) {
	t.Parallel()
	srv := StartServer(t, ServerOptions{AOF: true})
	ctx := t.Context()
	c := srv.Client()
	if err := c.Set(ctx, "k", "before-kill", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	pid, addr := srv.Pid(), srv.Addr()
	srv.Kill()
	if got := srv.Pid(); got != 0 {
		t.Errorf("Pid after Kill = %d, want 0", got)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d after Kill: %v, want ESRCH", pid, err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Errorf("PING after Kill succeeded")
	}

	srv.Restart(t)
	if srv.Addr() != addr {
		t.Errorf("Addr after Restart = %s, want %s", srv.Addr(), addr)
	}
	if srv.Pid() == 0 || srv.Pid() == pid {
		t.Errorf("Pid after Restart = %d (before: %d), want a new process", srv.Pid(), pid)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "before-kill" {
		t.Errorf("GET after Restart = %q, %v; want %q", got, err, "before-kill")
	}
}

func TestServerRestartEmptyLosesData(t *testing.T) {
	t.Parallel()
	srv := StartServer(t, ServerOptions{AOF: true})
	ctx := t.Context()
	c := srv.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	srv.RestartEmpty(t)
	if got, err := c.Get(ctx, "k").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET after RestartEmpty = %q, %v; want redis.Nil", got, err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("DBSIZE after RestartEmpty = %d, %v; want 0", n, err)
	}
}

func TestServerStopCont(t *testing.T) {
	t.Parallel()
	srv := StartServer(t, ServerOptions{})
	ctx := t.Context()
	c := fastClient(t, srv.Options())
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}

	srv.Stop()
	if err := c.Ping(ctx).Err(); !isTimeout(err) {
		t.Errorf("PING while stopped: %v, want a timeout", err)
	}

	srv.Cont()
	eventually(t, 5*time.Second, "PING after Cont", func(ctx context.Context) error {
		return c.Ping(ctx).Err()
	})
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cl := StartCluster(t)
	t.Logf("cluster ready in %v", time.Since(start).Round(time.Millisecond))
	ctx := t.Context()
	cc := cl.Client()

	if len(cl.Nodes()) != 3 || len(cl.Addrs()) != 3 {
		t.Fatalf("%d nodes, %d addrs; want 3", len(cl.Nodes()), len(cl.Addrs()))
	}
	const keys = 300
	for i := range keys {
		key := "key:" + strconv.Itoa(i)
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
	}
	total := int64(0)
	for _, n := range cl.Nodes() {
		size, err := n.Client().DBSize(ctx).Result()
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", n.Addr(), err)
		}
		if size == 0 {
			t.Errorf("node %s holds no key", n.Addr())
		}
		total += size
	}
	if total != keys {
		t.Errorf("nodes hold %d keys in all, want %d", total, keys)
	}
	for i := range keys {
		key := "key:" + strconv.Itoa(i)
		if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
		}
		// The node MasterFor names serves the key itself (no MOVED).
		if got, err := cl.MasterFor(key).Client().Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("GET %s on MasterFor = %d, %v; want %d", key, got, err, i)
		}
	}
	for _, key := range []string{"foo", "{user1000}.following", "a{}b", "{}{x}", "{x}", "", "key:42"} {
		want, err := cl.Nodes()[0].Client().ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
		}
		if got := keySlot(key); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
		}
	}
}

func TestClusterNodeRestart(t *testing.T) {
	t.Parallel()
	cl := StartCluster(t)
	ctx := t.Context()
	n := cl.MasterFor("k")
	n.Kill()
	n.Restart(t)
	cl.WaitHealthy(t)
	if err := cl.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Errorf("SET after restarting the key's master: %v", err)
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartSentinel(t)
	t.Logf("sentinels ready in %v", time.Since(start).Round(time.Millisecond))
	ctx := t.Context()
	fc := s.FailoverClient()
	if len(s.SentinelAddrs()) != 3 || s.MasterName() == "" {
		t.Fatalf("SentinelAddrs = %v, MasterName = %q", s.SentinelAddrs(), s.MasterName())
	}

	oldMaster, oldReplica := s.Master(), s.Replica()
	if err := fc.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatalf("SET before failover: %v", err)
	}
	// Let the write reach the replica, so that it survives the failover.
	if n, err := oldMaster.Client().Wait(ctx, 1, 5000).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}

	start = time.Now()
	s.Failover(t)
	t.Logf("failover done in %v", time.Since(start).Round(time.Millisecond))
	if s.Master() != oldReplica || s.Replica() != oldMaster {
		t.Fatalf("Master/Replica not swapped by Failover")
	}

	// The failover client follows the Sentinels to the new master.
	eventually(t, 15*time.Second, "failover client on the new master", func(ctx context.Context) error {
		if err := fc.Set(ctx, "after", "1", 0).Err(); err != nil {
			return err
		}
		info, err := fc.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		if port := infoField(info, "tcp_port"); port != strconv.Itoa(s.Master().Port()) {
			return fmt.Errorf("client talks to port %s, want %d", port, s.Master().Port())
		}
		return nil
	})
	if got, err := fc.Get(ctx, "before").Result(); err != nil || got != "1" {
		t.Errorf("GET before = %q, %v; want 1", got, err)
	}

	start = time.Now()
	s.WaitReplication(t)
	t.Logf("former master replicating after %v", time.Since(start).Round(time.Millisecond))
	if got, err := oldMaster.Client().Get(ctx, "after").Result(); err != nil || got != "1" {
		t.Errorf("GET after on the former master = %q, %v; want 1", got, err)
	}

	// Sentinel persisted the new roles (CONFIG REWRITE): the former master,
	// restarted, comes back as a replica instead of a second master.
	oldMaster.Restart(t)
	info, err := oldMaster.Client().Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("INFO on the restarted former master: %v", err)
	}
	if role, port := infoField(info, "role"), infoField(info, "master_port"); role != "slave" || port != strconv.Itoa(s.Master().Port()) {
		t.Errorf("restarted former master: role %s, master_port %s; want slave of %d", role, port, s.Master().Port())
	}
	s.WaitReplication(t)
}

func TestProxy(t *testing.T) {
	t.Parallel()
	t.Run("faults", testProxyFaults)
	// Everything the proxy started has stopped with the subtest's cleanup.
	eventually(t, 5*time.Second, "proxy goroutines gone", func(context.Context) error {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		if n := strings.Count(string(buf), "redistest.(*Proxy)"); n > 0 {
			return fmt.Errorf("%d proxy frames still on goroutine stacks", n)
		}
		return nil
	})
}

func testProxyFaults(t *testing.T) {
	srv := StartServer(t, ServerOptions{})
	p := StartProxy(t, srv.Addr())
	ctx := t.Context()
	o := srv.Options()
	o.Addr = p.Addr()
	c := fastClient(t, o)
	ok := func(ctx context.Context) error { return c.Ping(ctx).Err() }

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the proxy: %v", err)
	}
	if got, err := srv.Client().Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET on the server = %q, %v; want v", got, err)
	}

	p.Disable()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Errorf("PING through a disabled proxy succeeded")
	}
	if conn, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		conn.Close()
		t.Errorf("dial to a disabled proxy succeeded")
	}
	p.Enable()
	eventually(t, 5*time.Second, "PING after Enable", ok)

	p.Latency(300 * time.Millisecond)
	if err := c.Ping(ctx).Err(); !isTimeout(err) {
		t.Errorf("PING with 300ms latency and 100ms timeout: %v, want a timeout", err)
	}
	o2 := srv.Options()
	o2.Addr = p.Addr()
	slow := redis.NewClient(o2)
	defer slow.Close()
	began := time.Now()
	if err := slow.Ping(ctx).Err(); err != nil {
		t.Errorf("PING with 300ms latency and default timeout: %v", err)
	} else if d := time.Since(began); d < 300*time.Millisecond {
		t.Errorf("PING with 300ms latency took %v", d)
	}
	p.ClearToxics()
	eventually(t, 5*time.Second, "PING after ClearToxics", ok)

	p.Blackhole()
	if err := c.Ping(ctx).Err(); !isTimeout(err) {
		t.Errorf("PING through a blackhole: %v, want a timeout", err)
	}
	p.ClearToxics()
	eventually(t, 5*time.Second, "PING after the blackhole", ok)
}

// TestServerTLS: a TLS server answers the helper's client (which presents
// the client certificate) and nothing else: not plaintext, not a client
// without a certificate unless OptionalClientCert; with ExpiredCert the
// helper still reaches it, and Certificates.ClientTLS fails on the expiry.
func TestServerTLS(t *testing.T) {
	t.Parallel()
	certs := NewCertificates(t)
	srv := StartServer(t, ServerOptions{TLS: &TLSOptions{Certs: certs}})
	ctx := t.Context()
	if err := srv.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	// The server names 127.0.0.1, localhost and redis.test.
	for _, name := range []string{"localhost", "redis.test"} {
		o := srv.Options()
		o.TLSConfig.ServerName = name
		if err := fastClient(t, o).Ping(ctx).Err(); err != nil {
			t.Errorf("PING with ServerName %s: %v", name, err)
		}
	}

	plain := srv.Options()
	plain.TLSConfig = nil
	if err := fastClient(t, plain).Ping(ctx).Err(); err == nil {
		t.Error("plaintext PING to a TLS-only server succeeded")
	}
	noCert := srv.Options()
	noCert.TLSConfig.Certificates = nil
	if err := fastClient(t, noCert).Ping(ctx).Err(); err == nil {
		t.Error("PING without a client certificate succeeded, want a refusal")
	}

	optional := StartServer(t, ServerOptions{TLS: &TLSOptions{Certs: certs, OptionalClientCert: true}})
	noCert = optional.Options()
	noCert.TLSConfig.Certificates = nil
	if err := fastClient(t, noCert).Ping(ctx).Err(); err != nil {
		t.Errorf("PING without a client certificate, optional: %v", err)
	}

	expired := StartServer(t, ServerOptions{TLS: &TLSOptions{Certs: certs, ExpiredCert: true}})
	if err := expired.Client().Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through Options to a server with an expired certificate: %v", err)
	}
	o := expired.Options()
	o.TLSConfig = certs.ClientTLS()
	var invalid x509.CertificateInvalidError
	if err := fastClient(t, o).Ping(ctx).Err(); !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
		t.Errorf("PING with ClientTLS to an expired certificate: %v, want x509.Expired", err)
	}
}

// TestCertificates: every certificate chains to its CA (or not, for the
// other CA) with the names and validity Certificates promises.
func TestCertificates(t *testing.T) {
	t.Parallel()
	certs := NewCertificates(t)
	load := func(path string) *x509.Certificate {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			t.Fatalf("%s: no PEM block", path)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	pool := func(path string) *x509.CertPool {
		p := x509.NewCertPool()
		p.AddCert(load(path))
		return p
	}
	for _, tc := range []struct {
		cert, key, ca, name string
		usage               x509.ExtKeyUsage
		want                error // nil, or an error of the wanted type
	}{
		{certs.ServerCert, certs.ServerKey, certs.CAFile, "127.0.0.1", x509.ExtKeyUsageServerAuth, nil},
		{certs.ServerCert, certs.ServerKey, certs.CAFile, "redis.test", x509.ExtKeyUsageServerAuth, nil},
		{certs.ServerCert, certs.ServerKey, certs.CAFile, "localhost", x509.ExtKeyUsageClientAuth, nil},
		{certs.ClientCert, certs.ClientKey, certs.CAFile, "", x509.ExtKeyUsageClientAuth, nil},
		{certs.ServerCert, certs.ServerKey, certs.OtherCAFile, "127.0.0.1", x509.ExtKeyUsageServerAuth, x509.UnknownAuthorityError{}},
		{certs.ServerCert, certs.ServerKey, certs.CAFile, "other.test", x509.ExtKeyUsageServerAuth, x509.HostnameError{}},
		{certs.ExpiredServerCert, certs.ExpiredServerKey, certs.CAFile, "127.0.0.1", x509.ExtKeyUsageServerAuth, x509.CertificateInvalidError{Reason: x509.Expired}},
		{certs.ExpiredClientCert, certs.ExpiredClientKey, certs.CAFile, "", x509.ExtKeyUsageClientAuth, x509.CertificateInvalidError{Reason: x509.Expired}},
	} {
		if _, err := tls.LoadX509KeyPair(tc.cert, tc.key); err != nil {
			t.Errorf("%s with %s: %v", filepath.Base(tc.cert), filepath.Base(tc.key), err)
		}
		_, err := load(tc.cert).Verify(x509.VerifyOptions{Roots: pool(tc.ca), DNSName: tc.name, KeyUsages: []x509.ExtKeyUsage{tc.usage}})
		if got, want := fmt.Sprintf("%T", err), fmt.Sprintf("%T", tc.want); got != want {
			t.Errorf("%s for %q under %s: %v, want a %s", filepath.Base(tc.cert), tc.name, filepath.Base(tc.ca), err, want)
		}
		if ci, ok := tc.want.(x509.CertificateInvalidError); ok {
			if got, _ := err.(x509.CertificateInvalidError); got.Reason != ci.Reason {
				t.Errorf("%s: %v, want reason %d", filepath.Base(tc.cert), err, ci.Reason)
			}
		}
	}
}

// TestClusterTLS: a Cluster whose every node speaks TLS only is created
// and serves keys on all three masters through a TLS cluster client; a
// plaintext cluster client gets nowhere.
func TestClusterTLS(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cl := StartClusterTLS(t, NewCertificates(t))
	t.Logf("TLS cluster ready in %v", time.Since(start).Round(time.Millisecond))
	ctx := t.Context()
	const keys = 100
	for i := range keys {
		if err := cl.Client().Set(ctx, "key:"+strconv.Itoa(i), i, 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
	}
	total := int64(0)
	for _, n := range cl.Nodes() {
		size, err := n.Client().DBSize(ctx).Result()
		if err != nil || size == 0 {
			t.Errorf("DBSIZE on %s = %d, %v; want some keys", n.Addr(), size, err)
		}
		total += size
	}
	if total != keys {
		t.Errorf("nodes hold %d keys in all, want %d", total, keys)
	}
	o := cl.ClusterOptions()
	o.TLSConfig, o.MaxRetries, o.DialTimeout = nil, -1, time.Second
	plain := redis.NewClusterClient(o)
	defer plain.Close()
	if err := plain.Set(ctx, "k", "v", 0).Err(); err == nil {
		t.Error("SET through a plaintext cluster client succeeded")
	}
}

// TestSentinelTLS: with every process on TLS, the failover client reaches
// the master through the Sentinels, the replica replicates, and a forced
// failover moves the client to the new master.
func TestSentinelTLS(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartSentinelTLS(t, NewCertificates(t))
	t.Logf("TLS sentinels ready in %v", time.Since(start).Round(time.Millisecond))
	ctx := t.Context()
	fc := s.FailoverClient()
	if err := fc.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatalf("SET before failover: %v", err)
	}
	if n, err := s.Master().Client().Wait(ctx, 1, 5000).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	s.Failover(t)
	eventually(t, 15*time.Second, "failover client on the new master", func(ctx context.Context) error {
		if err := fc.Set(ctx, "after", "1", 0).Err(); err != nil {
			return err
		}
		info, err := fc.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		// tcp_port is the TLS port when the plaintext one is 0.
		if port := infoField(info, "tcp_port"); port != strconv.Itoa(s.Master().Port()) {
			return fmt.Errorf("client talks to port %s, want %d", port, s.Master().Port())
		}
		return nil
	})
	if got, err := fc.Get(ctx, "before").Result(); err != nil || got != "1" {
		t.Errorf("GET before = %q, %v; want 1", got, err)
	}
}
