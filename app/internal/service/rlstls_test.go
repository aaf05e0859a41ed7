package service

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

// rlsCA is a test certificate authority (ECDSA P-256).
type rlsCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newRLSCA(t *testing.T, name string) *rlsCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &rlsCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a certificate with serial, valid until notAfter: a server's
// for 127.0.0.1 and localhost, or a client's. It returns the certificate
// and its key in PEM.
func (ca *rlsCA) issue(t *testing.T, serial int64, server bool, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "client"},
		NotBefore:    notAfter.Add(-48 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.Subject.CommonName = "localhost"
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
}

// clientCert is a client's key pair from ca.
func (ca *rlsCA) clientCert(t *testing.T) *tls.Certificate {
	t.Helper()
	certPEM, keyPEM := ca.issue(t, 100, false, time.Now().Add(time.Hour))
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &pair
}

// replaceFile writes data to dir/name as a rotation does: to a new file
// renamed over the old one.
func replaceFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p+".new", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
	return p
}

// tlsDoor is the TLS settings of a gRPC door served with a certificate of
// ca (serial 1), and the directory of its files.
func tlsDoor(t *testing.T, ca *rlsCA) (env map[string]string, dir string) {
	t.Helper()
	dir = t.TempDir()
	certPEM, keyPEM := ca.issue(t, 1, true, time.Now().Add(time.Hour))
	rlsDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(rlsDir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"RL_GRPC_ADDR":          "127.0.0.1:0",
		"RL_RLS_CONFIG_DIR":     rlsDir,
		"RL_GRPC_TLS_CERT_FILE": replaceFile(t, dir, "server.pem", certPEM),
		"RL_GRPC_TLS_KEY_FILE":  replaceFile(t, dir, "server-key.pem", keyPEM),
	}, dir
}

// tlsClient connects to addr over TLS, trusting roots and presenting
// cert (nil: none).
func tlsClient(t *testing.T, addr string, roots *rlsCA, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(roots.cert)
	cfg := &tls.Config{RootCAs: pool}
	if cert != nil {
		// Sent whatever CAs the door asks for (Go's client skips a
		// certificate from another CA, with Certificates).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// askRLS makes one ShouldRateLimit call for k=v of domain d.
func askRLS(conn *grpc.ClientConn) (pb.RateLimitResponse_Code, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return 0, err
	}
	return r.OverallCode, nil
}

// assertLimitOf3 asserts that the limit of 3 a minute of tlsDoor admits
// exactly 3 calls through conn and refuses the next.
func assertLimitOf3(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	var codes []pb.RateLimitResponse_Code
	for range 4 {
		code, err := askRLS(conn)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code)
	}
	ok, over := pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT
	if codes[0] != ok || codes[1] != ok || codes[2] != ok || codes[3] != over {
		t.Fatalf("codes %v, want OK, OK, OK, OVER_LIMIT", codes)
	}
}

// servedSerial is the serial of the certificate the door presents to a
// new connection, read from a health check over it.
func servedSerial(t *testing.T, addr string, roots *rlsCA, cert *tls.Certificate) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := tlsClient(t, addr, roots, cert)
	defer conn.Close()
	var p peer.Peer
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v, want SERVING", h.Status)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		t.Fatalf("peer %+v: no TLS certificate", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber.Int64()
}

// TestRLSTLS: with a certificate and key the door serves TLS: a TLS client
// gets the health service and the decisions (a limit of 3 admits exactly
// 3), a plaintext client gets nothing, and the start is logged with tls
// on and mtls off.
func TestRLSTLS(t *testing.T) {
	ca := newRLSCA(t, "ca")
	env, _ := tlsDoor(t, ca)
	s, stdout := startServer(t, env)
	if serial := servedSerial(t, s.GRPCAddr(), ca, nil); serial != 1 {
		t.Fatalf("served serial %d, want 1", serial)
	}
	assertLimitOf3(t, tlsClient(t, s.GRPCAddr(), ca, nil))

	plain, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if code, err := askRLS(plain); err == nil {
		t.Fatalf("a plaintext client got %v", code)
	}
	if !strings.Contains(stdout.String(), `"tls":true,"mtls":false`) {
		t.Fatalf("no tls true, mtls false in the log:\n%s", stdout)
	}
}

// TestRLSMTLS: with a client CA file as well, a client with a certificate
// the CA signed gets decisions; one without a certificate, or with one
// from another CA, gets nothing.
func TestRLSMTLS(t *testing.T) {
	ca, other := newRLSCA(t, "ca"), newRLSCA(t, "other")
	env, dir := tlsDoor(t, ca)
	env["RL_GRPC_TLS_CLIENT_CA_FILE"] = replaceFile(t, dir, "clients.pem", ca.pem)
	s, stdout := startServer(t, env)

	assertLimitOf3(t, tlsClient(t, s.GRPCAddr(), ca, ca.clientCert(t)))
	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "another CA's certificate": other.clientCert(t)} {
		if code, err := askRLS(tlsClient(t, s.GRPCAddr(), ca, cert)); err == nil {
			t.Errorf("a client with %s got %v", name, code)
		}
	}
	if !strings.Contains(stdout.String(), `"tls":true,"mtls":true`) {
		t.Fatalf("no tls true, mtls true in the log:\n%s", stdout)
	}
}

// TestRLSTLSRotation: the door presents, to each new connection, the pair
// last read well from the files, without a restart: a new pair renamed
// over the old (serial 2); then a certificate whose key has not been
// written yet, which leaves serial 2 in service; then its key (serial 3).
// Likewise the client CA file: replaced by another CA's, that CA's
// clients get in and the first CA's no longer do.
func TestRLSTLSRotation(t *testing.T) {
	ca, other := newRLSCA(t, "ca"), newRLSCA(t, "other")
	env, dir := tlsDoor(t, ca)
	env["RL_GRPC_TLS_CLIENT_CA_FILE"] = replaceFile(t, dir, "clients.pem", ca.pem)
	s, _ := startServer(t, env)
	addr, client := s.GRPCAddr(), ca.clientCert(t)
	if serial := servedSerial(t, addr, ca, client); serial != 1 {
		t.Fatalf("served serial %d, want 1", serial)
	}

	certPEM, keyPEM := ca.issue(t, 2, true, time.Now().Add(time.Hour))
	replaceFile(t, dir, "server.pem", certPEM)
	replaceFile(t, dir, "server-key.pem", keyPEM)
	if serial := servedSerial(t, addr, ca, client); serial != 2 {
		t.Fatalf("after the rotation: served serial %d, want 2", serial)
	}

	certPEM, keyPEM = ca.issue(t, 3, true, time.Now().Add(time.Hour))
	replaceFile(t, dir, "server.pem", certPEM)
	if serial := servedSerial(t, addr, ca, client); serial != 2 {
		t.Fatalf("with the new certificate but the old key: served serial %d, want 2 (the last good pair)", serial)
	}
	replaceFile(t, dir, "server-key.pem", keyPEM)
	if serial := servedSerial(t, addr, ca, client); serial != 3 {
		t.Fatalf("with its key: served serial %d, want 3", serial)
	}

	replaceFile(t, dir, "clients.pem", other.pem)
	if serial := servedSerial(t, addr, ca, other.clientCert(t)); serial != 3 {
		t.Fatalf("the new CA's client: served serial %d, want 3", serial)
	}
	if code, err := askRLS(tlsClient(t, addr, ca, client)); err == nil {
		t.Fatalf("the old CA's client got %v after the CA file changed", code)
	}
}

// TestRLSTLSConfig: the settings build a configuration of TLS 1.2 or later
// that presents the certificate read and, with a client CA file, requires
// and verifies client certificates.
func TestRLSTLSConfig(t *testing.T) {
	ca := newRLSCA(t, "ca")
	env, dir := tlsDoor(t, ca)
	cfg, err := LoadConfig(envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.GRPCTLSConfig
	if c == nil || c.MinVersion != tls.VersionTLS12 || c.ClientAuth != tls.NoClientCert {
		t.Fatalf("TLS configuration %+v, want TLS 1.2 and no client certificates", c)
	}
	pair, err := c.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || pair.Leaf == nil || pair.Leaf.SerialNumber.Int64() != 1 {
		t.Fatalf("GetCertificate: %v %v, want serial 1", pair, err)
	}

	env["RL_GRPC_TLS_CLIENT_CA_FILE"] = replaceFile(t, dir, "clients.pem", ca.pem)
	if cfg, err = LoadConfig(envOf(env)); err != nil {
		t.Fatal(err)
	}
	c = cfg.GRPCTLSConfig
	if c == nil || c.MinVersion != tls.VersionTLS12 || c.ClientAuth != tls.RequireAndVerifyClientCert || c.ClientCAs == nil {
		t.Fatalf("TLS configuration %+v, want TLS 1.2 requiring and verifying client certificates", c)
	}
}

// TestRLSTLSConfigErrors: each unusable RL_GRPC_TLS* setting stops the
// start with an error naming the variable at fault.
func TestRLSTLSConfigErrors(t *testing.T) {
	ca := newRLSCA(t, "ca")
	env, dir := tlsDoor(t, ca)
	_, otherKeyPEM := ca.issue(t, 2, true, time.Now().Add(time.Hour))
	expiry := time.Now().Add(-time.Hour).Truncate(time.Second)
	expiredPEM, expiredKeyPEM := ca.issue(t, 3, true, expiry)
	write := func(name, body string) string { return replaceFile(t, dir, name, []byte(body)) }
	missing := filepath.Join(dir, "missing.pem")
	notPEM := write("not.pem", "not a certificate\n")
	badCert := write("bad-cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	badKey := write("bad-key.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	otherKey := write("other-key.pem", string(otherKeyPEM))
	expired, expiredKey := write("expired.pem", string(expiredPEM)), write("expired-key.pem", string(expiredKeyPEM))
	caFile := write("clients.pem", string(ca.pem))

	tests := []struct {
		name    string
		env     map[string]string // over env; "" unsets
		wantVar string
		wantMsg string // the message contains it
	}{
		{"certificate without key", map[string]string{"RL_GRPC_TLS_KEY_FILE": ""}, "RL_GRPC_TLS_KEY_FILE", "needed with RL_GRPC_TLS_CERT_FILE"},
		{"key without certificate", map[string]string{"RL_GRPC_TLS_CERT_FILE": ""}, "RL_GRPC_TLS_CERT_FILE", "needed with RL_GRPC_TLS_KEY_FILE"},
		{"client CA without TLS", map[string]string{"RL_GRPC_TLS_CERT_FILE": "", "RL_GRPC_TLS_KEY_FILE": "", "RL_GRPC_TLS_CLIENT_CA_FILE": caFile},
			"RL_GRPC_TLS_CLIENT_CA_FILE", "needs RL_GRPC_TLS_CERT_FILE and RL_GRPC_TLS_KEY_FILE"},
		{"TLS without the door", map[string]string{"RL_GRPC_ADDR": ""}, "RL_GRPC_TLS_CERT_FILE", "needs RL_GRPC_ADDR"},
		{"key without the door", map[string]string{"RL_GRPC_ADDR": "", "RL_GRPC_TLS_CERT_FILE": ""}, "RL_GRPC_TLS_KEY_FILE", "needs RL_GRPC_ADDR"},
		{"client CA without the door", map[string]string{"RL_GRPC_ADDR": "", "RL_GRPC_TLS_CERT_FILE": "", "RL_GRPC_TLS_KEY_FILE": "", "RL_GRPC_TLS_CLIENT_CA_FILE": caFile},
			"RL_GRPC_TLS_CLIENT_CA_FILE", "needs RL_GRPC_ADDR"},
		{"certificate missing", map[string]string{"RL_GRPC_TLS_CERT_FILE": missing}, "RL_GRPC_TLS_CERT_FILE", missing},
		{"certificate not PEM", map[string]string{"RL_GRPC_TLS_CERT_FILE": notPEM}, "RL_GRPC_TLS_CERT_FILE", notPEM + ": no PEM certificate"},
		{"certificate unparsable", map[string]string{"RL_GRPC_TLS_CERT_FILE": badCert}, "RL_GRPC_TLS_CERT_FILE", badCert + ": x509: "},
		{"certificate expired", map[string]string{"RL_GRPC_TLS_CERT_FILE": expired, "RL_GRPC_TLS_KEY_FILE": expiredKey},
			"RL_GRPC_TLS_CERT_FILE", "expired at " + expiry.UTC().Format(time.RFC3339)},
		{"key missing", map[string]string{"RL_GRPC_TLS_KEY_FILE": missing}, "RL_GRPC_TLS_KEY_FILE", missing},
		{"key unparsable", map[string]string{"RL_GRPC_TLS_KEY_FILE": badKey}, "RL_GRPC_TLS_KEY_FILE", badKey + ": tls: "},
		{"key of another certificate", map[string]string{"RL_GRPC_TLS_KEY_FILE": otherKey}, "RL_GRPC_TLS_KEY_FILE", "private key does not match public key"},
		{"client CA missing", map[string]string{"RL_GRPC_TLS_CLIENT_CA_FILE": missing}, "RL_GRPC_TLS_CLIENT_CA_FILE", missing},
		{"client CA not PEM", map[string]string{"RL_GRPC_TLS_CLIENT_CA_FILE": notPEM}, "RL_GRPC_TLS_CLIENT_CA_FILE", notPEM + ": no PEM certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			all := map[string]string{}
			for k, v := range env {
				all[k] = v
			}
			for k, v := range tc.env {
				all[k] = v
			}
			_, err := LoadConfig(envOf(all))
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Var != tc.wantVar || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error %v, want one of %s containing %q", err, tc.wantVar, tc.wantMsg)
			}
		})
	}
}
