package suite

// What a scenario's run leaves: its invariants computed, its outputs
// written (and read again by Reanalyze), and the state it reads from the
// stack (the apps' uncounted requests and Redis timeout, the Redis check).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/invariant"
	"github.com/fleetlimit/fleetlimit/chaos/report"
	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/redis/go-redis/v9"
)

// analyze computes the invariants and totals of a finished run.
func analyze(rep *report.Report, reqs []invariant.Request) {
	in := invariant.Input{
		Requests:     reqs,
		Phases:       rep.Phases,
		Policies:     rep.JudgedPolicies(),
		RedisTimeout: time.Duration(rep.RedisTimeoutMS * float64(time.Millisecond)),
		Affected:     rep.Affected,
		FailedAtMS:   failedAt(rep.Events),
		Statuses:     rep.Statuses,
		NoFault:      rep.NoFault,
		Events:       rep.Events,
		Changes:      changesOf(rep),
	}
	if _, ok := in.Policies[LeaseRoute]; ok {
		in.LeaseRoutes = []string{LeaseRoute}
	}
	rep.Invariants = invariant.Check(in)
	rep.ResetChecks = invariant.ResetChecks(reqs, rep.Phases, in.Policies, rep.Events)
	rep.RLSConfigChecks = invariant.RLSConfigChecks(reqs, in.Policies, rep.Events, rep.Statuses)
	rep.Failover, _ = invariant.Failover(reqs, rep.Phases, rep.Affected, in.FailedAtMS)
	rep.Totals = invariant.ComputeTotals(reqs, rep.Phases)
}

// readPhaseStatus reads every instance's uncounted_requests and lease
// counters from its /status; an instance that does not answer is left out
// (of the leases also one without lease counters).
func readPhaseStatus(ctx context.Context, st stack.Stack, info stack.Info) (map[string]float64, map[string]invariant.LeaseCounters) {
	counted := map[string]float64{}
	leases := map[string]invariant.LeaseCounters{}
	for _, a := range info.AppNames() {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		b, err := st.Status(c, a)
		cancel()
		var body struct {
			Uncounted *float64                 `json:"uncounted_requests"`
			Lease     *invariant.LeaseCounters `json:"lease"`
		}
		if err != nil || json.Unmarshal(b, &body) != nil {
			continue
		}
		if body.Uncounted != nil {
			counted[a] = *body.Uncounted
		}
		if body.Lease != nil {
			leases[a] = *body.Lease
		}
	}
	if len(leases) == 0 {
		leases = nil
	}
	return counted, leases
}

// DrainWait bounds how long, after the load stops, the suite waits for every
// instance's journal to hold nothing before it reads the final statuses
// (drainJournals): a grant made locally in settle's last moments (a call
// that timed out in a host stall) is replayed at the next tick, and one
// whose call is still in doubt once the late window (RL_LATE_WINDOW, 5 s)
// has passed.
const DrainWait = 8 * time.Second

// drainJournals waits, at most DrainWait, until no instance reports grants
// still journaled or in doubt. What is still there then is judged as it is
// (reconciled wants 0).
func drainJournals(ctx context.Context, st stack.Stack, info stack.Info) {
	deadline := time.Now().Add(DrainWait)
	for {
		drained := true
		for _, a := range info.AppNames() {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			b, err := st.Status(c, a)
			cancel()
			var body struct {
				Limiter struct {
					Journal struct {
						Pending uint64 `json:"pending"`
						Doubts  int    `json:"doubts"`
					} `json:"journal"`
				} `json:"limiter"`
			}
			if err != nil || json.Unmarshal(b, &body) != nil {
				continue // an instance that does not answer is judged as it is
			}
			if j := body.Limiter.Journal; j.Pending > 0 || j.Doubts > 0 {
				drained = false
			}
		}
		if drained || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// failedAt is the time of the first redis_down event (0: none).
func failedAt(events []invariant.Event) float64 {
	for _, e := range events {
		if e.Event == "redis_down" {
			return e.TMS
		}
	}
	return 0
}

// Reanalyze recomputes the invariants, report.json and report.html of a
// scenario directory from its requests.jsonl and the run facts in its
// report.json (policies, phases, events, statuses, timeout, affected
// instances).
func Reanalyze(dir string) (*report.Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		return nil, err
	}
	var rep report.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s/report.json: %w", dir, err)
	}
	if rep.Skipped {
		return &rep, nil
	}
	reqs, err := report.ReadJSONL[invariant.Request](filepath.Join(dir, "requests.jsonl"))
	if err != nil {
		return nil, err
	}
	rep.Error = ""
	analyze(&rep, reqs)
	rep.Judge()
	return &rep, writeOutputs(dir, &rep, reqs)
}

func writeOutputs(dir string, rep *report.Report, reqs []invariant.Request) error {
	if err := report.WriteJSON(filepath.Join(dir, "report.json"), rep); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.html"))
	if err != nil {
		return err
	}
	if err := report.RenderHTML(f, rep, reqs); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// statusTimeout reads the Redis timeout from the first app's /status, if it
// reports one (redis_timeout_ms as a number, or redis_timeout as a Go
// duration string).
func statusTimeout(ctx context.Context, st stack.Stack, info stack.Info) (time.Duration, bool) {
	if len(info.Apps) == 0 {
		return 0, false
	}
	b, err := st.Status(ctx, info.Apps[0].Name)
	if err != nil {
		return 0, false
	}
	var doc map[string]any
	if json.Unmarshal(b, &doc) != nil {
		return 0, false
	}
	if v, ok := doc["redis_timeout_ms"].(float64); ok && v > 0 {
		return time.Duration(v * float64(time.Millisecond)), true
	}
	if s, ok := doc["redis_timeout"].(string); ok {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			return d, true
		}
	}
	return 0, false
}

// redisCheck records what Redis holds after settle: its key count and the
// replay idempotency markers (keys with ":replay:" in their name). It is
// information for the reader, not part of any verdict.
func redisCheck(ctx context.Context, rdb *redis.Client) map[string]any {
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out := map[string]any{}
	n, err := rdb.DBSize(ctx).Result()
	if err != nil {
		out["error"] = err.Error()
		return out
	}
	out["keys"] = n
	markers := 0
	iter := rdb.Scan(ctx, 0, "*:replay:*", 1000).Iterator()
	for iter.Next(ctx) {
		markers++
	}
	if err := iter.Err(); err != nil {
		out["error"] = err.Error()
	}
	out["replay_markers"] = markers
	return out
}
