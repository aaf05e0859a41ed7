// Status: what /status and the metrics read.

package resilient

import (
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
)

// Status is a snapshot of the limiter's state, for /status and metrics.
type Status struct {
	Instance string `json:"instance"`
	Breaker  string `json:"breaker"`
	Opens    uint64 `json:"breaker_opens"`
	Live     int64  `json:"live_instances"`
	Suspect  int64  `json:"suspect_instances"`
	// Recovering counts the live instances other than this one that were
	// still deciding locally at the last heartbeat: a closed instance holds
	// their token bucket and GCRA shares back.
	Recovering     int64  `json:"recovering_instances"`
	FleetSize      int64  `json:"fleet_size"`
	StoreDecisions uint64 `json:"store_decisions"`
	LocalDecisions uint64 `json:"local_decisions"`
	// CachedRefusals are requests refused without a round trip: the store
	// had refused their key until a time not yet reached (token bucket,
	// GCRA and the log, whose retry times are exact).
	CachedRefusals uint64 `json:"cached_refusals"`
	LocalGrants    uint64 `json:"local_grants"`
	StoreFailures  uint64 `json:"store_failures"`
	// FailedDecisions are decisions whose store call failed or timed out
	// and that were decided locally instead. A timed-out call may still
	// have run in the store: with a store that reports late replies, Late
	// says what became of those; with another, each such request can be
	// charged twice (the sliding window log dedups by request id).
	FailedDecisions uint64     `json:"failed_decisions"`
	Keys            int        `json:"keys"`
	Evictions       uint64     `json:"evictions"`
	LastRecovery    *time.Time `json:"last_recovery,omitempty"`
	ClockOffsetUS   int64      `json:"clock_offset_us"`
	// Restores counts the times Redis came back without its data and this
	// instance put back the usage its snapshots knew.
	Restores uint64 `json:"restores"`
	// Raises counts the times this instance raised its keys to the usage
	// its replies had shown: when Redis came back having lost its recent
	// writes (a replica promoted while behind), and after each restore of a
	// wipe. RaisedUnits is the usage those raises put back.
	Raises      uint64 `json:"raises"`
	RaisedUnits uint64 `json:"raised_units"`
	// Rebuilt counts keys whose local state was rebuilt from the journal
	// after the table had evicted them during an outage; Spilled, the
	// snapshots evictions left in the journal for that.
	Rebuilt uint64 `json:"rebuilt"`
	Spilled uint64 `json:"spilled"`
	// Late says what became of the requests decided locally while the
	// store still had their calls (late.go).
	Late LateStats `json:"late"`
	// ResetsApplied counts the resets (one identity under one policy) this
	// instance applied: its own and those the fleet's reset log brought.
	ResetsApplied uint64 `json:"resets_applied"`
	// LostWrites counts the keys the store found to have lost writes it had
	// acknowledged (a Redis replica promoted while behind its master); 0
	// from a store that cannot tell.
	LostWrites uint64 `json:"lost_writes"`
	// Journal reconciles local grants: Granted + Reloaded = Replayed +
	// Present + Dropped + DuplicateUnits + Pending.
	Journal JournalStats `json:"journal"`
}

// JournalStats are the journal's counters, in units (a grant of cost 3 is
// 3), since this process started (Reloaded: found in the file at start):
// Granted + Reloaded = Replayed + Present + Dropped + DuplicateUnits +
// Pending, which Reconcile checks; Overflow grants were refused because
// the journal was full.
type JournalStats = journal.Stats

// Status returns the current status.
func (l *Limiter) Status() Status {
	n := l.keys.len()
	// local_grants comes from the journal's counters, read at one instant:
	// read apart, a grant made between two reads was in one and not the
	// other, and a killed instance's last status then disagreed with its
	// journal file.
	js := l.journal.Stats()
	return Status{
		Instance:        l.cfg.Instance,
		Breaker:         string(l.br.State()),
		Opens:           l.br.opens.Load(),
		Live:            l.live.Load(),
		Suspect:         l.suspect.Load(),
		Recovering:      l.recovering.Load(),
		FleetSize:       l.fleetSize(),
		StoreDecisions:  l.stats.storeDecisions.Load(),
		LocalDecisions:  l.stats.localDecisions.Load(),
		CachedRefusals:  l.stats.cachedRefusals.Load(),
		LocalGrants:     js.Granted,
		StoreFailures:   l.stats.failures.Load(),
		FailedDecisions: l.stats.failedDecisions.Load(),
		Keys:            n,
		Evictions:       l.stats.evictions.Load(),
		LastRecovery:    l.lastRecovery.Load(),
		ClockOffsetUS:   l.offset.load().us,
		Restores:        l.restores.Load(),
		Raises:          l.raises.Load(),
		RaisedUnits:     l.raisedUnits.Load(),
		Rebuilt:         l.stats.rebuilt.Load(),
		Spilled:         l.stats.spilled.Load(),
		Late:            l.lateStats(),
		ResetsApplied:   l.resets.applied.Load(),
		LostWrites:      l.lostWrites(),
		Journal:         js,
	}
}

// lostWrites asks the store's extension, when it counts them.
func (l *Limiter) lostWrites() uint64 {
	if s, ok := l.ext.(interface{ LostWrites() uint64 }); ok {
		return s.LostWrites()
	}
	return 0
}

// Breaker returns the circuit breaker's state.
func (l *Limiter) Breaker() BreakerState { return l.br.State() }

// inStore reports whether decisions go to the store now (the breaker is
// closed). The lease layer takes leases only then.
func (l *Limiter) inStore() bool { return l.br.State() == BreakerClosed }
