// TLS for the helper's servers: a throwaway PKI in PEM files
// (NewCertificates) and the options that make a server speak TLS only
// (TLSOptions).

package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Certificates is a throwaway PKI made by NewCertificates: PEM files in a
// t.TempDir, for redis-server's --tls-* arguments and for clients. The
// fields are file paths; a key file holds a PKCS #8 ECDSA P-256 key. The
// zero value is not usable; a Certificates is read-only, so safe for
// concurrent use.
type Certificates struct {
	// CAFile is the CA that signs every certificate below but OtherCAFile.
	CAFile string
	// ServerCert and ServerKey: the servers' certificate, for IP 127.0.0.1,
	// DNS localhost and DNS redis.test, usable as a client certificate too
	// (replication, the cluster bus and Sentinels' links are TLS clients).
	ServerCert, ServerKey string
	// ClientCert and ClientKey: a client certificate (ClientTLS presents it).
	ClientCert, ClientKey string
	// ExpiredClientCert and ExpiredClientKey: a client certificate whose
	// NotAfter is a day in the past.
	ExpiredClientCert, ExpiredClientKey string
	// ExpiredServerCert and ExpiredServerKey: the server certificate's
	// twin, expired a day ago (TLSOptions.ExpiredCert serves it).
	ExpiredServerCert, ExpiredServerKey string
	// OtherCAFile is an unrelated CA, which signed none of the above: a
	// client that trusts only it fails with x509.UnknownAuthorityError.
	OtherCAFile string

	ca     *x509.Certificate
	client tls.Certificate
	// expiredValid is an instant when ExpiredServerCert was valid.
	expiredValid time.Time
}

// NewCertificates makes a CA, the certificates it signs (see Certificates)
// and an unrelated CA, with crypto/x509 alone, and writes them to a fresh
// t.TempDir. The valid ones run from an hour ago to a week from now.
func NewCertificates(t testing.TB) *Certificates {
	t.Helper()
	c, err := newCertificates(t.TempDir(), time.Now())
	if err != nil {
		t.Fatalf("redistest: certificates: %v", err)
	}
	return c
}

// newCertificates is NewCertificates into dir, as of now.
func newCertificates(dir string, now time.Time) (*Certificates, error) {
	c := &Certificates{expiredValid: now.Add(-36 * time.Hour)}
	path := func(name string) string { return filepath.Join(dir, name) }
	valid := [2]time.Time{now.Add(-time.Hour), now.Add(7 * 24 * time.Hour)}
	// The CAs were valid when the expired certificates were.
	caValid := [2]time.Time{now.Add(-72 * time.Hour), valid[1]}
	expired := [2]time.Time{now.Add(-48 * time.Hour), now.Add(-24 * time.Hour)}
	server := x509.Certificate{
		Subject:     pkix.Name{CommonName: "redistest server"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost", "redis.test"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	client := x509.Certificate{
		Subject:     pkix.Name{CommonName: "redistest client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}

	ca, caKey, err := writeCert(path("ca.crt"), "", nil, nil, caTemplate("redistest CA"), caValid)
	if err != nil {
		return nil, err
	}
	c.ca, c.CAFile = ca, path("ca.crt")
	if _, _, err := writeCert(path("other-ca.crt"), "", nil, nil, caTemplate("redistest other CA"), caValid); err != nil {
		return nil, err
	}
	c.OtherCAFile = path("other-ca.crt")
	for _, cert := range []struct {
		name      string
		tmpl      x509.Certificate
		valid     [2]time.Time
		cert, key *string
	}{
		{"server", server, valid, &c.ServerCert, &c.ServerKey},
		{"client", client, valid, &c.ClientCert, &c.ClientKey},
		{"expired-server", server, expired, &c.ExpiredServerCert, &c.ExpiredServerKey},
		{"expired-client", client, expired, &c.ExpiredClientCert, &c.ExpiredClientKey},
	} {
		*cert.cert, *cert.key = path(cert.name+".crt"), path(cert.name+".key")
		if _, _, err := writeCert(*cert.cert, *cert.key, ca, caKey, &cert.tmpl, cert.valid); err != nil {
			return nil, err
		}
	}
	if c.client, err = tls.LoadX509KeyPair(c.ClientCert, c.ClientKey); err != nil {
		return nil, err
	}
	return c, nil
}

// caTemplate is a CA certificate named cn.
func caTemplate(cn string) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
}

// writeCert signs tmpl, valid over [valid[0], valid[1]], with a new key:
// by parent's key, or by itself when parent is nil. It writes the
// certificate to certPath and, when keyPath is set, the key to keyPath.
func writeCert(certPath, keyPath string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, tmpl *x509.Certificate, valid [2]time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = valid[0], valid[1]
	if !tmpl.IsCA {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign %s: %w", filepath.Base(certPath), err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	if keyPath != "" {
		b, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: b}), 0o600); err != nil {
			return nil, nil, err
		}
	}
	return cert, key, nil
}

// ClientTLS returns a fresh client TLS configuration that trusts CAFile
// alone and presents ClientCert. Its ServerName is empty: go-redis and
// redisstore's dialer verify the dialled host (127.0.0.1, which the
// server certificate names).
func (c *Certificates) ClientTLS() *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(c.ca)
	return &tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{c.client},
		MinVersion:   tls.VersionTLS12,
	}
}

// TLSOptions makes a server speak TLS only (ServerOptions.TLS, and the TLS
// flavours of StartCluster and StartSentinel): --port 0 --tls-port <port>,
// the certificates of Certs, --tls-replication yes and, on a Cluster node,
// --tls-cluster yes. The zero value is not usable: Certs is required.
type TLSOptions struct {
	// Certs supplies the CA, the server's certificate and the client
	// certificate the helper presents.
	Certs *Certificates
	// OptionalClientCert lets clients connect without a certificate
	// (--tls-auth-clients optional). By default one signed by the CA is
	// required (--tls-auth-clients yes), and the server refuses a client
	// without one.
	OptionalClientCert bool
	// ExpiredCert serves Certs.ExpiredServerCert instead of ServerCert. The
	// server's Options then verify as of an instant when that certificate
	// was valid, so that the helper (and a test that needs it) can still
	// reach the server; Certs.ClientTLS fails against it.
	ExpiredCert bool
}

// args returns the redis-server arguments for o, port and cluster aside.
func (o *TLSOptions) args(port int, cluster bool) []string {
	cert, key := o.Certs.ServerCert, o.Certs.ServerKey
	if o.ExpiredCert {
		cert, key = o.Certs.ExpiredServerCert, o.Certs.ExpiredServerKey
	}
	auth := "yes"
	if o.OptionalClientCert {
		auth = "optional"
	}
	args := []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", cert,
		"--tls-key-file", key,
		"--tls-ca-cert-file", o.Certs.CAFile,
		"--tls-auth-clients", auth,
		"--tls-replication", "yes",
	}
	if cluster {
		args = append(args, "--tls-cluster", "yes")
	}
	return args
}

// clientTLS returns the configuration the helper's clients use for a
// server started with o.
func (o *TLSOptions) clientTLS() *tls.Config {
	cfg := o.Certs.ClientTLS()
	if o.ExpiredCert {
		at := o.Certs.expiredValid
		cfg.Time = func() time.Time { return at }
	}
	return cfg
}

// cliArgs returns redis-cli's arguments to connect as the helper does.
func (o *TLSOptions) cliArgs() []string {
	return []string{"--tls", "--cacert", o.Certs.CAFile, "--cert", o.Certs.ClientCert, "--key", o.Certs.ClientKey}
}
