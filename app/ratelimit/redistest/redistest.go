// Package redistest starts real redis-server processes for the tests of
// code outside this module's tree: the service that wraps the library, a
// third-party store or wrapper (as package conformance serves them). It is
// the standalone-server part of the library's own test helper: see
// StartServer for what runs. When redis-server is missing, a test skips,
// or fails when the environment variable CI is set. NewCertificates and
// ServerOptions.TLS start a server that speaks TLS only.
package redistest

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// Server is a running redis-server (Addr, Client, Kill, Restart, ...).
type Server = redistest.Server

// ServerOptions configures StartServer (AOF, Password, extra Args, TLS).
type ServerOptions = redistest.ServerOptions

// TLSOptions makes a server speak TLS only (ServerOptions.TLS): its
// certificates, whether a client certificate is required, an expired
// server certificate.
type TLSOptions = redistest.TLSOptions

// Certificates is a throwaway PKI in PEM files: a CA, server and client
// certificates it signs (valid and expired), an unrelated CA, and
// ClientTLS, a client config that trusts the CA.
type Certificates = redistest.Certificates

// NewCertificates writes a fresh Certificates to a t.TempDir.
func NewCertificates(t testing.TB) *Certificates { return redistest.NewCertificates(t) }

// StartServer starts a redis-server on a free loopback port in its own
// t.TempDir, returns once it answers, and kills it in t.Cleanup.
func StartServer(t testing.TB, opts ServerOptions) *Server { return redistest.StartServer(t, opts) }
