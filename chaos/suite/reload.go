package suite

// reload-under-load: the policy file and the rate limit service's
// configuration change under load and reach the instances one at a time,
// during a Redis outage. The invariants judge each key against the policy
// in force (invariant.Change), from the reload events and the policies
// learned before the load and after it; the configuration change leaves the
// door's descriptor as it was (its keys are judged as in any scenario), and
// rls_config_reloaded checks that it reached every instance.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/invariant"
	"github.com/fleetlimit/fleetlimit/chaos/report"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// The policy files of reload-under-load, relative to the repository: the
// suite's policies (chaos/policies.json) with the token bucket at 150,
// then with it lowered to 100, GCRA raised from 100 to 150 and the lease
// route's lease shortened from 2 s to 1 s. Every quota stays at 100 or
// more, as the contract's chaos stacks have it; the load is sized from
// the first file's.
const (
	ReloadBefore = "chaos/reload/before.json"
	ReloadAfter  = "chaos/reload/after.json"
)

// ReloadRLS is the rate limit service configuration of reload-under-load,
// relative to the repository: the stack's (stack.RLSConfigDir) with one
// descriptor added that no load uses, so its version changes while the
// door's descriptor, its limit and its counts stay.
const ReloadRLS = "chaos/reload/rls"

// rlsVersion reads an app's rls_config_version from its /status ("": none).
func rlsVersion(ctx context.Context, e *Env, app string) string {
	b, err := e.Stack.Status(ctx, app)
	if err != nil {
		return ""
	}
	var st struct {
		Version string `json:"rls_config_version"`
	}
	_ = json.Unmarshal(b, &st)
	return st.Version
}

// reloadSetup gives every app the first policy file, before the policies
// are learned and the load starts, and records its RLS configuration
// version (rls_config_reloaded wants the change to move it).
func reloadSetup(ctx context.Context, e *Env) error {
	for _, a := range e.Info.AppNames() {
		v, err := e.Stack.SetPolicies(ctx, a, ReloadBefore)
		if err != nil {
			return err
		}
		e.Event("policy_file", fmt.Sprintf("%s: %s (policy version %s), before the load", a, ReloadBefore, v))
		e.Action(invariant.Event{Event: invariant.EventRLSConfig, Instance: a, Version: rlsVersion(ctx, e, a),
			Detail: "the RLS configuration before the load"})
	}
	return nil
}

// reloadUnderLoad SIGKILLs Redis, gives the apps ReloadRLS and then the
// second policy file one at a time, at 1/8, 3/8, 5/8 and 7/8 of the fault
// (each reload recorded with the bracket of its call), and restarts Redis
// with its data at the end of the fault. The configuration goes first:
// SetRLSConfig returns once the app's own watch has read it, so the policy
// change's SIGHUP, which re-reads both, cannot be what applied it.
func reloadUnderLoad(ctx context.Context, e *Env) error {
	apps := e.Info.AppNames()
	start := time.Now()
	if err := e.Stack.KillRedis(ctx); err != nil {
		return err
	}
	e.Event("redis_down", "SIGKILL")
	n := time.Duration(len(apps))
	for i, a := range apps {
		if err := sleep(ctx, time.Until(start.Add(e.Fault*time.Duration(2*i+1)/(2*n)))); err != nil {
			return err
		}
		sent := time.Now()
		v, err := e.Stack.SetRLSConfig(ctx, a, ReloadRLS)
		if err != nil {
			return err
		}
		e.Action(invariant.Event{Event: invariant.EventRLSReload, Detail: ReloadRLS + " (..data swapped, no signal)",
			Instance: a, Route: RLSRoute, Version: v, TSendMS: loadtest.UnixMS(sent), TRecvMS: loadtest.UnixMS(time.Now())})
		sent = time.Now()
		v, err = e.Stack.SetPolicies(ctx, a, ReloadAfter)
		if err != nil {
			return err
		}
		e.Action(invariant.Event{Event: invariant.EventReload, Detail: fmt.Sprintf("%s (policy version %s)", ReloadAfter, v),
			Instance: a, TSendMS: loadtest.UnixMS(sent), TRecvMS: loadtest.UnixMS(time.Now())})
	}
	return restartRedisAt(ctx, e, start.Add(e.Fault))
}

// changesOf returns the routes whose policy changed during the run (those
// with an earlier policy in rep.Policies), each from the first reload's
// t_send to the last one's t_recv. Without reload events the change is
// taken to have happened as the first phase began.
func changesOf(rep *report.Report) map[string]invariant.Change {
	var first, last float64
	for _, e := range rep.Events {
		if e.Event != invariant.EventReload {
			continue
		}
		if first == 0 || e.TSendMS < first {
			first = e.TSendMS
		}
		last = max(last, e.TRecvMS)
	}
	if first == 0 && len(rep.Phases) > 0 {
		first, last = rep.Phases[0].StartMS, rep.Phases[0].StartMS
	}
	earlier := rep.EarlierPolicies()
	out := map[string]invariant.Change{}
	for route, p := range earlier {
		out[route] = invariant.Change{Before: p, FirstMS: first, LastMS: last}
	}
	return out
}
