package redistest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy is a fault-injection TCP proxy in front of one upstream address,
// started by StartProxy (the zero value is not usable): point a client at
// Addr, then cut it off, slow it down or leave it hanging. It embeds a toxiproxy proxy (no toxiproxy server
// or HTTP API). Its methods are safe for concurrent use; a failure (which
// needs the listening port to be taken while the proxy is disabled) is
// reported with t.Errorf.
type Proxy struct {
	tb    testing.TB
	addr  string
	proxy *toxiproxy.Proxy

	mu sync.Mutex // serialises toxic changes, which toxiproxy checks then applies
}

// StartProxy starts a proxy to upstream listening on a free loopback port. It
// is stopped in t.Cleanup, which closes every connection through it.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	tp := toxiproxy.NewProxy(api, "redistest", "127.0.0.1:0", upstream)
	if err := tp.Start(); err != nil {
		t.Fatalf("redistest: start proxy to %s: %v", upstream, err)
	}
	t.Cleanup(tp.Stop)
	tp.Lock()
	addr := tp.Listen // the address chosen for port 0, kept by Disable/Enable
	tp.Unlock()
	return &Proxy{tb: t, addr: addr, proxy: tp}
}

// Addr returns the address clients should dial instead of the upstream.
func (p *Proxy) Addr() string { return p.addr }

// Disable cuts clients off: the proxy stops listening, so new connections are
// refused, and closes every open connection. Toxics are kept.
func (p *Proxy) Disable() { p.proxy.Stop() }

// Enable undoes Disable: the proxy listens again on the same address. It does
// nothing if the proxy is enabled.
func (p *Proxy) Enable() {
	if err := p.proxy.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		p.tb.Errorf("redistest: enable proxy %s: %v", p.addr, err)
	}
}

// Latency delays every reply (upstream to client) by d, on open and new
// connections, replacing an earlier Latency. Latency(0) removes it.
func (p *Proxy) Latency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeToxic("latency")
	if d > 0 {
		p.addToxic("latency", "latency", "downstream", fmt.Sprintf(`{"latency":%d}`, d.Milliseconds()))
	}
}

// Blackhole makes the upstream look hung: connections are still accepted but
// the data in both directions is dropped, so requests never reach it and
// nothing is answered. ClearToxics ends it, closing the connections that were
// blackholed.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, stream := range []string{"upstream", "downstream"} {
		name := "blackhole_" + stream
		p.removeToxic(name)
		// A timeout toxic with timeout 0 drops data and never closes.
		p.addToxic(name, "timeout", stream, `{"timeout":0}`)
	}
}

// ClearToxics removes every toxic (Latency, Blackhole), restoring plain
// forwarding. It does not Enable a disabled proxy.
func (p *Proxy) ClearToxics() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Toxics.ResetToxics(context.Background())
}

// addToxic adds a toxic of type typ on stream with the attributes given as a
// JSON object. p.mu must be held.
func (p *Proxy) addToxic(name, typ, stream, attributes string) {
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attributes)
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		p.tb.Errorf("redistest: proxy %s: add %s toxic: %v", p.addr, typ, err)
	}
}

// removeToxic removes the toxic called name, if there is one. p.mu must be
// held.
func (p *Proxy) removeToxic(name string) {
	if p.proxy.Toxics.GetToxic(name) != nil {
		_ = p.proxy.Toxics.RemoveToxic(context.Background(), name) // only fails if absent
	}
}
