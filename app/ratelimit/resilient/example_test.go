package resilient_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// One instance of a fleet that shares one Redis, wired as the service wires
// it: a decision client with a short timeout, a replay client of its own,
// the resilient limiter with its journal, and the HTTP middleware. The
// README's "Using the library" quotes this example.
func Example() {
	// Where Redis is; the journal's directory must outlive the process.
	redisURL, journalDir := os.Getenv("RL_REDIS_URL"), os.Getenv("RL_JOURNAL_DIR")

	// Decisions: a call slower than timeout is decided locally. Its reply
	// is still read for lateWindow, so that a call that ran late counts once.
	const timeout, lateWindow = 50 * time.Millisecond, 5 * time.Second
	client, err := redisstore.NewClient(redisstore.ClientConfig{URL: redisURL, Timeout: timeout, LateReplies: lateWindow})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	// Replays: a client of their own, whose timeouts are the replay budget.
	const replayTimeout = 2 * time.Second
	replayClient, err := redisstore.NewClient(redisstore.ClientConfig{URL: redisURL, Timeout: replayTimeout, PoolSize: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer replayClient.Close()
	backend := redisstore.New(client, redisstore.Config{
		ReplayClient: replayClient,
		Timeout:      timeout,
		Coalescing:   4, // concurrent decisions share pipelines (late replies need it)
	})
	limiter, err := resilient.New(backend, resilient.Config{
		Instance:          "api-1", // unique in the fleet: the hostname, say
		ExpectedInstances: 4,       // the fleet's size until the first heartbeat says
		Timeout:           timeout,
		LateWindow:        lateWindow,
		ReplayTimeout:     replayTimeout,
		JournalDir:        journalDir,
	})
	if err != nil {
		log.Fatal(err)
	}
	// Close leaves the fleet at once: the others stop holding this one's share.
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := limiter.Close(ctx); err != nil {
			log.Print(err)
		}
	}()

	// The middleware, behind load balancers in 10.0.0.0/8.
	policy := ratelimit.Policy{Name: "api", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second}
	limits := httplimit.New(limiter, httplimit.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	mux := http.NewServeMux()
	mux.Handle("/api/", limits.Handler(policy)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	srv := httptest.NewServer(mux) // in a real service: http.ListenAndServe(":8080", mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/api/hello")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"))

	// A decision outside HTTP.
	d, err := limiter.Decide(context.Background(), ratelimit.Request{Policy: policy, Key: "user-42"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Allowed)
	// Output:
	// 200 "api";q=100;w=10
	// true
}
