package redistest

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a fault-injection TCP proxy in front of one upstream address,
// started by StartProxy (the zero value is not usable): point a client at
// Addr, then cut it off, slow it down or leave it hanging. Its methods are
// safe for concurrent use; a failure (which needs the listening port to be
// taken while the proxy is disabled) is reported with t.Errorf.
//
// It is written on the standard library alone, so that the library's module
// needs no fault-injection dependency: the native stack's toxiproxy is built
// from the chaos module.
type Proxy struct {
	tb       testing.TB
	addr     string
	upstream string

	latency   atomic.Int64 // added to every reply, in ns
	jitter    atomic.Int64 // up to this much more, drawn per reply, in ns (LatencyJitter)
	reqDelay  atomic.Int64 // added to every request, in ns (RequestLatency)
	blackhole atomic.Bool  // drop the data in both directions

	mu    sync.Mutex
	ln    net.Listener // nil while disabled
	conns map[*link]struct{}
	wg    sync.WaitGroup // the accept loop and the links' goroutines
}

// link is one client connection and its connection to the upstream.
type link struct {
	client, server net.Conn
}

func (k *link) close() {
	_ = k.client.Close()
	_ = k.server.Close()
}

// StartProxy starts a proxy to upstream listening on a free loopback port. It
// is stopped in t.Cleanup, which closes every connection through it and waits
// for its goroutines.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: start proxy to %s: %v", upstream, err)
	}
	p := &Proxy{tb: t, addr: ln.Addr().String(), upstream: upstream, conns: map[*link]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.Disable()
		p.wg.Wait()
	})
	return p
}

// Addr returns the address clients should dial instead of the upstream.
func (p *Proxy) Addr() string { return p.addr }

// Disable cuts clients off: the proxy stops listening, so new connections are
// refused, and closes every open connection. Latency and Blackhole are kept.
func (p *Proxy) Disable() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	p.closeLinks()
}

// Enable undoes Disable: the proxy listens again on the same address. It does
// nothing if the proxy is enabled.
func (p *Proxy) Enable() {
	p.mu.Lock()
	enabled := p.ln != nil
	p.mu.Unlock()
	if enabled {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.tb.Errorf("redistest: enable proxy %s: %v", p.addr, err)
		return
	}
	p.serve(ln)
}

// Latency delays every reply (upstream to client) by d, on open and new
// connections, replacing an earlier Latency. Latency(0) removes it. Replies
// keep their order and are not serialised: each waits d from its arrival.
func (p *Proxy) Latency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
	p.jitter.Store(0)
}

// LatencyJitter delays every reply by d plus a uniform random part of up to
// jitter, drawn per reply: a Redis that is slow but not dead, whose replies
// arrive some within a caller's deadline and some after it. Replies keep
// their order (a reply drawn shorter than the one before it waits for it).
// LatencyJitter(0, 0) removes it, as Latency(0) does.
func (p *Proxy) LatencyJitter(d, jitter time.Duration) {
	p.latency.Store(int64(max(d, 0)))
	p.jitter.Store(int64(max(jitter, 0)))
}

// RequestLatency delays every request (client to upstream) by d before it
// reaches the upstream, one after another: a command that its client has
// given up on still arrives and runs, as after a partition that dropped
// packets heals and the kernel's retransmissions get through.
// RequestLatency(0) removes it.
func (p *Proxy) RequestLatency(d time.Duration) { p.reqDelay.Store(int64(max(d, 0))) }

// Blackhole makes the upstream look hung: connections are still accepted but
// the data in both directions is dropped, so requests never reach it and
// nothing is answered. ClearToxics ends it, closing the connections that were
// blackholed.
func (p *Proxy) Blackhole() { p.blackhole.Store(true) }

// ClearToxics removes Latency, LatencyJitter, RequestLatency and Blackhole, restoring plain forwarding. It
// does not Enable a disabled proxy.
func (p *Proxy) ClearToxics() {
	p.latency.Store(0)
	p.jitter.Store(0)
	p.reqDelay.Store(0)
	if p.blackhole.Swap(false) {
		// Every open connection has had data dropped, or may have: a
		// client would otherwise wait for replies that never come.
		p.mu.Lock()
		p.closeLinks()
		p.mu.Unlock()
	}
}

// closeLinks closes every open connection. p.mu must be held.
func (p *Proxy) closeLinks() {
	for k := range p.conns {
		k.close()
		delete(p.conns, k)
	}
}

// serve accepts connections on ln until it is closed.
func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed by Disable
			}
			p.wg.Go(func() { p.handle(ln, c) })
		}
	})
}

// handle dials the upstream for client connection c, accepted on ln, and
// forwards both ways until either side closes.
func (p *Proxy) handle(ln net.Listener, c net.Conn) {
	s, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	k := &link{client: c, server: s}
	p.mu.Lock()
	if p.ln != ln { // disabled meanwhile
		p.mu.Unlock()
		k.close()
		return
	}
	p.conns[k] = struct{}{}
	p.mu.Unlock()

	var done sync.WaitGroup
	done.Go(func() { p.forward(s, c, false) })
	done.Go(func() { p.forward(c, s, true) })
	done.Wait()
	p.mu.Lock()
	delete(p.conns, k)
	p.mu.Unlock()
}

// chunk is data read from one side, with when it was read.
type chunk struct {
	data []byte
	at   time.Time
}

// forward copies src to dst until either fails, then closes both. Replies
// (reply set) wait out the latency; data read during a blackhole is
// dropped.
func (p *Proxy) forward(dst, src net.Conn, reply bool) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	if !reply {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !p.blackhole.Load() {
				if d := time.Duration(p.reqDelay.Load()); d > 0 {
					time.Sleep(d)
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	// Replies go through a queue so that each waits the latency from its
	// own arrival, as a slow network delays them, not one after another.
	queue := make(chan chunk, 1024)
	var writer sync.WaitGroup
	writer.Go(func() {
		for ch := range queue {
			d := time.Duration(p.latency.Load())
			if j := p.jitter.Load(); j > 0 {
				d += time.Duration(rand.Int64N(j + 1))
			}
			if d > 0 {
				time.Sleep(time.Until(ch.at.Add(d)))
			}
			if _, err := dst.Write(ch.data); err != nil {
				_ = src.Close() // ends the reader
				for range queue {
				}
				return
			}
		}
	})
	defer writer.Wait()
	defer close(queue)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			queue <- chunk{data: append([]byte(nil), buf[:n]...), at: time.Now()}
		}
		if err != nil {
			return // EOF, a reset or Disable: the link ends either way
		}
	}
}
