// Package report writes the chaos suite's outputs (README.md, "Running the chaos suite"):
// per scenario report.json and report.html, and
// summary.json over all scenarios.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
	"github.com/fleetlimit/fleetlimit/chaos/invariant"
)

// Policy is a route's policy in report.json: the algorithm, and limit with
// window_ms (window algorithms) or capacity with refill_per_s (token bucket
// and GCRA).
type Policy struct {
	Name       string   `json:"name,omitempty"`
	Algorithm  string   `json:"algorithm"`
	Limit      *int64   `json:"limit,omitempty"`
	WindowMS   *int64   `json:"window_ms,omitempty"`
	Capacity   *int64   `json:"capacity,omitempty"`
	RefillPerS *float64 `json:"refill_per_s,omitempty"`
	// Earlier is the route's policy before a change during the run (the
	// policies learned before the load differ from those learned after
	// it); absent when it did not change.
	Earlier *Policy `json:"earlier,omitempty"`
}

// PolicyOf converts a policy for report.json.
func PolicyOf(p invariant.Policy) Policy {
	out := Policy{Name: p.Name, Algorithm: p.Algorithm}
	switch p.Algorithm {
	case ideal.TokenBucket, ideal.GCRA:
		c := p.Capacity
		if c <= 0 {
			c = p.Limit
		}
		refill := float64(p.Limit) / p.Window.Seconds()
		out.Capacity, out.RefillPerS = &c, &refill
	default:
		l, w := p.Limit, p.Window.Milliseconds()
		out.Limit, out.WindowMS = &l, &w
	}
	return out
}

// Report is one scenario's report.json.
type Report struct {
	Scenario string `json:"scenario"`
	// Fault says what the scenario did.
	Fault string `json:"fault"`
	Stack string `json:"stack"`
	RunID string `json:"run_id"`
	// Skipped: the scenario could not run on this stack (SkipReason says
	// why); it has no invariants and does not pass.
	Skipped    bool   `json:"skipped,omitempty"`
	SkipReason string `json:"skip_reason,omitempty"`
	// Error: the scenario broke off (the stack did not come up, a fault
	// could not be injected); it does not pass.
	Error      string                       `json:"error,omitempty"`
	Policies   map[string]Policy            `json:"policies"`
	Phases     []invariant.Phase            `json:"phases"`
	Events     []invariant.Event            `json:"events"`
	Totals     invariant.Totals             `json:"totals"`
	Invariants []invariant.Row              `json:"invariants"`
	Failover   []invariant.InstanceFailover `json:"failover,omitempty"`
	// RedisTimeoutMS is the timeout the latency bounds of fault and
	// recovery are based on.
	RedisTimeoutMS float64 `json:"redis_timeout_ms"`
	// Affected are the instances the fault cut off from Redis (failover_ms
	// and recovery_ms are measured on them).
	Affected []string `json:"affected_instances,omitempty"`
	// NoFault: the scenario left Redis healthy (failover_ms and
	// recovery_ms are not judged).
	NoFault bool `json:"no_fault,omitempty"`
	// Statuses are the /status documents the reconciled invariant read.
	Statuses []invariant.InstanceStatus `json:"statuses,omitempty"`
	// RedisCheck is what Redis held after settle (informational).
	RedisCheck map[string]any `json:"redis_check,omitempty"`
	// ResetChecks are reset_held's figures for each reset key.
	ResetChecks []invariant.ResetCheck `json:"reset_checks,omitempty"`
	// RLSConfigChecks are rls_config_reloaded's figures for each instance.
	RLSConfigChecks []invariant.RLSConfigCheck `json:"rls_config_checks,omitempty"`
	Pass            bool                       `json:"pass"`
}

// JudgedPolicies converts the report's policies back for the invariants:
// a token bucket or GCRA policy of capacity C refilled at R per second is
// Limit C per window C/R.
func (r *Report) JudgedPolicies() map[string]invariant.Policy {
	out := map[string]invariant.Policy{}
	for route, p := range r.Policies {
		if ip, ok := p.judged(); ok {
			out[route] = ip
		}
	}
	return out
}

// EarlierPolicies are the policies the routes that changed during the run
// had before, converted as JudgedPolicies.
func (r *Report) EarlierPolicies() map[string]invariant.Policy {
	out := map[string]invariant.Policy{}
	for route, p := range r.Policies {
		if p.Earlier == nil {
			continue
		}
		if ip, ok := p.Earlier.judged(); ok {
			out[route] = ip
		}
	}
	return out
}

func (p Policy) judged() (invariant.Policy, bool) {
	ip := invariant.Policy{Name: p.Name, Algorithm: p.Algorithm}
	switch {
	case p.Capacity != nil && p.RefillPerS != nil && *p.RefillPerS > 0:
		ip.Limit, ip.Capacity = *p.Capacity, *p.Capacity
		ip.Window = time.Duration(float64(*p.Capacity) / *p.RefillPerS * float64(time.Second)).Round(time.Millisecond)
	case p.Limit != nil && p.WindowMS != nil:
		ip.Limit, ip.Window = *p.Limit, time.Duration(*p.WindowMS)*time.Millisecond
	default:
		return ip, false
	}
	return ip, true
}

// Judge sets r.Pass: every invariant passes, and the scenario ran.
func (r *Report) Judge() {
	r.Pass = !r.Skipped && r.Error == "" && len(r.Invariants) > 0
	for _, row := range r.Invariants {
		r.Pass = r.Pass && row.Pass
	}
}

// Failed names the failing rows ("over_admission /api/gcra fault").
func (r *Report) Failed() []string {
	var out []string
	for _, row := range r.Invariants {
		if !row.Pass {
			out = append(out, row.Name+" "+row.Route+" "+row.Phase)
		}
	}
	return out
}

// ScenarioResult is one scenario in summary.json.
type ScenarioResult struct {
	Name       string   `json:"name"`
	Pass       bool     `json:"pass"`
	Skipped    bool     `json:"skipped,omitempty"`
	SkipReason string   `json:"skip_reason,omitempty"`
	Error      string   `json:"error,omitempty"`
	Failed     []string `json:"failed,omitempty"`
}

// Summary is summary.json: every scenario's name and pass, and the overall
// pass. A skipped scenario does not pass, but does not fail the run either:
// Pass is true when every scenario that ran passed (and at least one ran);
// Skipped lists the others.
type Summary struct {
	Stack     string           `json:"stack"`
	Scenarios []ScenarioResult `json:"scenarios"`
	Skipped   []string         `json:"skipped,omitempty"`
	Pass      bool             `json:"pass"`
}

// Summarize builds the summary of reports.
func Summarize(stack string, reports []*Report) Summary {
	s := Summary{Stack: stack, Scenarios: []ScenarioResult{}}
	ran := 0
	s.Pass = true
	for _, r := range reports {
		s.Scenarios = append(s.Scenarios, ScenarioResult{
			Name: r.Scenario, Pass: r.Pass, Skipped: r.Skipped, SkipReason: r.SkipReason,
			Error: r.Error, Failed: r.Failed(),
		})
		if r.Skipped {
			s.Skipped = append(s.Skipped, r.Scenario)
			continue
		}
		ran++
		s.Pass = s.Pass && r.Pass
	}
	s.Pass = s.Pass && ran > 0
	return s
}

// WriteJSON writes v as indented JSON to path (through a temporary file).
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return writeFile(path, append(b, '\n'))
}

// WriteJSONL writes one JSON document per line.
func WriteJSONL[T any](path string, items []T) error {
	var sb strings.Builder
	for _, it := range items {
		b, err := json.Marshal(it)
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		sb.Write(b)
		sb.WriteByte('\n')
	}
	return writeFile(path, []byte(sb.String()))
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadJSONL reads a JSON-lines file.
func ReadJSONL[T any](path string) ([]T, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []T
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var v T
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// Routes returns the report's routes, sorted.
func (r *Report) Routes() []string {
	out := make([]string, 0, len(r.Policies))
	for k := range r.Policies {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ReadReport reads a scenario's report.json.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}
