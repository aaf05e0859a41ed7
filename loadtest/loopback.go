package loadtest

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// targets holds the addresses besides loopback that the load may reach
// (AllowTarget).
var targets struct {
	sync.RWMutex
	addrs []netip.Addr
}

// AllowTarget lets the load reach addr as well as loopback: a private
// address of this host's own, such as a container on a Docker bridge. The
// chaos suite reaches its compose stack's nginx that way, as a client on
// another host reaches it (the kernel forwards), rather than through
// docker-proxy, the userland relay of the published loopback port, whose CPU
// the stack's latency would otherwise pay. Only private addresses
// (10/8, 172.16/12, 192.168/16, fc00::/7) are accepted: the load never
// leaves for the internet.
func AllowTarget(addr netip.Addr) error {
	addr = addr.Unmap()
	if !addr.IsPrivate() {
		return fmt.Errorf("loadtest: target %s: only loopback and private addresses may be allowed", addr)
	}
	targets.Lock()
	defer targets.Unlock()
	if !slices.Contains(targets.addrs, addr) {
		targets.addrs = append(targets.addrs, addr)
	}
	return nil
}

// allowedTarget reports whether the load may reach addr: loopback, or an
// address AllowTarget allowed.
func allowedTarget(addr netip.Addr) bool {
	addr = addr.Unmap()
	if addr.IsLoopback() {
		return true
	}
	targets.RLock()
	defer targets.RUnlock()
	return slices.Contains(targets.addrs, addr)
}

// CheckLoopback returns an error unless rawURL is an http(s) URL whose host
// is a loopback IP address, "localhost", or an address AllowTarget allowed.
// The dialer of NewClient enforces the same on every connection, whatever a
// name resolves to.
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
	if err != nil || !allowedTarget(ip) {
		return fmt.Errorf("loadtest: base URL %q: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed", rawURL)
	}
	return nil
}

// loopbackDialer dials loopback addresses (and those AllowTarget allowed)
// only: the check runs on the resolved address of every connection.
func loopbackDialer() *net.Dialer {
	return &net.Dialer{
		Timeout:   time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("loadtest: dial %s: %w", address, err)
			}
			if !allowedTarget(ap.Addr()) {
				return fmt.Errorf("loadtest: dial %s: not a loopback address (nor one AllowTarget allowed)", address)
			}
			return nil
		},
	}
}
