package loadtest

import (
	"context"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// newAbortingClient returns a client for requests that give up: one
// connection per request, closed with a reset (SO_LINGER 0) instead of a
// graceful close, as a client whose process dies or whose network drops.
func newAbortingClient() *http.Client {
	d := loopbackDialer()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		return c, err
	}
	return &http.Client{
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true, DisableCompression: true,
			ResponseHeaderTimeout: 2 * time.Second},
		Timeout: 2 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// sendAborting sends k's request and resets its connection after, from
// the moment the request is written, unless its answer came first: then it
// is an ordinary record.
func sendAborting(ctx context.Context, client *http.Client, base string, k Key, now func() time.Time, after time.Duration) Record {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		timer *time.Timer
		fired bool
	)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(after, func() {
			mu.Lock()
			fired = true
			mu.Unlock()
			cancel()
		})
	}})
	rec := send(ctx, client, base, k, now)
	mu.Lock()
	if timer != nil {
		timer.Stop()
	}
	aborted := fired
	mu.Unlock()
	if aborted && rec.Status == 0 {
		rec.Aborted, rec.Error = true, "aborted by the client"
	}
	return rec
}
