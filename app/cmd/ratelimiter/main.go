// Command ratelimiter runs the rate-limiter service (package service): the
// public port behind nginx and the admin port. Settings come from RL_*
// environment variables (README.md, "Configuration"); a bad one stops the start
// with one line on stderr naming it, and exit code 2.
//
// With -healthcheck URL it instead GETs URL with a 2 s timeout and exits 0
// on a 2xx answer, 1 otherwise: the Docker HEALTHCHECK of a distroless image,
// which has no curl.
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
)

func main() {
	healthcheck := flag.String("healthcheck", "", "GET `URL` with a 2 s timeout; exit 0 on 2xx, 1 otherwise")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "ratelimiter: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if *healthcheck != "" {
		os.Exit(check(*healthcheck))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := service.Run(ctx, os.Getenv, os.Stdout, os.Stderr)
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
