package loadtest

// How a run's requests go out: the client and its loopback-only dialer,
// each key's send schedule, and one request timed into a Record.

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// NewClient returns the HTTP client of a run: one keep-alive pool large
// enough for every in-flight request, 2 s timeouts, and a dialer that
// refuses any address but loopback.
func NewClient() *http.Client { return NewClientFrom(netip.Addr{}) }

// NewClientFrom is NewClient with its connections from the loopback
// address src (the zero Addr: the kernel's choice).
func NewClientFrom(src netip.Addr) *http.Client {
	d := loopbackDialer()
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	tr := &http.Transport{
		DialContext:           d.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 2 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   2 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// schedule yields the send times of one key between start and end: slot k
// is at start + offset + k*interval, offset uniform in [0, interval), each
// send moved uniformly within ±jitter*interval/2 of its slot.
func schedule(rng *rand.Rand, start, end time.Time, interval time.Duration, jitter float64) func(yield func(time.Time) bool) {
	return func(yield func(time.Time) bool) {
		if interval <= 0 {
			return
		}
		offset := time.Duration(rng.Float64() * float64(interval))
		for k := int64(0); ; k++ {
			slot := offset + time.Duration(k)*interval
			shift := time.Duration((rng.Float64() - 0.5) * jitter * float64(interval))
			at := start.Add(max(slot+shift, 0))
			if !at.Before(end) {
				return
			}
			if !yield(at) {
				return
			}
		}
	}
}

// sleepUntil waits until the clock reads at; false if ctx ended first.
func sleepUntil(ctx context.Context, now func() time.Time, at time.Time) bool {
	d := at.Sub(now())
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Send makes one request of k to baseURL (a loopback URL: nginx, or one
// instance's own) with client, and records it as Run does. It is for the
// requests a caller sequences itself (the chaos suite's reset keys); Run
// sends the load.
func Send(ctx context.Context, client *http.Client, baseURL string, k Key) (Record, error) {
	if err := CheckLoopback(baseURL); err != nil {
		return Record{}, err
	}
	return send(ctx, client, strings.TrimRight(baseURL, "/"), k, time.Now), nil
}

// send makes one request and records it.
func send(ctx context.Context, client *http.Client, base string, k Key, now func() time.Time) Record {
	rec := Record{Route: k.Route, Key: k.Name, Class: k.Class}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+k.Route, nil)
	if err != nil {
		t := now()
		rec.TSendMS, rec.TRecvMS = UnixMS(t), UnixMS(t)
		rec.Error = err.Error()
		return rec
	}
	header := k.Header
	if header == "" {
		header = k.Name
	}
	req.Header.Set(HeaderAPIKey, header)
	t0 := now()
	resp, err := client.Do(req)
	if err == nil {
		if resp.StatusCode == http.StatusTooManyRequests {
			var body []byte
			body, err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
			rec.RefusedBy = RefusedBy(resp.Header, body)
		} else {
			_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		}
		_ = resp.Body.Close()
		rec.Status = resp.StatusCode
		rec.RequestID = resp.Header.Get(HeaderRequestID)
		rec.Instance = resp.Header.Get(HeaderServedBy)
		rec.Mode = resp.Header.Get(HeaderMode)
		if err != nil { // the status came, the body broke off: still an answer
			rec.Error = "body: " + err.Error()
		}
	} else {
		rec.Error = err.Error()
	}
	// t1 is t0 moved by the monotonic elapsed time: t_recv - t_send is the
	// latency even if the wall clock steps meanwhile.
	elapsed := now().Sub(t0)
	t1 := t0.Add(elapsed)
	rec.TSendMS, rec.TRecvMS = UnixMS(t0), UnixMS(t1)
	rec.LatencyMS = math.Round(float64(elapsed.Microseconds())) / 1000
	return rec
}
