package suite

// reset-partition: an operator resets keys whose usage a partitioned
// instance holds in its journal, and the partition heals within a window
// of the reset. Its reset keys are not the load's: the scenario sends
// their requests itself, one after the other, so that each one is
// certainly before or after the reset, and reads after the heal, with a
// probe, how much of their quota the store holds (invariant.ResetChecks).

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/invariant"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// ResetRoute is where reset-partition's reset keys send: a sliding window
// log, whose usage in the store is the count of the last window's
// admissions, so that reset_held is exact.
const ResetRoute = "/api/sliding-window-log"

// resetPlan is what reset-partition's fault leaves for its probe.
type resetPlan struct {
	keys []loadtest.Key
	// firstSend is when the first request of a reset key was sent: the
	// probe must end within a window of it (ResetChecks).
	firstSend time.Time
}

// resetShares sizes the reset keys' requests on app1, as fractions of the
// route's quota: before the reset a fifth, after it a tenth. A partitioned
// instance grants a fresh key its share of the quota (a quarter with four
// instances), so it admits all of the first and part of the second:
// grants before the reset that must not come back, and grants after it
// that must not be lost.
const (
	resetBefore = 0.2
	resetAfter  = 0.1
)

// resetPartition cuts app1 off Redis for the fault duration. From 0.4 to
// 0.25 of it before the heal, each of two reset keys sends a fifth of its
// quota straight to app1; at 0.2 before the heal both are reset through
// app2 (one under the route's policy, one under every policy); then each
// sends a tenth of its quota to app1 until the heal. Every request is
// sent once the previous one was answered, the resets once every request
// before them was, and nothing while a reset is in flight.
func resetPartition(ctx context.Context, e *Env) error {
	if len(e.Info.Apps) < 2 {
		return fmt.Errorf("reset-partition needs two apps, the stack has %d", len(e.Info.Apps))
	}
	victim, healthy := e.Info.Apps[0], e.Info.Apps[1]
	if victim.URL == "" || healthy.AdminURL == "" {
		return fmt.Errorf("reset-partition needs %s's URL and %s's admin URL", victim.Name, healthy.Name)
	}
	p, ok := e.Policies[ResetRoute]
	if !ok {
		return fmt.Errorf("no policy learned for %s", ResetRoute)
	}
	plan := &resetPlan{}
	for i := range 2 {
		name := fmt.Sprintf("%s-%s-reset%d-%s", loadtest.Abusive, loadtest.ShortRoute(ResetRoute), i+1, e.RunID)
		header, err := loadtest.SignKey(e.APIKeySecret, name)
		if err != nil {
			return err
		}
		plan.keys = append(plan.keys, loadtest.Key{Route: ResetRoute, Name: name, Header: header, Class: loadtest.Abusive})
	}
	e.reset = plan
	policies := []string{p.Name, ""} // the route's policy; every policy

	start := time.Now()
	heal := start.Add(e.Fault)
	if err := e.Stack.Partition(ctx, victim.Name, true); err != nil {
		return err
	}
	e.Event("partition_start", victim.Name)
	healed := false
	defer func() {
		if !healed {
			c, cancel := cleanupCtx(ctx)
			defer cancel()
			_ = e.Stack.Partition(c, victim.Name, false)
		}
	}()

	before := max(1, int(resetBefore*float64(p.Quota)))
	after := max(1, int(resetAfter*float64(p.Quota)))
	if err := sleep(ctx, time.Until(heal.Add(-e.Fault*4/10))); err != nil {
		return err
	}
	plan.firstSend = time.Now()
	if err := e.spend(ctx, victim.URL, plan.keys, before, heal.Add(-e.Fault/4)); err != nil {
		return err
	}
	if err := sleep(ctx, time.Until(heal.Add(-e.Fault/5))); err != nil {
		return err
	}
	for i, k := range plan.keys {
		if err := e.resetKey(ctx, healthy.Name, healthy.AdminURL, k, policies[i]); err != nil {
			return err
		}
	}
	for _, k := range plan.keys {
		e.keyState(ctx, victim.Name, victim.AdminURL, k, "after the resets")
	}
	if err := e.spend(ctx, victim.URL, plan.keys, after, heal.Add(-e.Fault/20)); err != nil {
		return err
	}
	if err := sleep(ctx, time.Until(heal)); err != nil {
		return err
	}
	if err := e.Stack.Partition(ctx, victim.Name, false); err != nil {
		return err
	}
	healed = true
	e.Event("partition_end", victim.Name)
	return nil
}

// spend sends n requests of each key to base, one after the other (the
// keys in turn), spread evenly until by.
func (e *Env) spend(ctx context.Context, base string, keys []loadtest.Key, n int, by time.Time) error {
	gap := time.Until(by) / time.Duration(n)
	next := time.Now()
	for range n {
		if err := sleep(ctx, time.Until(next)); err != nil {
			return err
		}
		next = next.Add(gap)
		for _, k := range keys {
			r, err := loadtest.Send(ctx, e.Client, base, k)
			if err != nil {
				return err
			}
			e.Record(r)
		}
	}
	return nil
}

// resetKey sends POST /admin/reset for k (under policy; "": every policy)
// to an app's admin URL, and records the reset with its bracket. Anything
// but a fleet-wide reset (200, scope "fleet") fails the run: the reset
// itself is not what the scenario tests.
func (e *Env) resetKey(ctx context.Context, app, adminURL string, k loadtest.Key, policy string) error {
	body, err := json.Marshal(struct {
		Key    string `json:"key"`
		Policy string `json:"policy,omitempty"`
	}{"k:" + k.Name, policy})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(adminURL, "/")+"/admin/reset", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.Info.AdminToken)
	sent := time.Now()
	resp, err := e.Client.Do(req)
	if err != nil {
		return fmt.Errorf("reset %s on %s: %w", k.Name, app, err)
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	recv := time.Now()
	var res struct {
		Scope string `json:"scope"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(answer, &res) != nil || res.Scope != "fleet" {
		return fmt.Errorf("reset %s on %s: %s %s, want 200 and scope fleet", k.Name, app, resp.Status, bytes.TrimSpace(answer))
	}
	detail := "under " + policy
	if policy == "" {
		detail = "under every policy"
	}
	e.Action(invariant.Event{Event: invariant.EventReset, Detail: detail + ", scope " + res.Scope, Key: k.Name, Route: k.Route,
		Policy: policy, Instance: app, TSendMS: loadtest.UnixMS(sent), TRecvMS: loadtest.UnixMS(recv)})
	return nil
}

// probeWait bounds the wait for app1's journal before the probe.
const probeWait = 3 * time.Second

// probeResets, as recovery begins: once app1 reports its breaker closed
// and nothing journaled or in doubt (it has replayed what it granted while
// cut off, or dropped it), and app2 holds back no instance's share (until
// its next heartbeat after app1's return, app2 counts app1 as suspect and
// decides against the limit less app1's share: the probe would read a
// lower limit as usage), each reset key sends requests through app2, one
// at a time, until three in a row are refused (at most its quota and ten
// more): in the sliding window log the store admits exactly what the
// key's usage leaves of its quota. Each key's probe is recorded as an
// event; a key not probed (app1 did not drain in time) has none, and
// reset_held says so.
func probeResets(ctx context.Context, e *Env) error {
	plan := e.reset
	if plan == nil || len(plan.keys) == 0 {
		return fmt.Errorf("reset-partition: no reset keys to probe")
	}
	victim, healthy := e.Info.Apps[0], e.Info.Apps[1]
	deadline := time.Now().Add(probeWait)
	if latest := plan.firstSend.Add(e.Window - time.Second); latest.Before(deadline) {
		deadline = latest
	}
	why := ""
	for {
		why = cmp.Or(drained(ctx, e, victim.Name), holdsBack(ctx, e, healthy.Name))
		if why == "" || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	if why != "" {
		e.Event("reset_probe_skipped", why)
		return nil
	}
	p := e.Policies[ResetRoute]
	for _, k := range plan.keys {
		e.keyState(ctx, healthy.Name, healthy.AdminURL, k, "before the probe")
	}
	for _, k := range plan.keys {
		var firstMS, lastMS float64
		refusedInRow := 0
		for sent := 0; refusedInRow < 3 && sent < int(p.Quota)+10; sent++ {
			r, err := loadtest.Send(ctx, e.Client, healthy.URL, k)
			if err != nil {
				return err
			}
			e.Record(r)
			if firstMS == 0 {
				firstMS = r.TSendMS
			}
			lastMS = r.TRecvMS
			if r.Limited() {
				refusedInRow++
			} else {
				refusedInRow = 0
			}
		}
		e.Action(invariant.Event{Event: invariant.EventResetProbe, Detail: "requests one at a time until three in a row were refused",
			Key: k.Name, Route: k.Route, Instance: healthy.Name, TSendMS: firstMS, TRecvMS: lastMS})
	}
	return nil
}

// limiterStatus is what the probe's wait reads of an app's /status.
type limiterStatus struct {
	Breaker    string `json:"breaker"`
	Suspect    int64  `json:"suspect_instances"`
	Recovering int64  `json:"recovering_instances"`
	Journal    struct {
		Pending int64 `json:"pending"`
		Doubts  int64 `json:"doubts"`
	} `json:"journal"`
}

// readLimiter reads app's /status: its limiter's part (nil in memory mode),
// or why it could not.
func readLimiter(ctx context.Context, e *Env, app string) (*limiterStatus, string) {
	c, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	b, err := e.Stack.Status(c, app)
	if err != nil {
		return nil, app + " /status: " + err.Error()
	}
	var st struct {
		Limiter *limiterStatus `json:"limiter"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, app + " /status: " + err.Error()
	}
	return st.Limiter, ""
}

// holdsBack says why app decides against less than a policy's whole limit
// ("": it does not): at its last heartbeat some instance was suspect
// (missing) or still recovering, and app holds back its share.
func holdsBack(ctx context.Context, e *Env, app string) string {
	l, why := readLimiter(ctx, e, app)
	if l != nil && (l.Suspect > 0 || l.Recovering > 0) {
		return fmt.Sprintf("%s holds back shares: %d instances suspect, %d recovering", app, l.Suspect, l.Recovering)
	}
	return why
}

// drained says why app has not settled after the heal ("": it has: its
// breaker closed, no grant journaled or in doubt).
func drained(ctx context.Context, e *Env, app string) string {
	l, why := readLimiter(ctx, e, app)
	if l != nil && (l.Breaker != "" && l.Breaker != "closed" || l.Journal.Pending > 0 || l.Journal.Doubts > 0) {
		return fmt.Sprintf("%s: breaker %s, %d grants journaled, %d in doubt", app, l.Breaker, l.Journal.Pending, l.Journal.Doubts)
	}
	return why
}

// keyState records, as an event, what app's GET /admin/keys says of k's
// identity under the reset route's policy: the store's count and the units
// app journaled. Not judged: it tells how a reset_held that fails came
// about (the journal before the heal, the store before the probe).
func (e *Env) keyState(ctx context.Context, app, adminURL string, k loadtest.Key, when string) {
	p := e.Policies[ResetRoute]
	u := strings.TrimRight(adminURL, "/") + "/admin/keys?key=" + url.QueryEscape("k:"+k.Name) + "&policy=" + url.QueryEscape(p.Name)
	c, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	detail := when + ": "
	req, err := http.NewRequestWithContext(c, http.MethodGet, u, nil)
	if err == nil {
		req.Header.Set("Authorization", "Bearer "+e.Info.AdminToken)
		var resp *http.Response
		if resp, err = e.Client.Do(req); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			_ = resp.Body.Close()
			detail += strings.TrimSpace(string(b))
		}
	}
	if err != nil {
		detail += err.Error()
	}
	e.Action(invariant.Event{Event: "reset_key_state", Detail: detail, Key: k.Name, Route: k.Route, Instance: app})
}
