package service

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRedisVersion: the version is read from INFO server's text, and a
// text without one is not a version.
func TestRedisVersion(t *testing.T) {
	for _, tt := range []struct {
		info         string
		major, minor int
		version      string
		ok           bool
	}{
		{"# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n", 7, 0, "7.0.15", true},
		{"# Server\r\nredis_version:6.2.14\r\n", 6, 2, "6.2.14", true},
		{"redis_version:255.255.255\n", 255, 255, "255.255.255", true},
		{"# Server\r\nredis_mode:standalone\r\n", 0, 0, "", false},
		{"redis_version:seven\r\n", 0, 0, "seven", false},
	} {
		major, minor, version, ok := redisVersion(tt.info)
		if major != tt.major || minor != tt.minor || version != tt.version || ok != tt.ok {
			t.Errorf("%q: %d %d %q %v, want %d %d %q %v", tt.info, major, minor, version, ok, tt.major, tt.minor, tt.version, tt.ok)
		}
	}
}

// TestRunRefusesOldRedis: a Redis that says it is 6.2 (a fake server that
// answers INFO, and refuses every other command) stops the start with one
// line, a *ConfigError naming RL_REDIS_ADDRS.
func TestRunRefusesOldRedis(t *testing.T) {
	addr := fakeRedis(t, "6.2.0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := Run(ctx, envOf(map[string]string{
		"RL_INSTANCE": "t", "RL_LISTEN_ADDR": "127.0.0.1:0", "RL_ADMIN_ADDR": "127.0.0.1:0",
		"RL_REDIS_ADDRS": addr, "RL_JOURNAL_DIR": t.TempDir(),
	}), io.Discard, io.Discard)
	var ce *ConfigError
	want := "RL_REDIS_ADDRS: Redis 6.2.0 is too old: fleetlimit needs Redis 7.0 or later (functions)"
	if !errors.As(err, &ce) || err.Error() != want {
		t.Fatalf("error = %v, want the ConfigError %q", err, want)
	}
}

// fakeRedis serves RESP on a free port until the test ends: INFO gets an
// INFO server text of the given version, PING gets PONG, anything else an
// unknown-command error.
func fakeRedis(t *testing.T, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFakeRedis(conn, version)
		}
	}()
	return ln.Addr().String()
}

func serveFakeRedis(conn net.Conn, version string) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "*") {
			return
		}
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		var args []string
		for range n {
			if _, err := r.ReadString('\n'); err != nil { // $<len>
				return
			}
			arg, err := r.ReadString('\n')
			if err != nil {
				return
			}
			args = append(args, strings.TrimSpace(arg))
		}
		var reply string
		switch strings.ToLower(args[0]) {
		case "info":
			body := "# Server\r\nredis_version:" + version + "\r\nredis_mode:standalone\r\n"
			reply = fmt.Sprintf("$%d\r\n%s\r\n", len(body), body)
		case "ping":
			reply = "+PONG\r\n"
		default:
			reply = "-ERR unknown command '" + args[0] + "'\r\n"
		}
		if _, err := io.WriteString(conn, reply); err != nil {
			return
		}
	}
}
