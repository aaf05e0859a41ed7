package stacktest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkAddressCeiling: a client that rotates valid API keys from one
// address gets at most the per-address ceiling, then 429s from the
// per-address policy; past the ceiling a forged key gets the same 429;
// from another address a forged key gets 401 and a valid key 200.
func checkAddressCeiling(t *testing.T, s *stack, run string) {
	const route = "/api/gcra"
	first := s.mustGet(t, route, withKey("ceiling-0-"+run))
	rh, err := parseRateHeaders(first.header)
	if err != nil {
		t.Fatal(err)
	}
	if len(rh.others) != 1 || rh.others[0].policy != "per-address" {
		t.Fatalf("headers list %q then %+v, want the route's policy then per-address", rh.policy, rh.others)
	}
	ceiling := rh.others[0]
	if ceiling.q > 10*rh.q {
		t.Errorf("the ceiling's quota %d is over 10× the key's %d", ceiling.q, rh.q)
	}
	start := time.Now()
	admitted := 1
	var refused reply
	for i := 1; i <= int(2*ceiling.q); i++ {
		r := s.mustGet(t, route, withKey(fmt.Sprintf("ceiling-%d-%s", i, run)))
		if r.status == http.StatusOK {
			admitted++
			continue
		}
		refused = r
		break
	}
	elapsed := time.Since(start)
	// A sliding window counter also weighs the window before; across a
	// window boundary it may admit up to the share of the earlier window
	// that aged out meanwhile.
	bound := ceiling.q + int64(float64(ceiling.q)*elapsed.Seconds()/float64(ceiling.w)) + 1
	t.Logf("rotating keys from one address: %d admitted in %v (ceiling %d per %d s), then %d", admitted, elapsed.Round(time.Millisecond), ceiling.q, ceiling.w, refused.status)
	if refused.status != http.StatusTooManyRequests {
		t.Fatalf("rotating keys: %d admitted and no 429 (last status %d), want at most the ceiling %d", admitted, refused.status, ceiling.q)
	}
	if int64(admitted) > bound || int64(admitted) < ceiling.q/2 {
		t.Errorf("rotating keys: %d admitted, want about the ceiling %d (at most %d)", admitted, ceiling.q, bound)
	}
	if p, err := parseProblem(http.StatusTooManyRequests, refused.header, refused.body); err != nil || p.Policy != "per-address" {
		t.Errorf("the refusal: policy %q, %v; want a problem from per-address", p.Policy, err)
	}
	// A sliding window counter frees a little of the window before as time
	// passes: a request right after a refusal can still fit (the forged
	// key could then be answered 401 though the ceiling was reached). So the
	// ceiling is met again with valid keys, then the forged key sent at
	// once; one 429 of three tries shows it counts against the address.
	forged := rawKey("forged-" + run + ".AAAAAAAAAAAAAAAAAAAAAAAA")
	var statuses []int
	for try := range 3 {
		if try > 0 {
			for i := range 50 {
				if r := s.mustGet(t, route, withKey(fmt.Sprintf("ceiling-again-%d-%d-%s", try, i, run))); r.status != http.StatusOK {
					break
				}
			}
		}
		r := s.mustGet(t, route, forged)
		statuses = append(statuses, r.status)
		if r.status == http.StatusTooManyRequests {
			break
		}
	}
	if statuses[len(statuses)-1] != http.StatusTooManyRequests {
		t.Errorf("a forged key past the ceiling: statuses %v, want 429", statuses)
	}

	s.from("127.0.1.7")
	r := s.mustGet(t, route, forged)
	if _, err := parseProblem(http.StatusUnauthorized, r.header, r.body); r.status != http.StatusUnauthorized || err != nil {
		t.Errorf("a forged key from another address: status %d (%v), want a 401 problem", r.status, err)
	}
	if r := s.mustGet(t, route, withKey("ceiling-other-"+run)); r.status != http.StatusOK {
		t.Errorf("a valid key from another address: status %d, want 200", r.status)
	}
}

// slowConnections is how many connections checkSlowConnections holds open.
const slowConnections = 9000

// checkSlowConnections: one address opens slowConnections connections that
// send half a request and stall; meanwhile another address is served as
// usual.
func checkSlowConnections(t *testing.T, s *stack, run string) {
	addr := strings.TrimPrefix(s.info.NginxURL, "http://")
	src := &net.TCPAddr{IP: net.ParseIP("127.0.1.8")}
	var (
		mu    sync.Mutex
		conns []net.Conn
		errs  int
		first error
	)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan struct{}, slowConnections)
	for range slowConnections {
		next <- struct{}{}
	}
	close(next)
	for range 64 {
		wg.Go(func() {
			d := net.Dialer{LocalAddr: src, Timeout: 5 * time.Second}
			for range next {
				c, err := d.DialContext(context.Background(), "tcp", addr)
				if err == nil {
					_, err = io.WriteString(c, "GET /api/gcra HTTP/1.1\r\nHost: slow\r\nX-API-Key: slow-"+run+"\r\n")
				}
				mu.Lock()
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
					if c != nil {
						_ = c.Close()
					}
				} else {
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d slow connections open from %s in %v (%d failed: %v)", len(conns), src.IP, time.Since(start).Round(time.Millisecond), errs, first)
	if len(conns) < slowConnections*9/10 {
		t.Fatalf("only %d of %d slow connections opened (first error %v): the test did not load the edge", len(conns), slowConnections, first)
	}

	s.from("127.0.1.9")
	var worst time.Duration
	for i := range 20 {
		r := s.mustGet(t, "/api/gcra", withKey(fmt.Sprintf("beside-slow-%d-%s", i, run)))
		if r.status != http.StatusOK {
			t.Errorf("ordinary request %d beside %d slow connections: status %d\n%s", i, len(conns), r.status, r.body)
		}
		worst = max(worst, r.recv.Sub(r.sent))
	}
	t.Logf("20 ordinary requests beside them: all answered, the slowest in %v", worst.Round(time.Microsecond))
}
