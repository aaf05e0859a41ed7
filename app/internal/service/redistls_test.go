package service

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/redistest"
)

// tlsEnv returns the settings of a client of certs: RL_REDIS_TLS, the CA
// and the client certificate.
func tlsEnv(certs *redistest.Certificates) map[string]string {
	return map[string]string{
		"RL_REDIS_TLS":           "true",
		"RL_REDIS_TLS_CA_FILE":   certs.CAFile,
		"RL_REDIS_TLS_CERT_FILE": certs.ClientCert,
		"RL_REDIS_TLS_KEY_FILE":  certs.ClientKey,
	}
}

// with returns a copy of base with kv added ("" deletes).
func with(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

// TestRedisTLSConfigErrors: every unusable combination of the
// RL_REDIS_TLS* settings is a ConfigError naming the variable to fix, and
// a file or server name never goes unused with TLS off.
func TestRedisTLSConfigErrors(t *testing.T) {
	certs := redistest.NewCertificates(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{"RL_INSTANCE": "t", "RL_REDIS_ADDRS": "127.0.0.1:6379"}
	on := with(addrs, "RL_REDIS_TLS", "true")
	good := with(addrs, "RL_REDIS_TLS", "true", "RL_REDIS_TLS_CA_FILE", certs.CAFile,
		"RL_REDIS_TLS_CERT_FILE", certs.ClientCert, "RL_REDIS_TLS_KEY_FILE", certs.ClientKey)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
		wantMsg string // the message holds it
	}{
		{"CA file with TLS off", with(addrs, "RL_REDIS_TLS_CA_FILE", certs.CAFile), "RL_REDIS_TLS_CA_FILE", "set RL_REDIS_TLS=true or use a rediss:// URL"},
		{"cert file with TLS off", with(addrs, "RL_REDIS_TLS_CERT_FILE", certs.ClientCert, "RL_REDIS_TLS_KEY_FILE", certs.ClientKey), "RL_REDIS_TLS_CERT_FILE", "RL_REDIS_TLS=true"},
		{"key file with TLS off", with(addrs, "RL_REDIS_TLS_KEY_FILE", certs.ClientKey), "RL_REDIS_TLS_KEY_FILE", "RL_REDIS_TLS=true"},
		{"server name with TLS off", with(addrs, "RL_REDIS_TLS_SERVER_NAME", "redis.test"), "RL_REDIS_TLS_SERVER_NAME", "RL_REDIS_TLS=true"},
		{"server name with a redis:// URL", map[string]string{"RL_REDIS_URL": "redis://127.0.0.1:6379/0", "RL_REDIS_TLS_SERVER_NAME": "redis.test"}, "RL_REDIS_TLS_SERVER_NAME", "rediss://"},
		{"TLS with a redis:// URL", map[string]string{"RL_REDIS_URL": "redis://127.0.0.1:6379/0", "RL_REDIS_TLS": "true"}, "RL_REDIS_TLS", "use rediss://"},
		{"TLS without Redis", map[string]string{"RL_REDIS_TLS": "true"}, "RL_REDIS_TLS", "without Redis"},
		{"cert without key", with(good, "RL_REDIS_TLS_KEY_FILE", ""), "RL_REDIS_TLS_KEY_FILE", "not set"},
		{"key without cert", with(good, "RL_REDIS_TLS_CERT_FILE", ""), "RL_REDIS_TLS_CERT_FILE", "not set"},
		{"CA file missing", with(on, "RL_REDIS_TLS_CA_FILE", missing), "RL_REDIS_TLS_CA_FILE", "no such file"},
		{"CA file not PEM", with(on, "RL_REDIS_TLS_CA_FILE", notPEM), "RL_REDIS_TLS_CA_FILE", "holds no PEM certificate"},
		{"CA file holds a key", with(on, "RL_REDIS_TLS_CA_FILE", certs.ClientKey), "RL_REDIS_TLS_CA_FILE", "holds no PEM certificate"},
		{"cert file missing", with(good, "RL_REDIS_TLS_CERT_FILE", missing), "RL_REDIS_TLS_CERT_FILE", "no such file"},
		{"cert file not PEM", with(good, "RL_REDIS_TLS_CERT_FILE", notPEM), "RL_REDIS_TLS_CERT_FILE", "PEM certificate"},
		{"key file missing", with(good, "RL_REDIS_TLS_KEY_FILE", missing), "RL_REDIS_TLS_KEY_FILE", "no such file"},
		{"key of another certificate", with(good, "RL_REDIS_TLS_KEY_FILE", certs.ServerKey), "RL_REDIS_TLS_KEY_FILE", "does not match"},
		{"expired client certificate", with(good, "RL_REDIS_TLS_CERT_FILE", certs.ExpiredClientCert, "RL_REDIS_TLS_KEY_FILE", certs.ExpiredClientKey), "RL_REDIS_TLS_CERT_FILE", "expired at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadConfig(envOf(with(tt.env, "RL_INSTANCE", "t")))
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Var != tt.wantVar || !strings.HasPrefix(err.Error(), tt.wantVar+": ") || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error = %v, want a ConfigError for %s saying %q", err, tt.wantVar, tt.wantMsg)
			}
		})
	}
}

// TestRedisTLSConfig: what RedisTLSConfig holds for each way of turning
// TLS on, and that it is nil with TLS off.
func TestRedisTLSConfig(t *testing.T) {
	certs := redistest.NewCertificates(t)
	load := func(env map[string]string) *tls.Config {
		t.Helper()
		cfg, err := LoadConfig(envOf(with(env, "RL_INSTANCE", "t")))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.RedisTLSConfig
	}
	if c := load(map[string]string{"RL_REDIS_URL": "redis://127.0.0.1:6379/0"}); c != nil {
		t.Errorf("redis:// URL: RedisTLSConfig %+v, want nil", c)
	}
	c := load(map[string]string{"RL_REDIS_URL": "rediss://127.0.0.1:6379/0"})
	if c == nil || c.MinVersion != tls.VersionTLS12 || c.RootCAs != nil || len(c.Certificates) != 0 || c.InsecureSkipVerify {
		t.Errorf("rediss:// URL alone: %+v, want TLS 1.2 at least and the system roots", c)
	}
	if c := load(map[string]string{"RL_REDIS_URL": "rediss://127.0.0.1:6379/0?skip_verify=true"}); c == nil || !c.InsecureSkipVerify {
		t.Errorf("rediss:// URL with skip_verify: %+v, want InsecureSkipVerify kept", c)
	}
	c = load(with(tlsEnv(certs), "RL_REDIS_ADDRS", "127.0.0.1:7000,127.0.0.1:7001", "RL_REDIS_TLS_SERVER_NAME", "redis.test"))
	if c == nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "redis.test" || c.MinVersion != tls.VersionTLS12 {
		t.Errorf("RL_REDIS_ADDRS with TLS: %+v, want the CA, the client certificate and the server name", c)
	}
}

// TestRedisTLSServes: with TLS to a server that requires a client
// certificate, by RL_REDIS_ADDRS with RL_REDIS_TLS or by a rediss:// URL,
// the service decides in Redis: a limit of 5 admits 5, and a second
// instance on the same Redis finds the key spent.
func TestRedisTLSServes(t *testing.T) {
	certs := redistest.NewCertificates(t)
	srv := redistest.StartServer(t, redistest.ServerOptions{TLS: &redistest.TLSOptions{Certs: certs}})
	policy := writePolicyFile(t, `{"policies": [{"name": "x", "algorithm": "sliding_window_log", "limit": 5, "window": "1h"}], `+routesDefault+`}`)
	for name, env := range map[string]map[string]string{
		"addrs":  with(tlsEnv(certs), "RL_REDIS_ADDRS", srv.Addr()),
		"rediss": with(tlsEnv(certs), "RL_REDIS_TLS", "", "RL_REDIS_URL", "rediss://"+srv.Addr()+"/0"),
	} {
		t.Run(name, func(t *testing.T) {
			env = with(env, "RL_POLICY_FILE", policy, "RL_DEBUG_HEADERS", "true", "RL_REDIS_TIMEOUT", "500ms")
			key := "tls-" + name
			s, _ := startServer(t, env)
			codes := map[int]int{}
			for range 7 {
				resp, body := get(t, "http://"+s.PublicAddr()+"/api/x", "X-API-Key", key)
				codes[resp.StatusCode]++
				if mode := resp.Header.Get("X-RateLimit-Mode"); mode != "redis" {
					t.Fatalf("X-RateLimit-Mode %q (status %d, %s), want redis", mode, resp.StatusCode, body)
				}
			}
			if codes[http.StatusOK] != 5 || codes[http.StatusTooManyRequests] != 2 {
				t.Errorf("answers %v, want 5 admitted and 2 limited", codes)
			}
			other, _ := startServer(t, with(env, "RL_INSTANCE", "test-2"))
			if resp, _ := get(t, "http://"+other.PublicAddr()+"/api/x", "X-API-Key", key); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-RateLimit-Mode") != "redis" {
				t.Errorf("another instance: %d, mode %s; want 429 from Redis", resp.StatusCode, resp.Header.Get("X-RateLimit-Mode"))
			}
		})
	}
}

// startErr starts the service with env added to startServer's defaults and
// returns its log and Start's error; a service that starts is stopped at
// once.
func startErr(t *testing.T, env map[string]string) (logs string, err error) {
	t.Helper()
	all := with(env, "RL_INSTANCE", "test-1", "RL_LISTEN_ADDR", "127.0.0.1:0", "RL_ADMIN_ADDR", "127.0.0.1:0", "RL_JOURNAL_DIR", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout := &syncBuffer{}
	s, err := Start(ctx, envOf(all), stdout, io.Discard)
	if err != nil {
		return stdout.String(), err
	}
	cancel()
	if err := s.Wait(); err != nil {
		t.Errorf("Wait: %v", err)
	}
	return stdout.String(), nil
}

// TestRedisTLSStartErrors: a certificate problem stops the start with a
// ConfigError naming the setting to fix, whichever side it is on; a
// password the check does not send, or a Redis not reachable at all, does
// not.
func TestRedisTLSStartErrors(t *testing.T) {
	certs := redistest.NewCertificates(t)
	srv := redistest.StartServer(t, redistest.ServerOptions{TLS: &redistest.TLSOptions{Certs: certs}})
	expired := redistest.StartServer(t, redistest.ServerOptions{TLS: &redistest.TLSOptions{Certs: certs, ExpiredCert: true}})
	plain := redistest.StartServer(t, redistest.ServerOptions{})
	locked := redistest.StartServer(t, redistest.ServerOptions{Password: "s3cret", TLS: &redistest.TLSOptions{Certs: certs}})
	env := tlsEnv(certs)
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string // "": the start succeeds
		wantMsg string
	}{
		{"wrong CA", with(env, "RL_REDIS_ADDRS", srv.Addr(), "RL_REDIS_TLS_CA_FILE", certs.OtherCAFile), "RL_REDIS_TLS_CA_FILE", "is not signed by a CA in RL_REDIS_TLS_CA_FILE"},
		{"wrong CA, rediss:// URL", with(env, "RL_REDIS_TLS", "", "RL_REDIS_URL", "rediss://"+srv.Addr()+"/0", "RL_REDIS_TLS_CA_FILE", certs.OtherCAFile), "RL_REDIS_TLS_CA_FILE", "is not signed"},
		{"system roots", with(env, "RL_REDIS_ADDRS", srv.Addr(), "RL_REDIS_TLS_CA_FILE", ""), "RL_REDIS_TLS_CA_FILE", "the system's roots"},
		{"expired server certificate", with(env, "RL_REDIS_ADDRS", expired.Addr()), "RL_REDIS_TLS_CA_FILE", "(the server's, checked against RL_REDIS_TLS_CA_FILE"},
		{"wrong server name", with(env, "RL_REDIS_ADDRS", srv.Addr(), "RL_REDIS_TLS_SERVER_NAME", "other.test"), "RL_REDIS_TLS_SERVER_NAME", "other.test"},
		{"no client certificate", with(env, "RL_REDIS_ADDRS", srv.Addr(), "RL_REDIS_TLS_CERT_FILE", "", "RL_REDIS_TLS_KEY_FILE", ""), "RL_REDIS_TLS_CERT_FILE", "refused the client certificate"},
		{"plaintext server", with(env, "RL_REDIS_ADDRS", plain.Addr()), "RL_REDIS_TLS", "does not speak TLS"},
		// The first bad address fails the start, the good ones aside.
		{"one bad address of two", with(env, "RL_REDIS_ADDRS", srv.Addr()+","+expired.Addr()), "RL_REDIS_TLS_CA_FILE", expired.Addr()},
		{"a password is not the check's business", with(env, "RL_REDIS_ADDRS", locked.Addr()), "", ""},
		{"server name it holds", with(env, "RL_REDIS_ADDRS", srv.Addr(), "RL_REDIS_TLS_SERVER_NAME", "redis.test"), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs, err := startErr(t, tt.env)
			if tt.wantVar == "" {
				if err != nil {
					t.Fatalf("Start: %v, want a start", err)
				}
				if strings.Contains(logs, "Redis not reached to check TLS") {
					t.Errorf("the check logged an unreachable Redis:\n%s", logs)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Var != tt.wantVar || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Start: %v, want a ConfigError for %s saying %q", err, tt.wantVar, tt.wantMsg)
			}
		})
	}
}

// TestRedisTLSUnreachable: with TLS on and nothing listening, the start
// goes on (the fallback serves) and the check says so at warn.
func TestRedisTLSUnreachable(t *testing.T) {
	certs := redistest.NewCertificates(t)
	s, logs := startServer(t, with(tlsEnv(certs), "RL_REDIS_ADDRS", deadAddr(t), "RL_DEBUG_HEADERS", "true"))
	if resp, _ := get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-API-Key", "k"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Mode") != "local" {
		t.Errorf("with Redis unreachable: %d, mode %s; want 200 decided locally", resp.StatusCode, resp.Header.Get("X-RateLimit-Mode"))
	}
	if !strings.Contains(logs.String(), `"level":"WARN","msg":"Redis not reached to check TLS at start`) {
		t.Errorf("no warning about the unreachable Redis:\n%s", logs)
	}
}
