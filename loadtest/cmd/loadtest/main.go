// Command loadtest drives the chaos suite's load against
// a base URL and writes one JSON line per request.
//
//	go run ./loadtest/cmd/loadtest -url http://127.0.0.1:8080 -duration 30s -out requests.jsonl
//
// A route "rls:<domain>/<descriptor key>" is loaded through Envoy's rate
// limit service at -rls (ShouldRateLimit, one descriptor per key):
//
//	go run ./loadtest/cmd/loadtest -rls 127.0.0.1:8090 -routes /api/gcra,/static/,rls:chaos/gcra ...
//
// Quota and window of each route come from its RateLimit-Policy header,
// unless -quota and -window give them for every route. Keys are signed
// with -api-key-secret (default: RL_API_KEY_SECRET, else the demo stacks'
// secret), as the service checks them. Every request comes from one
// address, so the service's per-address ceiling applies to the whole load:
// run it against a stack whose ceiling is sized for it (chaos/policies.json;
// loadtest/README.md, "The per-address ceiling"). The summary names the policy that
// refused each route's 429s, and warns when polite keys were refused by a
// policy other than their route's own.
//
// On a terminal, stderr shows the run's progress as it goes (elapsed time,
// requests per second, 2xx / 429 / errors, the phase, each instance's
// mode); elsewhere, a line per phase (learn, load, drain).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fleetlimit/fleetlimit/loadtest"
	"github.com/fleetlimit/fleetlimit/loadtest/progress"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// run is main without the process: flags in args, the summary on stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		baseURL     = fs.String("url", "http://127.0.0.1:8080", "base URL of the service (loopback only)")
		rlsAddr     = fs.String("rls", "", "host:port of Envoy's rate limit service, for the routes rls:<domain>/<descriptor key> (loopback only)")
		routes      = fs.String("routes", strings.Join(loadtest.DefaultRoutes, ","), "comma-separated routes loaded at once")
		duration    = fs.Duration("duration", 30*time.Second, "how long to send")
		maxRequests = fs.Int64("max-requests", 1_000_000, "stop after this many requests")
		maxInFlight = fs.Int("max-inflight", 1024, "most requests waiting for an answer at once")
		out         = fs.String("out", "requests.jsonl", `where to write the records ("-": stdout)`)
		seed        = fs.Uint64("seed", 1, "seed of the send schedule")
		runID       = fs.String("run-id", "", "suffix of the key names (default: random)")
		quota       = fs.Int64("quota", 0, "quota (capacity) of every route; with -window, skips learning from headers")
		window      = fs.Duration("window", 0, "window of every route; with -quota")
		jitter      = fs.Float64("jitter", 0.8, "send jitter as a fraction of each key's interval, in [0, 1)")
		cpuProfile  = fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
		sources     = fs.Int("sources", loadtest.SourcePerKey, "send the keys from this many loopback addresses, 127.0.0.2 and up (each a client address of its own to the service's per-address ceiling); 0: one address; -1: one per key (at most 250) against an IPv4 loopback target, else one")
		secret      = fs.String("api-key-secret", envOr("RL_API_KEY_SECRET", loadtest.DemoAPIKeySecret),
			`secret the keys are signed with, as the service checks them ("": send the key names unsigned)`)
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	stopProfile, err := loadtest.StartCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	if (*quota > 0) != (*window > 0) {
		return errors.New("-quota and -window go together")
	}
	if err := loadtest.CheckLoopback(*baseURL); err != nil {
		return err
	}
	cfg := loadtest.Config{
		BaseURL:     *baseURL,
		Routes:      splitList(*routes),
		RunID:       *runID,
		Seed:        *seed,
		Jitter:      *jitter,
		Duration:    *duration,
		MaxRequests: *maxRequests,
		MaxInFlight: *maxInFlight,
		Sources:     *sources,
		// The first of a comma-separated list signs, as in the service.
		APIKeySecret: strings.Split(*secret, ",")[0],
	}
	if *rlsAddr != "" {
		rls, err := loadtest.DialRLS(*rlsAddr)
		if err != nil {
			return err
		}
		defer rls.Close()
		cfg.RLS = rls
	}
	if *quota > 0 {
		cfg.Policies = map[string]loadtest.Policy{}
		for _, r := range cfg.Routes {
			cfg.Policies[r] = loadtest.Policy{Name: loadtest.ShortRoute(r), Quota: *quota, Window: *window}
		}
	}

	var w io.Writer = stdout
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	var writeErr error
	sum := newSummary()
	// Progress on stderr: redrawn in place on a terminal, a line per phase
	// elsewhere.
	prog := progress.New(stderr)
	prog.Reset("loadtest " + *baseURL)
	cfg.OnPhase = prog.Phase
	cfg.OnRecord = func(r loadtest.Record) {
		if err := enc.Encode(r); err != nil && writeErr == nil {
			writeErr = err
		}
		sum.add(r)
		prog.Record(r)
	}
	prog.Start()
	res, err := loadtest.Run(ctx, cfg)
	prog.Stop()
	if ferr := bw.Flush(); ferr != nil && writeErr == nil {
		writeErr = ferr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if writeErr != nil {
		return fmt.Errorf("writing records: %w", writeErr)
	}

	summary := stdout // the records went to a file
	if *out == "-" {
		summary = stderr
	}
	sum.write(summary, res)
	return err
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// envOr is the environment variable name, or def when it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
