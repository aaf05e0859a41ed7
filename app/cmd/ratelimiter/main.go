// Command ratelimiter runs the rate-limiter service (package service): the
// public port behind nginx and the admin port. Settings come from RL_*
// environment variables (README.md, "Configuration"); a bad one stops the start
// with one line on stderr naming it, and exit code 2.
//
// With -healthcheck URL it instead GETs URL with a 2 s timeout and exits 0
// on a 2xx answer, 1 otherwise: the Docker HEALTHCHECK of a distroless image,
// which has no curl.
//
// With -keys N it prints N new API keys, one per line, signed with the
// first secret of RL_API_KEY_SECRET (what `make keys N=<n>` runs); with
// -key-id ID, the key of that id (the README's demo key is
// `-key-id demo`). The running stack accepts them when it has the same
// secret.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fleetlimit/fleetlimit/app/internal/service"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
)

func main() {
	healthcheck := flag.String("healthcheck", "", "GET `URL` with a 2 s timeout; exit 0 on 2xx, 1 otherwise")
	keys := flag.Int("keys", 0, "print `N` new API keys signed with RL_API_KEY_SECRET, one per line, and exit")
	keyID := flag.String("key-id", "", "print the API key of `ID` signed with RL_API_KEY_SECRET, and exit")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "ratelimiter: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if *healthcheck != "" {
		os.Exit(check(*healthcheck))
	}
	if *keys > 0 || *keyID != "" {
		if err := printKeys(os.Stdout, os.Getenv("RL_API_KEY_SECRET"), *keys, *keyID); err != nil {
			fmt.Fprintln(os.Stderr, "ratelimiter: "+err.Error())
			os.Exit(2)
		}
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "ratelimiter: "+strings.ReplaceAll(err.Error(), "\n", " "))
	if _, ok := errors.AsType[*service.ConfigError](err); ok {
		os.Exit(2)
	}
	os.Exit(1)
}

// run runs the service until ctx ends, re-reading its policy file and its
// rate limit service configuration on every SIGHUP (service.Server.Reload: a
// bad file is logged and changes nothing).
func run(ctx context.Context) error {
	// Subscribed before the start, so a SIGHUP that comes during it is not
	// the default action (exit).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	s, err := service.Start(ctx, os.Getenv, os.Stdout, os.Stderr)
	if err != nil {
		return err
	}
	go func() {
		for {
			select {
			case <-hup:
				_ = s.Reload() // logged, counted and in /status
			case <-ctx.Done():
				return
			}
		}
	}()
	return s.Wait()
}

// printKeys prints n new keys, or the key of id, signed with the first of
// the comma-separated secrets.
func printKeys(w io.Writer, secrets string, n int, id string) error {
	if secrets == "" {
		return errors.New("RL_API_KEY_SECRET: not set (keys are signed with its first secret)")
	}
	v, err := apikey.NewVerifier(strings.Split(secrets, ",")...)
	if err != nil {
		return fmt.Errorf("RL_API_KEY_SECRET: %w", err)
	}
	ids := []string{id}
	if id == "" {
		ids = make([]string, n)
		for i := range ids {
			ids[i] = apikey.NewID()
		}
	}
	for _, id := range ids {
		k, err := v.Sign(id)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(w, k); err != nil {
			return err
		}
	}
	return nil
}

// check is the -healthcheck probe.
func check(url string) int {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		return 1
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		fmt.Fprintln(os.Stderr, "healthcheck:", resp.Status)
		return 1
	}
	return 0
}
