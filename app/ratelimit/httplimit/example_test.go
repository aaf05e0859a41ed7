package httplimit_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
)

// A plain net/http service: two requests per 10 seconds per client on
// /hello, behind a proxy on localhost that sets X-Real-IP.
func Example() {
	policy := ratelimit.Policy{Name: "hello", Algorithm: ratelimit.SlidingWindowLog, Limit: 2, Window: 10 * time.Second}
	limits := httplimit.New(memstore.New(memstore.Config{}),
		httplimit.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})

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

// Signed API keys, and a per-address ceiling over every key one address
// uses: each key gets 10 requests per minute, each address 3 whatever its
// keys. A key that does not check out gets a 401, and still counts against
// its address. Every policy counts every request: carol's refused request
// used one of her key's units.
func ExampleConfig_apiKeys() {
	keys, err := apikey.NewVerifier("example-secret-0123456789")
	if err != nil {
		fmt.Println(err)
		return
	}
	perKey := ratelimit.Policy{Name: "per-key", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Minute}
	perAddress := ratelimit.Policy{Name: "per-address", Algorithm: ratelimit.SlidingWindowLog, Limit: 3, Window: time.Minute}
	limits := httplimit.New(memstore.New(memstore.Config{}),
		httplimit.Config{APIKeys: func(_ context.Context, key string) (string, error) { return keys.Check(key) }, PerAddress: []string{perAddress.Name}})
	handler := limits.Handler(perKey, perAddress)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	srv := httptest.NewServer(handler)
	defer srv.Close()

	alice, _ := keys.Sign("alice")
	bob, _ := keys.Sign("bob")
	carol, _ := keys.Sign("carol")
	for _, key := range []string{alice, bob, "mallory.forged-mac", carol} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, cmp.Or(resp.Header.Get("RateLimit"), "-"))
	}
	// Output:
	// 200 "per-key";r=9;t=60, "per-address";r=2;t=60
	// 200 "per-key";r=9;t=60, "per-address";r=1;t=60
	// 401 -
	// 429 "per-key";r=9;t=60, "per-address";r=0;t=60
}
