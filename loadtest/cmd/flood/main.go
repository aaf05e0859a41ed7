// Command flood sends requests that each carry a key never seen before,
// from many loopback addresses, to measure what abuse costs the stack:
// every request's key is new (half of them validly signed by default, the
// rest forged), and the source address rotates over -addresses addresses of
// 127.0.0.0/8, so both the per-key state and the per-address state grow.
//
//	go run ./loadtest/cmd/flood -url http://127.0.0.1:8080/api/gcra -n 1000000
//
// It prints the answers by status and the rate. Watch the apps' memory
// meanwhile (their /metrics: process_resident_memory_bytes, or
// /proc/<pid>/status) and Redis' (INFO memory).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetlimit/fleetlimit/loadtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	var (
		url         = fs.String("url", "http://127.0.0.1:8080/api/gcra", "the route to flood (loopback only)")
		n           = fs.Int("n", 100_000, "requests to send, each with a new key")
		valid       = fs.Float64("valid", 0.5, "share of the keys that are validly signed (the rest are forged)")
		addresses   = fs.Int("addresses", 4096, "loopback source addresses to rotate over (127.1.0.0 upwards)")
		concurrency = fs.Int("concurrency", 64, "requests in flight")
		secret      = fs.String("api-key-secret", envOr("RL_API_KEY_SECRET", loadtest.DemoAPIKeySecret), "secret that signs the valid keys")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := loadtest.CheckLoopback(*url); err != nil {
		return err
	}
	if *n < 1 || *addresses < 1 || *addresses > 1<<16 || *concurrency < 1 || *valid < 0 || *valid > 1 {
		return errors.New("need -n >= 1, 1 <= -addresses <= 65536, -concurrency >= 1, 0 <= -valid <= 1")
	}
	// One client per source address, created as needed.
	clients := make([]*http.Client, *addresses)
	var clientsMu sync.Mutex
	clientFor := func(i int) *http.Client {
		clientsMu.Lock()
		defer clientsMu.Unlock()
		if clients[i] == nil {
			src := &net.TCPAddr{IP: net.IPv4(127, 1, byte(i>>8), byte(i))}
			d := &net.Dialer{LocalAddr: src, Timeout: 5 * time.Second}
			clients[i] = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				DialContext: d.DialContext, MaxIdleConnsPerHost: 2, DisableCompression: true,
			}}
		}
		return clients[i]
	}
	run := strconv.FormatUint(rand.Uint64(), 36)
	var (
		next    atomic.Int64
		mu      sync.Mutex
		byCode  = map[int]int{}
		errs    int
		firstEr error
	)
	start := time.Now()
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= *n {
					return
				}
				id := fmt.Sprintf("flood-%s-%d", run, i)
				key := id + ".AAAAAAAAAAAAAAAAAAAAAAAA" // forged
				if float64(i%1000) < *valid*1000 {
					k, err := loadtest.SignKey(*secret, id)
					if err != nil {
						mu.Lock()
						errs++
						firstEr = err
						mu.Unlock()
						return
					}
					key = k
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
				if err != nil {
					return
				}
				req.Header.Set(loadtest.HeaderAPIKey, key)
				resp, err := clientFor(i % *addresses).Do(req)
				code := 0
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				if err != nil {
					errs++
					if firstEr == nil {
						firstEr = err
					}
				} else {
					byCode[code]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	sent := min(int(next.Load()), *n)
	fmt.Fprintf(stdout, "flood: %d requests with new keys (%.0f%% valid) from %d addresses in %v (%.0f/s)\n",
		sent, *valid*100, *addresses, took.Round(time.Millisecond), float64(sent)/took.Seconds())
	codes := make([]int, 0, len(byCode))
	for c := range byCode {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		fmt.Fprintf(stdout, "  %d: %d\n", c, byCode[c])
	}
	if errs > 0 {
		fmt.Fprintf(stdout, "  transport errors: %d (first: %v)\n", errs, firstEr)
	}
	return ctx.Err()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
