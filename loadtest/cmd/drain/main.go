// Command drain waits until every app's journal is empty and its breaker
// closed, polling each admin URL's /status, and prints how long that took
// from Redis' first answer (with -redis: it pings Redis every 5 ms until
// it answers; without, from its own start) and how often each breaker
// opened again meanwhile (a bounce: recovering, then open again).
// scripts/measure-drain.sh starts it the moment Redis is back.
//
//	drain -redis 127.0.0.1:6390 -admins http://127.0.0.1:9081,http://127.0.0.1:9082
//
// One process polling over kept-alive connections: a shell loop of curls
// would take the CPU the replay it measures needs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "drain:", err)
		os.Exit(1)
	}
}

// status is the part of an app's /status that drain reads.
type status struct {
	Limiter struct {
		Breaker string `json:"breaker"`
		Opens   uint64 `json:"breaker_opens"`
		Journal struct {
			Pending uint64 `json:"pending"`
		} `json:"journal"`
	} `json:"limiter"`
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	admins := fs.String("admins", "", "the apps' admin URLs, comma separated")
	every := fs.Duration("every", 20*time.Millisecond, "poll interval")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	redisAddr := fs.String("redis", "", "Redis' address: the clock starts at its first answer")
	password := fs.String("redis-password", os.Getenv("REDIS_PASSWORD"), "Redis' password")
	if err := fs.Parse(args); err != nil {
		return err
	}
	urls := strings.FieldsFunc(*admins, func(r rune) bool { return r == ',' })
	if len(urls) == 0 {
		return errors.New("-admins names no URL")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	start := time.Now()
	if *redisAddr != "" {
		var err error
		if start, err = firstAnswer(ctx, *redisAddr, *password); err != nil {
			return err
		}
	}
	client := &http.Client{Timeout: time.Second}
	var last []status
	first := map[int]uint64{} // each app's openings at its first answer
	for {
		last = last[:0]
		done := true
		for _, u := range urls {
			s, err := get(ctx, client, u+"/status")
			if err != nil {
				done = false
				break
			}
			if _, ok := first[len(last)]; !ok {
				first[len(last)] = s.Limiter.Opens
			}
			last = append(last, s)
			done = done && s.Limiter.Breaker == "closed" && s.Limiter.Journal.Pending == 0
		}
		if done {
			from := "start"
			if *redisAddr != "" {
				from = "Redis answered"
			}
			fmt.Fprintf(out, "drained and closed %d ms after %s; breakers reopened meanwhile:", time.Since(start).Milliseconds(), from)
			for i, s := range last {
				fmt.Fprintf(out, " %d", s.Limiter.Opens-first[i])
			}
			fmt.Fprintln(out, " (0 each: no bounce)")
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not drained after %v: %+v", *timeout, last)
		case <-time.After(*every):
		}
	}
}

func get(ctx context.Context, c *http.Client, url string) (status, error) {
	var s status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return s, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// firstAnswer pings Redis every 5 ms and returns when it first answered.
func firstAnswer(ctx context.Context, addr, password string) (time.Time, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password, MaxRetries: -1,
		DialTimeout: 50 * time.Millisecond, ReadTimeout: 50 * time.Millisecond, PoolSize: 1})
	defer c.Close()
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("redis %s: no answer: %w", addr, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
