// Package stack drives the two demo stacks for the chaos suite: the native
// one (package native, which make local-up / local-down run; .run/stack.json,
// processes and the toxiproxy API) and the compose one (make up / down, the
// compose CLI).
// Each fault the scenarios need is one method; a stack that cannot inject a
// fault returns an *UnsupportedError saying why.
package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/native"
)

// App is one rate-limiter instance, as the native stack's stack.json
// describes it.
type App = native.App

// Node is a Redis process of the native stack: a data node or a Sentinel.
type Node = native.Node

// Info is what the suite needs to know about a running stack; for the
// native stack it is .run/stack.json.
type Info struct {
	NginxURL  string `json:"nginx_url"`
	RedisAddr string `json:"redis_addr"`
	RedisPID  int    `json:"redis_pid"`
	ProxyAPI  string `json:"proxy_api"`
	Apps      []App  `json:"apps"`
	// UpstreamURL is the base URL, through nginx, of the upstream that is
	// not Go and that nginx protects with auth_request; RLSAddr the
	// host:port of Envoy's rate limit service balanced by nginx (plaintext
	// gRPC). Empty: the stack has no such door.
	UpstreamURL string `json:"upstream_url"`
	RLSAddr     string `json:"rls_addr"`
	// Topology is the native stack's LOCAL_TOPOLOGY: "single", "sentinel"
	// or "cluster".
	Topology string `json:"topology"`
	// RedisNodes are the data nodes, "redis" (RedisAddr) first.
	RedisNodes []Node `json:"redis_nodes"`
	// Sentinels, MasterName and ReplicationProxy (the toxiproxy proxy the
	// replica starts replicating through) are set in the sentinel topology.
	Sentinels        []Node `json:"sentinels"`
	MasterName       string `json:"master_name"`
	ReplicationProxy string `json:"replication_proxy"`
	// AdminToken is the bearer token the apps' /admin/* and /debug/*
	// accept (RL_ADMIN_TOKEN): not in stack.json, the suite gives it to
	// the stacks it starts (AdminTokens).
	AdminToken string `json:"-"`
}

// DemoAdminToken is the demo stacks' RL_ADMIN_TOKEN when none is set.
const DemoAdminToken = "fleetlimit-demo-admin-token-change-me"

// AdminTokens returns RL_ADMIN_TOKEN from the environment (comma-separated,
// the apps accept each), else the demo stacks' default, and the first of
// them, which the suite sends.
func AdminTokens() (all, first string) {
	all = os.Getenv("RL_ADMIN_TOKEN")
	if strings.TrimSpace(all) == "" {
		all = DemoAdminToken
	}
	first, _, _ = strings.Cut(all, ",")
	return all, strings.TrimSpace(first)
}

// ReadInfo reads a stack file (.run/stack.json, as package native writes
// it).
func ReadInfo(path string) (Info, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Info{}, fmt.Errorf("stack.json: %w", err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("stack.json %s: %w", path, err)
	}
	return info, nil
}

// AppNames lists the instances' names.
func (i Info) AppNames() []string {
	out := make([]string, len(i.Apps))
	for k, a := range i.Apps {
		out[k] = a.Name
	}
	return out
}

// Stack is a running (or startable) demo stack.
type Stack interface {
	// Name is "local" or "compose".
	Name() string
	// Up starts the stack from scratch (stopping a running one first) and
	// returns its description once every service is ready. needs names
	// the capability the coming fault needs ("latency"; "" for the common
	// ones), so a stack can add what only that fault needs.
	Up(ctx context.Context, needs string) (Info, error)
	// Down stops everything Up started.
	Down(ctx context.Context) error
	// Flush empties Redis (FLUSHALL) and compacts its AOF, so that a
	// scenario starts from an empty store and Redis restarts fast.
	Flush(ctx context.Context) error

	KillRedis(ctx context.Context) error
	// StartRedis starts Redis after KillRedis, with its data or (wipe)
	// without, and returns once it answers.
	StartRedis(ctx context.Context, wipe bool) error
	PauseRedis(ctx context.Context) error
	ResumeRedis(ctx context.Context) error
	KillApp(ctx context.Context, app string) error
	// StartApp starts an app after KillApp and returns once it is ready.
	StartApp(ctx context.Context, app string) error
	// Partition cuts app off Redis (on) or reconnects it (off).
	Partition(ctx context.Context, app string, on bool) error
	// Latency delays every Redis reply to every app by d, give or take up
	// to jitter, drawn per reply (d 0: removes it).
	Latency(ctx context.Context, d, jitter time.Duration) error
	// SetClock moves app's wall clock offset from the host's (0: back to
	// it), through the admin endpoint the chaos stacks open
	// (RL_DEBUG_CLOCK).
	SetClock(ctx context.Context, app string, offset time.Duration) error
	// Status returns an app's admin /status body.
	Status(ctx context.Context, app string) ([]byte, error)
	// SetPolicies gives app the policy file at path (relative to the
	// repository, or absolute) and has it re-read its policies (SIGHUP),
	// and returns the policy version it reports once it has (its
	// /status), or why it kept the ones in force. The other apps keep
	// theirs. Needs a stack started with NeedsReload.
	SetPolicies(ctx context.Context, app, path string) (version string, err error)
	// SetRLSConfig gives app the rate limit service configuration in the
	// directory srcDir (relative to the repository, or absolute) as a
	// Kubernetes ConfigMap update does (a new directory, the ..data
	// symlink swapped), without a signal: the app notices it by itself.
	// It returns the rls_config_version the app reports once it has (its
	// /status), or why it kept the configuration in force. The other apps
	// keep theirs. Needs a stack started with NeedsReload.
	SetRLSConfig(ctx context.Context, app, srcDir string) (version string, err error)
	// Unsupported says why a fault ("latency", ...) cannot be injected on
	// this stack; "" if it can.
	Unsupported(fault string) string
}

// UnsupportedError is a fault the stack cannot inject.
type UnsupportedError struct{ Fault, Reason string }

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s: not supported on this stack: %s", e.Fault, e.Reason)
}

// FindRoot returns the repository root: the nearest directory from dir
// upwards holding a Makefile and scripts/.
func FindRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if isFile(filepath.Join(d, "Makefile")) && isDir(filepath.Join(d, "scripts")) {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("no repository root (a directory with a Makefile and scripts/) above " + dir)
		}
		d = parent
	}
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// runner runs commands in the repository root, their output to log.
type runner struct {
	root string
	log  io.Writer
	env  []string
	// nice, when set, is the nice value commands run at from their start
	// (what they start inherits it): once the stack's processes have
	// stackNice, the commands that inject faults (the docker CLI) get
	// scriptNice, so their CPU comes from what the stack leaves.
	nice *int
}

// scriptNice is the nice value of the commands run during a measured run.
const scriptNice = 10

// logf writes a line to the log, if there is one.
func (r runner) logf(format string, args ...any) {
	if r.log != nil {
		fmt.Fprintf(r.log, format+"\n", args...)
	}
}

// run runs name args, output to the log; the error carries the command.
func (r runner) run(ctx context.Context, name string, args ...string) error {
	return r.runAt(ctx, r.nice, name, args...)
}

// runAt is run at nice value *nice (nil: this process's).
func (r runner) runAt(ctx context.Context, nice *int, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = r.root
	cmd.Stdout, cmd.Stderr = r.log, r.log
	cmd.Env = append(os.Environ(), r.env...)
	cmd.WaitDelay = 5 * time.Second
	if err := start(cmd, nice); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// start starts cmd and gives its process *nice (nil: leaves it).
func start(cmd *exec.Cmd, nice *int) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	if nice != nil {
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, *nice)
	}
	return nil
}

// output runs name args and returns its stdout (stderr to the log).
func (r runner) output(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = r.root
	cmd.Stderr = r.log
	cmd.Env = append(os.Environ(), r.env...)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := start(cmd, r.nice); err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	if err := cmd.Wait(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out.Bytes(), nil
}

// RLSConfigDir is the configuration of Envoy's rate limit service the suite
// runs its stacks with, relative to the repository: the descriptor of the
// gRPC door's load (suite.RLSRoute).
const RLSConfigDir = "chaos/rls"

// PolicyFile is the policy file the suite runs its stacks with, relative
// to the repository: the demo policies with a per-address ceiling sized for
// the suite's load, which comes from one address (about 800 requests/s
// over the four routes, above the demo's ceiling of 1000 per 10 s).
const PolicyFile = "chaos/policies.json"
