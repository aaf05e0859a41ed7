package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// primeStack sends the load's mix, on keys of its own that nothing judges,
// for d before the measured run, then waits (up to 30 s) until every
// instance decides in Redis again with nothing left in its journal.
//
// Why: a stack that has just started holds no connections anywhere (load
// generator to nginx, nginx to the apps, the apps to Redis), and the
// contract's load opens hundreds at once: on a small host the first
// seconds answer slowly, Redis calls time out and the instances grant
// locally. Those grants would stand at the start of the measured run's
// first window, and a window or a token-bucket run that began with them
// and ended in the healthy phase would be judged against the healthy bound
// of 1.00. A fleet's cold start is not what a scenario measures; the
// warmup phase starts on a stack in its steady state.
func primeStack(ctx context.Context, cfg Config, info stack.Info, client *http.Client, policies map[string]loadtest.Policy, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	fmt.Fprintf(cfg.Log, "    priming the stack for %v (keys of their own, not judged)\n", d)
	cfg.Progress.Phase("prime")
	defer cfg.Progress.Phase("")
	_, err := loadtest.Run(ctx, loadtest.Config{
		BaseURL:      info.NginxURL,
		Routes:       cfg.Routes,
		Mix:          cfg.Mix,
		RouteMix:     cfg.routeMix,
		Policies:     policies,
		RunID:        "prime-" + loadtest.NewRunID(),
		Seed:         cfg.Seed + 1,
		Duration:     d,
		APIKeySecret: strings.Split(cfg.APIKeySecret, ",")[0],
		Client:       client,
		OnRecord:     cfg.Progress.Record,
		RLS:          cfg.rls,
	})
	if err != nil {
		return fmt.Errorf("priming the stack: %w", err)
	}
	err = retry(ctx, 30*time.Second, func() error {
		for _, a := range info.AppNames() {
			b, err := cfg.Stack.Status(ctx, a)
			if err != nil {
				return fmt.Errorf("%s: %w", a, err)
			}
			var st struct {
				Limiter *struct {
					Breaker string `json:"breaker"`
					Journal struct {
						Pending int64 `json:"pending"`
					} `json:"journal"`
				} `json:"limiter"`
			}
			if err := json.Unmarshal(b, &st); err != nil {
				return fmt.Errorf("%s: %w", a, err)
			}
			// A status without the limiter's object, or without a breaker
			// in it (another limiter behind the same HTTP surface), says
			// nothing to wait for.
			if l := st.Limiter; l != nil && (l.Breaker != "" && l.Breaker != "closed" || l.Journal.Pending > 0) {
				return fmt.Errorf("%s: breaker %s, %d grants journaled", a, l.Breaker, l.Journal.Pending)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("after priming, the stack did not settle: %w", err)
	}
	return nil
}

// retry calls f until it succeeds or d has passed.
func retry(ctx context.Context, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		if serr := sleep(ctx, 250*time.Millisecond); serr != nil {
			return errors.Join(err, serr)
		}
	}
}
