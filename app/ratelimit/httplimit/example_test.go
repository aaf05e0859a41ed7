package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
)

// A plain net/http service: two requests per 10 seconds per client on
// /hello, behind a proxy on localhost that sets X-Real-IP.
func Example() {
	policy := ratelimit.Policy{Name: "hello", Algorithm: ratelimit.SlidingWindowLog, Limit: 2, Window: 10 * time.Second}
	limits := httplimit.New(memstore.New(),
		httplimit.WithTrustedProxies([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}))

	mux := http.NewServeMux()
	mux.Handle("GET /hello", limits.Handler(policy)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	srv := httptest.NewServer(mux) // in a real service: http.ListenAndServe(":8080", mux)
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/hello", nil)
		req.Header.Set("X-Real-IP", "203.0.113.7") // as the proxy would
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"),
			"remaining", resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("Content-Type"))
	}
	// Output:
	// 200 "hello";q=2;w=10 remaining 1 text/plain; charset=utf-8
	// 200 "hello";q=2;w=10 remaining 0 text/plain; charset=utf-8
	// 429 "hello";q=2;w=10 remaining 0 application/problem+json
}
