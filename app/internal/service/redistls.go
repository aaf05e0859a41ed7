// TLS to Redis: the RL_REDIS_TLS* settings, and the check at start that
// a certificate problem is a configuration error, not an outage.

package service

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// validateRedisTLS checks the RL_REDIS_TLS* settings and builds
// RedisTLSConfig.
//
// TLS is on with RL_REDIS_TLS=true (for RL_REDIS_ADDRS or a rediss://
// RL_REDIS_URL) or with a rediss:// URL alone. A file or server name set
// while TLS is off is an error, never a silent plaintext connection, as is
// RL_REDIS_TLS=true with a redis:// URL or without any Redis. With TLS on,
// RedisTLSConfig is always built (TLS 1.2 at least): the CA file's
// certificates verify the server (none: the system's roots), the client
// certificate is presented, and the server name, when set, is the name
// every server's certificate must hold (otherwise each connection checks
// the host it dials). A rediss:// URL's skip_verify is kept. A client
// certificate is checked against the current time: an expired one is an
// error here rather than a refusal by every server later.
func (c *Config) validateRedisTLS() error {
	scheme, _, _ := strings.Cut(c.RedisURL, "://")
	rediss := strings.EqualFold(scheme, "rediss")
	if !c.RedisTLS && !rediss {
		for _, s := range []struct{ name, value string }{
			{"RL_REDIS_TLS_CA_FILE", c.RedisTLSCAFile},
			{"RL_REDIS_TLS_CERT_FILE", c.RedisTLSCertFile},
			{"RL_REDIS_TLS_KEY_FILE", c.RedisTLSKeyFile},
			{"RL_REDIS_TLS_SERVER_NAME", c.RedisTLSServerName},
		} {
			if s.value != "" {
				return configErr(s.name, "set while TLS to Redis is off, which would connect in plaintext: set RL_REDIS_TLS=true or use a rediss:// URL")
			}
		}
		return nil
	}
	switch {
	case !c.RedisEnabled():
		return configErr("RL_REDIS_TLS", "true without Redis: set RL_REDIS_URL or RL_REDIS_ADDRS")
	case c.RedisURL != "" && !rediss:
		return configErr("RL_REDIS_TLS", "true with a %s:// URL in RL_REDIS_URL: use rediss://", scheme)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.RedisTLSServerName}
	if rediss {
		// The URL parsed in validate; skip_verify is its explicit choice.
		if u, err := redis.ParseURL(c.RedisURL); err == nil && u.TLSConfig != nil {
			cfg.InsecureSkipVerify = u.TLSConfig.InsecureSkipVerify
		}
	}
	if c.RedisTLSCAFile != "" {
		b, err := os.ReadFile(c.RedisTLSCAFile)
		if err != nil {
			return configErr("RL_REDIS_TLS_CA_FILE", "%w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return configErr("RL_REDIS_TLS_CA_FILE", "%s holds no PEM certificate", c.RedisTLSCAFile)
		}
	}
	switch {
	case c.RedisTLSCertFile != "" && c.RedisTLSKeyFile == "":
		return configErr("RL_REDIS_TLS_KEY_FILE", "not set, but RL_REDIS_TLS_CERT_FILE is: the client certificate needs its key")
	case c.RedisTLSKeyFile != "" && c.RedisTLSCertFile == "":
		return configErr("RL_REDIS_TLS_CERT_FILE", "not set, but RL_REDIS_TLS_KEY_FILE is: the key needs its client certificate")
	case c.RedisTLSCertFile != "":
		pair, err := loadClientCert(c.RedisTLSCertFile, c.RedisTLSKeyFile, time.Now())
		if err != nil {
			return err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	c.RedisTLSConfig = cfg
	return nil
}

// loadClientCert loads the client certificate and its key, and checks that
// the certificate is valid at now. Its errors name the file at fault.
func loadClientCert(certFile, keyFile string, now time.Time) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, configErr("RL_REDIS_TLS_CERT_FILE", "%w", err)
	}
	if block, _ := pem.Decode(certPEM); block == nil || block.Type != "CERTIFICATE" {
		return tls.Certificate{}, configErr("RL_REDIS_TLS_CERT_FILE", "%s does not start with a PEM certificate", certFile)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, configErr("RL_REDIS_TLS_KEY_FILE", "%w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, configErr("RL_REDIS_TLS_KEY_FILE", "%s with the certificate of RL_REDIS_TLS_CERT_FILE (%s): %w", keyFile, certFile, err)
	}
	leaf := pair.Leaf
	if leaf == nil { // X509KeyPair fills it since Go 1.23
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return tls.Certificate{}, configErr("RL_REDIS_TLS_CERT_FILE", "%w", err)
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		return tls.Certificate{}, configErr("RL_REDIS_TLS_CERT_FILE", "the client certificate in %s expired at %s", certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return tls.Certificate{}, configErr("RL_REDIS_TLS_CERT_FILE", "the client certificate in %s is not valid before %s", certFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return pair, nil
}

// redisTLSCheckMin is the least time the check at start gives each
// address, whatever RL_REDIS_TIMEOUT: a TLS handshake takes two round
// trips and some cryptography.
const redisTLSCheckMin = time.Second

// checkRedisTLS opens one TLS connection to each configured address (the
// URL's host, or every entry of RL_REDIS_ADDRS: Cluster seeds or
// Sentinels), all at once, and sends a PING. A certificate problem is a
// *ConfigError naming the setting to fix: it would refuse every
// connection, and the limiter would run on its fallback with no end in
// sight. An address that cannot be reached (refused, timed out, unknown)
// is logged and ignored: Redis being down at start is an outage the
// fallback serves, not a configuration error. Each address gets
// max(RL_REDIS_TIMEOUT, 1s) for the handshake and as much again for the
// PING (or for the probe that tells a plaintext server from a silent one).
// The first error in address order wins.
func checkRedisTLS(ctx context.Context, c Config, log *slog.Logger) error {
	addrs := c.RedisAddrs
	if c.RedisURL != "" {
		u, err := redis.ParseURL(c.RedisURL)
		if err != nil {
			// validate parsed it already; its error may quote the password
			return configErr("RL_REDIS_URL", "not a Redis URL")
		}
		addrs = []string{u.Addr} // its host is the server name, as in redisstore
	}
	bound := max(c.RedisTimeout, redisTLSCheckMin)
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			err := probeRedisTLS(ctx, addr, c.RedisTLSConfig, bound)
			if err == nil {
				return
			}
			if cerr := classifyRedisTLS(addr, c, err); cerr != nil {
				errs[i] = cerr
				return
			}
			log.Warn("Redis not reached to check TLS at start; the fallback serves until it answers",
				slog.String("addr", addr), slog.String("error", err.Error()))
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// errPlaintext reports a server that answered a plaintext PING after
// leaving a TLS handshake unanswered (Redis never answers a ClientHello:
// its NUL bytes stop the inline parser).
var errPlaintext = errors.New("answers plaintext, not TLS")

// ping is a PING in RESP.
const ping = "*1\r\n$4\r\nPING\r\n"

// probeRedisTLS does a TLS handshake with addr and a PING over it, each
// within bound, and returns what failed. A handshake that times out is
// followed by a plaintext PING: an answer gives errPlaintext.
func probeRedisTLS(ctx context.Context, addr string, cfg *tls.Config, bound time.Duration) error {
	hctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(hctx, "tcp", addr)
	if err != nil {
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			if perr := pingPlain(ctx, addr, bound); perr == nil {
				return errPlaintext
			}
		}
		return err
	}
	defer conn.Close()
	// In TLS 1.3 the server checks the client's certificate after the
	// client has finished its handshake: its refusal (an alert) comes
	// with the first read.
	_, err = roundTrip(conn, bound)
	return err
}

// pingPlain sends a plaintext PING to addr and returns nil if a RESP
// reply came back within bound.
func pingPlain(ctx context.Context, addr string, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = roundTrip(conn, bound)
	return err
}

// roundTrip sends a PING on conn and returns the first line of the reply,
// within bound. Any RESP reply will do: a server that wants a password
// answers -NOAUTH, which still shows that it speaks.
func roundTrip(conn net.Conn, bound time.Duration) (string, error) {
	if err := conn.SetDeadline(time.Now().Add(bound)); err != nil {
		return "", err
	}
	_, werr := conn.Write([]byte(ping))
	// Read even when the write failed: a server that refused our
	// certificate may have sent its alert and reset the connection
	// before the PING went out, and the alert says why.
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		var opErr *net.OpError
		if werr != nil && !(errors.As(err, &opErr) && opErr.Op == "remote error") {
			return "", werr
		}
		return "", err
	}
	if line == "" || !strings.ContainsRune("+-:$*", rune(line[0])) {
		return "", fmt.Errorf("not a Redis reply: %q", strings.TrimSpace(line))
	}
	return line, nil
}

// classifyRedisTLS turns what a probe of addr returned into a *ConfigError
// naming the setting to fix, or nil when addr was merely unreachable.
func classifyRedisTLS(addr string, c Config, err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		record   tls.RecordHeaderError
		opErr    *net.OpError
	)
	roots := "the system's roots (RL_REDIS_TLS_CA_FILE is not set)"
	if c.RedisTLSCAFile != "" {
		roots = "RL_REDIS_TLS_CA_FILE (" + c.RedisTLSCAFile + ")"
	}
	switch {
	case errors.As(err, &unknown):
		return configErr("RL_REDIS_TLS_CA_FILE", "%s's certificate is not signed by a CA in %s: %v", addr, roots, err)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired && invalid.Cert != nil:
		return configErr("RL_REDIS_TLS_CA_FILE", "%s's certificate (the server's, checked against %s) expired at %s", addr, roots, invalid.Cert.NotAfter.UTC().Format(time.RFC3339))
	case errors.As(err, &invalid):
		return configErr("RL_REDIS_TLS_CA_FILE", "%s's certificate does not verify against %s: %v", addr, roots, err)
	case errors.As(err, &hostname):
		return configErr("RL_REDIS_TLS_SERVER_NAME", "%s's certificate does not hold the name the client checks: %v (set RL_REDIS_TLS_SERVER_NAME to a name it holds)", addr, err)
	case errors.As(err, &record), errors.Is(err, errPlaintext):
		return configErr("RL_REDIS_TLS", "%s does not speak TLS (%v): turn TLS on in Redis, or off here", addr, err)
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		// An alert from the server: it refused the handshake, in TLS 1.3
		// most often because of our certificate or its absence.
		if strings.Contains(err.Error(), "certificate") {
			return configErr("RL_REDIS_TLS_CERT_FILE", "%s refused the client certificate (%v): RL_REDIS_TLS_CERT_FILE and RL_REDIS_TLS_KEY_FILE must hold one its CA signed", addr, err)
		}
		return configErr("RL_REDIS_TLS", "%s refused the TLS handshake: %v", addr, err)
	}
	// Refused, reset, closed, timed out or not resolved: nothing said
	// about TLS.
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	return configErr("RL_REDIS_TLS", "TLS with %s: %v", addr, err)
}
