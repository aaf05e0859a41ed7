package loadtest

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// CheckLoopback returns an error unless rawURL is an http(s) URL whose host
// is a loopback IP address or "localhost". The dialer of NewClient enforces
// the same on every connection, whatever a name resolves to.
func CheckLoopback(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("loadtest: base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("loadtest: base URL %q: want http:// or https://", rawURL)
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("loadtest: base URL %q: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed", rawURL)
	}
	return nil
}

// loopbackDialer dials loopback addresses only: the check runs on the
// resolved address of every connection.
func loopbackDialer() *net.Dialer {
	return &net.Dialer{
		Timeout:   time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("loadtest: dial %s: %w", address, err)
			}
			if !ap.Addr().Unmap().IsLoopback() {
				return fmt.Errorf("loadtest: dial %s: not a loopback address", address)
			}
			return nil
		},
	}
}
