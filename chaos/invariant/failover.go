package invariant

// Failover and recovery times: how long each affected instance took to
// answer from its fallback once Redis failed, and from Redis once it was
// back.

import (
	"fmt"
	"math"
	"strings"
)

// InstanceFailover is one instance's failover and recovery time, in ms;
// negative where there was no such answer.
type InstanceFailover struct {
	Instance   string  `json:"instance"`
	FailoverMS float64 `json:"failover_ms"`
	RecoveryMS float64 `json:"recovery_ms"`
}

// Failover measures, for each affected instance, the time from Redis'
// failure to its first answer in mode "local" received during the fault,
// and from the end of the fault phase to its first answer in mode "redis"
// received after it. Redis failed at failedAtMS (Unix ms) if that lies in
// the fault phase (a fault that starts with something the instances cannot
// notice, such as replication cut before the master is killed), else at the
// fault phase's start.
func Failover(reqs []Request, phases []Phase, affected []string, failedAtMS float64) (out []InstanceFailover, ok bool) {
	var fault Phase
	for _, p := range phases {
		if p.Name == Fault {
			fault, ok = p, true
		}
	}
	if !ok {
		return nil, false
	}
	start, end := msToUS(fault.StartMS), msToUS(fault.EndMS)
	if at := msToUS(failedAtMS); at > start && at < end {
		start = at
	}
	for _, inst := range affected {
		f := InstanceFailover{Instance: inst, FailoverMS: -1, RecoveryMS: -1}
		firstLocal, firstRedis := int64(math.MaxInt64), int64(math.MaxInt64)
		for _, r := range reqs {
			if r.Instance != inst {
				continue
			}
			t := recvUS(r)
			switch {
			case r.Mode == "local" && t >= start && t < end:
				firstLocal = min(firstLocal, t)
			case r.Mode == "redis" && t >= end:
				firstRedis = min(firstRedis, t)
			}
		}
		if firstLocal != math.MaxInt64 {
			f.FailoverMS = round(float64(firstLocal-start)/1000, 1)
		}
		if firstRedis != math.MaxInt64 {
			f.RecoveryMS = round(float64(firstRedis-end)/1000, 1)
		}
		out = append(out, f)
	}
	return out, true
}

// FailoverRows are the failover_ms (phase fault) and recovery_ms (phase
// recovery) rows: the worst affected instance, or which instances never
// answered in that mode.
func FailoverRows(reqs []Request, phases []Phase, affected []string, failedAtMS float64) []Row {
	fo := Row{Name: FailoverMS, Route: AllRoutes, Phase: Fault, Bound: float64(FailoverBoundMS)}
	rc := Row{Name: RecoveryMS, Route: AllRoutes, Phase: Recovery, Bound: float64(RecoveryBoundMS)}
	per, ok := Failover(reqs, phases, affected, failedAtMS)
	if !ok {
		fo.Measured, rc.Measured = "no fault phase", "no fault phase"
		return []Row{fo, rc}
	}
	if len(per) == 0 {
		fo.Measured, rc.Measured = "no affected instance", "no affected instance"
		return []Row{fo, rc}
	}
	// worst is the largest value, or why there is none.
	worst := func(get func(InstanceFailover) float64, what string) (float64, string) {
		var missing []string
		w := 0.0
		for _, f := range per {
			v := get(f)
			if v < 0 {
				missing = append(missing, f.Instance)
				continue
			}
			w = max(w, v)
		}
		if len(missing) > 0 {
			return 0, fmt.Sprintf("no %s from %s", what, strings.Join(missing, ", "))
		}
		return w, ""
	}
	for _, x := range []struct {
		row   *Row
		get   func(InstanceFailover) float64
		what  string
		bound float64
	}{
		{&fo, func(f InstanceFailover) float64 { return f.FailoverMS }, "local answer during the fault", FailoverBoundMS},
		{&rc, func(f InstanceFailover) float64 { return f.RecoveryMS }, "redis answer after the fault", RecoveryBoundMS},
	} {
		v, why := worst(x.get, x.what)
		if why != "" {
			x.row.Measured = why
			continue
		}
		x.row.Measured, x.row.Pass = v, v <= x.bound
	}
	return []Row{fo, rc}
}
