package memstore_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
)

// One instance without Redis: a token bucket of 2 refilled at 1 a second,
// on a clock the example moves.
func Example() {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	limiter := memstore.New(memstore.Config{Capacity: 10_000, Clock: func() time.Time { return now }})

	upload := ratelimit.Policy{Name: "upload", Algorithm: ratelimit.TokenBucket, Limit: 1, Window: time.Second, Burst: 2}
	decide := func() {
		d, err := limiter.Decide(context.Background(), ratelimit.Request{Policy: upload, Key: "user-42"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Allowed, "remaining", d.Remaining, "retry after", d.RetryAfter)
	}
	decide()
	decide()
	decide()
	now = now.Add(time.Second)
	decide()
	// Output:
	// true remaining 1 retry after 0s
	// true remaining 0 retry after 0s
	// false remaining 0 retry after 1s
	// true remaining 0 retry after 0s
}

// One instance, without Redis: the middleware over the in-memory store,
// a GCRA of 100 requests per 10 s per client address.
func Example_middleware() {
	limiter := memstore.New(memstore.Config{})
	policy := ratelimit.Policy{Name: "api", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second}
	limits := httplimit.New(limiter, httplimit.Config{})
	mux := http.NewServeMux()
	mux.Handle("/api/", limits.Handler(policy)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/hello")
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = resp.Body.Close()
	fmt.Println(resp.Status, resp.Header.Get("RateLimit-Policy"))
	// Output: 200 OK "api";q=100;w=10
}
