// TLS and mTLS on the gRPC door: the RL_GRPC_TLS* settings.

package service

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"sync"
	"time"
)

// The RL_GRPC_TLS* variables, as their errors name them.
const (
	envGRPCTLSCert     = "RL_GRPC_TLS_CERT_FILE"
	envGRPCTLSKey      = "RL_GRPC_TLS_KEY_FILE"
	envGRPCTLSClientCA = "RL_GRPC_TLS_CLIENT_CA_FILE"
)

// validateGRPCTLS checks the RL_GRPC_TLS* settings and builds
// GRPCTLSConfig: nil without them (plaintext); TLS 1.2 or later with a
// certificate and key; mTLS besides with a client CA file, every caller
// then presenting a certificate that one of its CAs signed. The files are
// read here, so that a bad one stops the start naming its variable, and
// again at the first handshake after one of them changed, so that a
// rotated certificate or CA bundle is served without a restart.
func (c *Config) validateGRPCTLS() error {
	c.GRPCTLSConfig = nil
	if c.GRPCAddr == "" {
		for _, s := range []struct{ name, file string }{
			{envGRPCTLSCert, c.GRPCTLSCertFile}, {envGRPCTLSKey, c.GRPCTLSKeyFile}, {envGRPCTLSClientCA, c.GRPCTLSClientCAFile},
		} {
			if s.file != "" {
				return configErr(s.name, "needs RL_GRPC_ADDR (the gRPC door is not served)")
			}
		}
		return nil
	}
	switch {
	case c.GRPCTLSCertFile == "" && c.GRPCTLSKeyFile == "":
		if c.GRPCTLSClientCAFile != "" {
			return configErr(envGRPCTLSClientCA, "needs %s and %s: mTLS is TLS with client certificates", envGRPCTLSCert, envGRPCTLSKey)
		}
		return nil
	case c.GRPCTLSKeyFile == "":
		return configErr(envGRPCTLSKey, "needed with %s", envGRPCTLSCert)
	case c.GRPCTLSCertFile == "":
		return configErr(envGRPCTLSCert, "needed with %s", envGRPCTLSKey)
	}
	certFile, keyFile := c.GRPCTLSCertFile, c.GRPCTLSKeyFile
	pair := &watchedFiles[*tls.Certificate]{
		names: []string{envGRPCTLSCert, envGRPCTLSKey},
		files: []string{certFile, keyFile},
		read:  func() (*tls.Certificate, error) { return readKeyPair(certFile, keyFile, time.Now()) },
	}
	if err := pair.refresh(); err != nil {
		return err
	}
	cfg := &tls.Config{
		// grpc's credentials.NewTLS adds "h2" to NextProtos.
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair.get(), nil },
	}
	if c.GRPCTLSClientCAFile != "" {
		caFile, base := c.GRPCTLSClientCAFile, cfg
		base.ClientAuth = tls.RequireAndVerifyClientCert
		// The handshake's configuration: base with the CAs last read well,
		// through GetConfigForClient (credentials.NewTLS adds "h2" and its
		// defaults to what that returns too).
		withCAs := &watchedFiles[*tls.Config]{
			names: []string{envGRPCTLSClientCA},
			files: []string{caFile},
			read: func() (*tls.Config, error) {
				pool, err := readCertPool(caFile)
				if err != nil {
					return nil, err
				}
				hs := base.Clone()
				hs.ClientCAs = pool
				return hs, nil
			},
		}
		if err := withCAs.refresh(); err != nil {
			return err
		}
		cfg = withCAs.get().Clone()
		cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return withCAs.get(), nil }
	}
	c.GRPCTLSConfig = cfg
	return nil
}

// readKeyPair reads a PEM certificate (chain) and its private key, naming
// the variable of the file at fault: the certificate's for a file without
// a certificate, one that does not parse, or a certificate expired at now;
// the key's for a key that does not parse or does not match.
func readKeyPair(certFile, keyFile string, now time.Time) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, configErr(envGRPCTLSCert, "%w", err)
	}
	leaf, err := firstCertificate(certPEM)
	if err != nil {
		return nil, configErr(envGRPCTLSCert, "%s: %w", certFile, err)
	}
	if now.After(leaf.NotAfter) {
		return nil, configErr(envGRPCTLSCert, "%s: the certificate expired at %s (NotAfter)", certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, configErr(envGRPCTLSKey, "%w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, configErr(envGRPCTLSKey, "%s: %w (certificate %s)", keyFile, err, certFile)
	}
	return &pair, nil
}

// firstCertificate parses the first CERTIFICATE block of PEM data, the
// leaf that tls.X509KeyPair pairs with the key.
func firstCertificate(data []byte) (*x509.Certificate, error) {
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return nil, errors.New("no PEM certificate")
		}
		if b.Type == "CERTIFICATE" {
			return x509.ParseCertificate(b.Bytes)
		}
	}
}

// readCertPool reads the client CAs' PEM file.
func readCertPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, configErr(envGRPCTLSClientCA, "%w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, configErr(envGRPCTLSClientCA, "%s: no PEM certificate", file)
	}
	return pool, nil
}

// watchedFiles holds a value read from files, read again by refresh when
// one of them changed (another inode, modification time or size) since the
// last read. A read that fails (a file half written, a key that does not
// match the new certificate yet) keeps the last good value, and is tried
// again once a file changes again. get refreshes first: a stat of each
// file per TLS handshake, cheap beside the handshake. Safe for concurrent
// use; the zero value has no files and no value.
type watchedFiles[T any] struct {
	names []string // the variables naming files, for stat errors
	files []string
	read  func() (T, error)

	mu    sync.Mutex
	seen  []os.FileInfo // the versions last read, well or not
	value T             // the last good value
}

// refresh reads the value again if a file changed since the last read and
// returns the error of the stat or the read (the last good value stays).
func (w *watchedFiles[T]) refresh() error {
	cur := make([]os.FileInfo, len(w.files))
	for i, f := range w.files {
		fi, err := os.Stat(f)
		if err != nil {
			return configErr(w.names[i], "%w", err)
		}
		cur[i] = fi
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen != nil && sameVersions(w.seen, cur) {
		return nil
	}
	// Stat, then read: a change in between is read again at the next
	// refresh, since the stat recorded is the older one.
	w.seen = cur
	v, err := w.read()
	if err != nil {
		return err
	}
	w.value = v
	return nil
}

// get returns the value after a refresh, whose error it drops: there is no
// logger here, and the last good value is what to serve.
func (w *watchedFiles[T]) get() T {
	_ = w.refresh()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.value
}

func sameVersions(a, b []os.FileInfo) bool {
	for i := range a {
		if !os.SameFile(a[i], b[i]) || !a[i].ModTime().Equal(b[i].ModTime()) || a[i].Size() != b[i].Size() {
			return false
		}
	}
	return true
}
