// Package resilient is a ratelimit.Limiter that stays correct while its
// shared store is out. It wraps the store (a store.Store: redisstore) with a
// circuit breaker and decides locally while the breaker is open: from a
// fallback budget that is this instance's share of what the store last said
// was left, so the fleet as a whole stays within the limit and polite
// clients are not blocked.
//
// The breaker opens after FailureThreshold consecutive failures, a failure
// being an error or a call that outlived Timeout. While open no request
// touches the store; a prober pings it every ProbeInterval and, once it
// answers, the breaker moves to BreakerRecovering (the journal of local
// grants is replayed, each batch once) and then BreakerClosed. The
// recovery step by step: docs/REPLAY.md.
//
// Every instance heartbeats into the store. An instance whose heartbeat is
// missing may be cut off from the store but still granting its share
// locally, for up to LeaseGrace: until then the others hold its share back
// (docs/GUARANTEES.md, "One instance cut off").
package resilient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/reqid"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/statekey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// warmConnections is how many connections a start, and a recovery, open
// ahead.
const warmConnections = 8

// Limiter is a fault-tolerant ratelimit.Limiter. It is safe for concurrent
// use. Create it with New and stop it with Close.
type Limiter struct {
	store   store.Store
	ext     any              // the store's extension (contract.Extension): its optional interfaces
	wire    contract.Decider // the store's decisions with weights and states
	cfg     Config
	br      breaker
	seeds   statekey.Seeds
	journal *journal.Journal
	ids     *reqid.Minter // for requests without an id
	replay  sync.Mutex    // one replay at a time
	// chargedThrough is the store time (µs) through which the last replay
	// pass charged token bucket and GCRA shares (guarded by replay).
	chargedThrough int64

	clock   localClock
	offset  offsetHolder // the store's clock against clock
	live    atomic.Int64
	suspect atomic.Int64
	// heldBack is how many instances decisions hold shares back for: the
	// suspect count, once two heartbeats in a row found that many
	// missing (the smaller of the two counts). One late heartbeat is a
	// stalled process far more often than a partition: holding back on
	// it would cut every key to a share of its quota for an interval, and
	// refuse polite clients while Redis is healthy
	// (TestOneMissedHeartbeatHoldsNothingBack). confirmedAt counts the interval
	// it costs a partitioned instance.
	heldBack atomic.Int64
	// recovering is how many live instances other than this one were not
	// yet deciding in the store at the last heartbeat (stageClosed): a
	// closed instance holds their token bucket and GCRA shares back too.
	recovering atomic.Int64
	warming    atomic.Bool // a Warm is running
	fleetSeen  atomic.Bool
	lastBeat   atomic.Int64 // local µs of the last heartbeat Redis acknowledged
	// missedBeats counts the heartbeats failed in a row.
	missedBeats atomic.Int64
	gen         atomic.Pointer[string] // the store's data generation last seen
	// syncGen names the generation this instance recovers to (or is at),
	// stage how far it got (recovery.go), and stages the live instances'
	// as the last heartbeat returned them (nil: the store keeps none).
	syncGen atomic.Pointer[string]
	stage   atomic.Int32
	stages  atomic.Pointer[[]string]
	// liveBefore is how many instances were live or suspect when the
	// breaker last opened: a store that lost its data forgot the others'
	// heartbeats, and recovery waits for them to come back all the same.
	// Suspect ones count: an instance cut off before this one (its
	// heartbeats lapsed, or it suspended itself) comes back with a snapshot
	// to raise to (TestLastToOpenWaitsForTheInstancesAlreadyOut).
	liveBefore atomic.Int64
	restores   atomic.Uint64
	raises     atomic.Uint64
	// raisedUnits is the usage raises put back.
	raisedUnits atomic.Uint64

	keys *keyTable
	// lateReplies: the store reports the fate of abandoned calls, so a
	// timed-out call's local grant is a doubt until it does (late.go).
	lateReplies bool
	late        lateBook
	resets      resets // reset.go
	onForget    atomic.Pointer[func(ratelimit.Policy, store.Identity)]

	stats struct {
		storeDecisions, localDecisions, cachedRefusals atomic.Uint64
		failures, failedDecisions, evictions           atomic.Uint64
		rebuilt, spilled                               atomic.Uint64
	}
	lastRecovery atomic.Pointer[time.Time]
	recoverStart time.Time // owned by the loop goroutine

	cancel context.CancelFunc
	done   chan struct{}
	closed atomic.Bool
}

var _ ratelimit.Limiter = (*Limiter)(nil)

type key = statekey.Key

// New returns a Limiter wrapping backend and starts its background loop
// (heartbeats and, while open, probes). The store is not contacted
// synchronously: an unreachable store at start is not an error.
//
// Grants left in the journal by an earlier process (killed during an
// outage) are reloaded: they are charged to the local budgets, so their
// quota is not granted again, and the breaker starts open, so they are
// replayed before the store is trusted.
func New(backend store.Store, cfg Config) (*Limiter, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	l := &Limiter{store: backend, ext: contract.Extension(backend), cfg: cfg, seeds: statekey.NewSeeds(), done: make(chan struct{}), clock: newLocalClock(cfg.Now())}
	l.ids = reqid.New(cfg.Instance + "-")
	if d, ok := l.ext.(contract.Decider); ok {
		l.wire = d
	} else {
		l.wire = plainStore{backend}
	}
	keys, err := newKeyTable(cfg.KeyCapacity, l.evicted)
	if err != nil {
		return nil, fmt.Errorf("resilient: %w", err)
	}
	l.keys = keys
	if l.journal, err = journal.Open(cfg.JournalDir, cfg.Instance, cfg.JournalMax, cfg.Logger); err != nil {
		return nil, fmt.Errorf("resilient: %w", err)
	}
	if l.journal.Len() > 0 {
		// No other goroutine yet: no locks.
		l.journal.Each(func(p ratelimit.Policy, id store.Identity, g store.Grant, s *journal.Snapshot) {
			k := l.keyOfIdentity(p, id)
			e, _ := l.keys.shard(k).get(k)
			if !e.localInit {
				e.startFrom(p, id, s, float64(cfg.ExpectedInstances))
			}
			e.charge(p, g)
			e.journaled = true
		})
		l.br.state.Store(stateNumber(BreakerOpen))
		l.br.opens.Add(1)
	}
	if s, ok := l.ext.(contract.LateReporter); ok {
		l.lateReplies = s.OnLate(cfg.LateWindow, l.onLate)
	}
	if _, ok := l.ext.(contract.Refunder); ok && l.lateReplies {
		l.late.refunds.queue = make(chan contract.LateReply, maxRefunds)
	}
	l.br.threshold = cfg.FailureThreshold
	l.br.slowWindow = cfg.SlowWindow
	l.br.stallAfter = 2 * cfg.Timeout
	// On a sharded store (a Redis Cluster) a refused call says that one
	// master is down, not the store: the calls to the others must go on.
	if s, ok := l.ext.(contract.Sharded); ok && s.Sharded() {
		l.br.shardedStore = true
	}
	l.br.now = l.clock.now
	l.br.lastSuccess.Store(l.clock.now().UnixMicro())
	l.br.onChange = func(from, to BreakerState, reason string) {
		if to == BreakerOpen && from == BreakerClosed {
			l.liveBefore.Store(l.live.Load() + l.suspect.Load())
			if s, ok := l.ext.(contract.Suspender); ok {
				go func() { // best effort: the store may well be out
					ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
					defer cancel()
					_ = s.Suspend(ctx, cfg.Instance, cfg.HeartbeatTTL, cfg.LeaseGrace)
				}()
			}
		}
		l.cfg.Logger.Warn("rate limiter breaker transition", "from", string(from), "to", string(to), "reason", reason)
		if cfg.OnTransition != nil {
			cfg.OnTransition(from, to)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	if s, ok := l.ext.(contract.Refunder); ok && l.late.refunds.queue != nil {
		for range refundSenders {
			go l.sendRefunds(ctx, s)
		}
	}
	go l.loop(ctx)
	return l, nil
}

// Close stops the background loop and removes this instance's heartbeat, so
// the others do not hold its share back.
func (l *Limiter) Close(ctx context.Context) error {
	if l.closed.Swap(true) {
		return nil
	}
	l.cancel()
	<-l.done
	if l.br.State() == BreakerClosed && l.journal.Len() > 0 {
		_ = l.replayJournal(ctx) // best effort; what is left stays in the file
	}
	jerr := l.journal.Close()
	callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout*4)
	defer cancel()
	if err := l.store.Leave(callCtx, l.cfg.Instance, l.cfg.HeartbeatTTL, l.cfg.LeaseGrace); err != nil {
		return errors.Join(jerr, fmt.Errorf("resilient: leave: %w", err))
	}
	return jerr
}
