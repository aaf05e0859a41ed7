package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/invariant"
	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// Scenario is one fault of the contract's table.
type Scenario struct {
	Name string
	// Fault describes the fault for the report.
	Fault string
	// Needs names the stack capability the fault needs (stack.NeedsLatency,
	// ...), for stack.Unsupported and Stack.Up; "" for the common ones.
	Needs string
	// Affected returns the instances the fault cuts off from Redis.
	Affected func(info stack.Info) []string
	// Inject runs the whole fault: it returns once the fault is over (Redis
	// is back and answering, the partition healed, ...). The fault phase is
	// the time Inject runs.
	Inject func(ctx context.Context, e *Env) error
	// AbortShare is the share of the load's HTTP requests whose clients
	// reset their connections at random points, through the whole run
	// (loadtest.Config.AbortShare).
	AbortShare float64
	// NoFault: Redis stays healthy (failover_ms and recovery_ms are not
	// judged).
	NoFault bool
	// Setup, if set, runs once the stack is up, before the policies are
	// learned (reload-under-load gives every app its first policy file).
	Setup func(ctx context.Context, e *Env) error
	// Recover, if set, runs as the recovery phase begins, beside the load
	// (reset-partition's probe); the phase still lasts its duration.
	Recover func(ctx context.Context, e *Env) error
}

// Env is what a scenario's Inject works with.
type Env struct {
	Stack stack.Stack
	Info  stack.Info
	// Fault is how long the fault lasts (15 s by default).
	Fault time.Duration
	// Flap is the span of redis-flap's four kill/restart cycles (20 s).
	Flap time.Duration
	// Window is the policies' window; Timeout the apps' Redis call timeout.
	Window, Timeout time.Duration
	// Event records a fault event (t_ms is taken when it is called).
	Event func(event, detail string)
	// Snapshots collects the last /status of app incarnations killed during
	// the run (for the reconciled invariant).
	Snapshots []invariant.InstanceStatus
	// Action records an event with its fields (an operator's reset, a
	// reload): the invariants read them.
	Action func(invariant.Event)
	// Client sends the scenario's own requests; Record writes one into
	// requests.jsonl beside the load's (safe for concurrent use).
	Client *http.Client
	Record func(loadtest.Record)
	// Policies are the routes' policies as learned before the load; RunID
	// names the run's keys; APIKeySecret signs them.
	Policies     map[string]loadtest.Policy
	RunID        string
	APIKeySecret string

	// reset is reset-partition's plan, from its fault to its probe.
	reset *resetPlan
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cleanupCtx is for undoing a fault after ctx ended.
func cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

func allApps(info stack.Info) []string { return info.AppNames() }

// partitionVictim is the app partition-one cuts off: app1 (the first).
func partitionVictim(info stack.Info) []string {
	if len(info.Apps) == 0 {
		return nil
	}
	return []string{info.Apps[0].Name}
}

// crashVictim is the app app-crash kills: the second one (app2), so that
// the partitioned and the crashed instance differ between scenarios.
func crashVictim(info stack.Info) string {
	if len(info.Apps) > 1 {
		return info.Apps[1].Name
	}
	if len(info.Apps) == 1 {
		return info.Apps[0].Name
	}
	return ""
}

// All is every scenario of the contract, in its order.
var All = []Scenario{
	{
		Name:     "redis-kill",
		Fault:    "SIGKILL Redis; restart it after the fault duration with its data (AOF)",
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			return killRestart(ctx, e, e.Fault, false)
		},
	},
	{
		Name:     "redis-pause",
		Fault:    "SIGSTOP Redis for the fault duration, then SIGCONT: connections hang instead of failing",
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) (err error) {
			if err := e.Stack.PauseRedis(ctx); err != nil {
				return err
			}
			e.Event("redis_down", "SIGSTOP")
			resumed := false
			defer func() {
				if !resumed {
					c, cancel := cleanupCtx(ctx)
					defer cancel()
					if rerr := e.Stack.ResumeRedis(c); rerr == nil {
						e.Event("redis_up", "SIGCONT (cleanup)")
					}
				}
			}()
			if err := sleep(ctx, e.Fault); err != nil {
				return err
			}
			if err := e.Stack.ResumeRedis(ctx); err != nil {
				return err
			}
			resumed = true
			e.Event("redis_up", "SIGCONT")
			return nil
		},
	},
	{
		Name: "redis-flap",
		Fault: "Redis killed and restarted four times within the flap span (20 s): kills 5 s apart, " +
			"each SIGKILL followed by 1.5 s down and a restart with its data",
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			// Kills at 0, 1/4, 1/2 and 3/4 of the span; each restart takes
			// what a start needs (well under a second), so the fourth
			// is up well within the span. A restart that overran the next
			// slot still leaves Redis up for half a second before the kill.
			cycle := e.Flap / 4
			down := cycle * 3 / 10
			start := time.Now()
			var earliest time.Time // Redis stays up at least until then
			for i := range 4 {
				next := start.Add(time.Duration(i) * cycle)
				if next.Before(earliest) {
					next = earliest
				}
				if err := sleep(ctx, time.Until(next)); err != nil {
					return err
				}
				if err := killRestart(ctx, e, down, false); err != nil {
					return fmt.Errorf("cycle %d: %w", i+1, err)
				}
				earliest = time.Now().Add(500 * time.Millisecond)
			}
			return nil
		},
	},
	{
		Name:     "redis-wipe",
		Fault:    "SIGKILL Redis, then restart it after the fault duration without its data",
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			return killRestart(ctx, e, e.Fault, true)
		},
	},
	{
		Name:     "redis-latency",
		Fault:    "every Redis reply delayed by 300 ms for the fault duration (a latency toxic on every app's proxy)",
		Needs:    stack.NeedsLatency,
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			return withLatency(ctx, e, 300*time.Millisecond, 0)
		},
	},
	{
		Name:     "partition-one",
		Fault:    "one app instance (app1) loses Redis for the fault duration while the others keep it",
		Needs:    stack.NeedsPartition,
		Affected: partitionVictim,
		Inject: func(ctx context.Context, e *Env) error {
			victim := partitionVictim(e.Info)
			if len(victim) == 0 {
				return fmt.Errorf("no app to partition")
			}
			app := victim[0]
			if err := e.Stack.Partition(ctx, app, true); err != nil {
				return err
			}
			e.Event("partition_start", app)
			if err := sleep(ctx, e.Fault); err != nil {
				c, cancel := cleanupCtx(ctx)
				defer cancel()
				_ = e.Stack.Partition(c, app, false)
				return err
			}
			if err := e.Stack.Partition(ctx, app, false); err != nil {
				return err
			}
			e.Event("partition_end", app)
			return nil
		},
	},
	{
		Name:     "app-crash",
		Fault:    "during a Redis outage (SIGKILL, restarted after the fault duration), one app instance (app2) is SIGKILLed a third into it and restarted at once",
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			app := crashVictim(e.Info)
			if app == "" {
				return fmt.Errorf("no app to crash")
			}
			start := time.Now()
			if err := e.Stack.KillRedis(ctx); err != nil {
				return err
			}
			e.Event("redis_down", "SIGKILL")
			if err := sleep(ctx, e.Fault/3); err != nil {
				return err
			}
			// The incarnation about to die: its counters count toward
			// reconciled, its journal belongs to the next incarnation.
			snap := invariant.InstanceStatus{Instance: app}
			if b, err := e.Stack.Status(ctx, app); err != nil {
				snap.Err = "before the kill: " + err.Error()
			} else if err := json.Unmarshal(b, &snap.Body); err != nil {
				snap.Err = "before the kill: " + err.Error()
			}
			e.Snapshots = append(e.Snapshots, snap)
			if err := e.Stack.KillApp(ctx, app); err != nil {
				return err
			}
			e.Event("app_down", app+" SIGKILL")
			if err := e.Stack.StartApp(ctx, app); err != nil {
				return err
			}
			e.Event("app_up", app)
			return restartRedisAt(ctx, e, start.Add(e.Fault))
		},
	},
	{
		Name: "master-failover",
		Fault: "Sentinel topology: SIGKILL the master; the Sentinels promote its replica; " +
			"the former master is restarted after the fault duration, as a fresh replica (without its data, which the resync replaces anyway)",
		Needs:    stack.NeedsSentinel,
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			return sentinelFailover(ctx, e, 0)
		},
	},
	{
		Name: "failover-lag",
		Fault: "Sentinel topology: replication cut for 5 s under load (the master keeps acknowledging writes), " +
			"then the master is SIGKILLed and its replica promoted without those writes; " +
			"the former master is restarted after the fault duration, as a fresh replica",
		Needs:    stack.NeedsSentinel,
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			return sentinelFailover(ctx, e, lagFor)
		},
	},
	{
		Name: "master-failover-cluster",
		Fault: "Cluster topology: SIGKILL the master that holds the fleet's heartbeats; its replica is promoted; " +
			"the former master stays down for the rest of the run",
		Needs:    stack.NeedsCluster,
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			return clusterFault(ctx, e, false)
		},
	},
	{
		Name: "shard-wipe",
		Fault: "Cluster topology: one master that does not hold the fleet's heartbeats is SIGKILLed and restarted at once " +
			"without its data (before its replica takes over), while the other masters keep theirs",
		Needs:    stack.NeedsCluster,
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			return clusterFault(ctx, e, true)
		},
	},
	{
		Name: "redis-slow",
		Fault: "every Redis reply delayed at random across the decision timeout (0.4-1.2 of it, a latency toxic " +
			"with jitter on every app's proxy) for the fault duration: some calls answer in time, some time out after Redis applied them",
		Needs:    stack.NeedsLatency,
		Affected: allApps,
		Inject: func(ctx context.Context, e *Env) error {
			d, jitter := e.Timeout*8/10, e.Timeout*4/10
			return withLatency(ctx, e, d, jitter)
		},
	},
	{
		Name: "clock-step",
		Fault: "during a Redis outage (SIGKILL, restarted after the fault duration), one app instance's (app1) wall clock " +
			"jumps a window ahead a third into it and back two thirds into it",
		Affected: allApps,
		Inject:   clockStep,
	},
	{
		Name: "client-abort",
		Fault: "through the whole run a share of the requests (5 %) reset their connections at random points, from at once " +
			"after sending to after a typical answer; Redis stays healthy",
		Affected:   func(stack.Info) []string { return nil },
		AbortShare: 0.05,
		NoFault:    true,
		Inject: func(ctx context.Context, e *Env) error {
			e.Event("aborts", "5 % of the requests, through the whole run")
			return sleep(ctx, e.Fault)
		},
	},
	{
		Name: "reset-partition",
		Fault: "one app instance (app1) loses Redis for the fault duration while two reset keys spend their quota on it " +
			"(sliding window log, requests sent straight to app1); a fifth of the fault before the heal both are reset " +
			"through app2's POST /admin/reset (one under the route's policy, one under every policy) and spend again on app1; " +
			"after the heal a probe through app2 reads how much of their quota the store holds (reset_held)",
		Needs:    stack.NeedsResetPartition,
		Affected: partitionVictim,
		Inject:   resetPartition,
		Recover:  probeResets,
	},
	{
		Name: "reload-under-load",
		Fault: "Redis SIGKILLed for the fault duration (restarted with its data) while the RLS configuration and the " +
			"policy file change, reaching the instances one at a time (spread over the fault): the RLS configuration's " +
			"..data symlink swapped, no signal (a descriptor no load uses added; the door's unchanged), then the policy " +
			"file replaced and SIGHUP: the token bucket's limit lowered, GCRA's raised, the lease route's lease " +
			"shortened (chaos/reload/)",
		Needs:    stack.NeedsReload,
		Affected: allApps,
		Setup:    reloadSetup,
		Inject:   reloadUnderLoad,
	},
}

// Names lists the scenario names.
func Names() []string {
	out := make([]string, len(All))
	for i, s := range All {
		out[i] = s.Name
	}
	return out
}

// Select returns the named scenarios in the contract's order; "" or "all"
// selects every one.
func Select(list string) ([]Scenario, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "all" {
		return All, nil
	}
	var want []string
	for n := range strings.SplitSeq(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want = append(want, n)
		}
	}
	var out []Scenario
	for _, n := range want {
		if !slices.Contains(Names(), n) {
			return nil, fmt.Errorf("unknown scenario %q (known: %s)", n, strings.Join(Names(), ", "))
		}
	}
	for _, s := range All {
		if slices.Contains(want, s.Name) {
			out = append(out, s)
		}
	}
	return out, nil
}
