// Recovery: the background loop (heartbeats while closed, probes while
// open) and the breaker's way back to closed; replay.go sends the journal.

package resilient

import (
	"context"
	"errors"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// loop heartbeats while closed and probes while open, until Close.
func (l *Limiter) loop(ctx context.Context) {
	defer close(l.done)
	l.heartbeat(ctx)
	// After the first heartbeat, which tells the fleet's size, and beside
	// the loop: opening connections (on Sentinel each asks a Sentinel for
	// the master) must not delay the next heartbeats, or the fleet takes
	// this instance for missing and holds its share back.
	l.warm(ctx)
	tick := time.NewTicker(l.cfg.HeartbeatInterval)
	defer tick.Stop()
	var lastProbe time.Time
	// refused: the last probe was answered at once with an error (the
	// connection refused or reset: Redis' process is down, or loading).
	// Such a probe costs the store nothing, so the next one goes at the
	// next tick instead of after ProbeInterval: a restarted Redis is seen
	// within a HeartbeatInterval. A probe that timed out (a hung or
	// partitioned store) waits ProbeInterval.
	refused := false
	// again: the next probe goes at the next tick, once; if that fails too,
	// the store is failing, and the interval applies. Two probes set it:
	//   - one whose ping was answered but what follows it (the generation,
	//     a restore, the replay) failed: a store that just came back often
	//     fails the first pass, its first new connections being slow, and
	//     a whole ProbeInterval would keep the instance local for another
	//     interval (TestFailedReplayIsRetriedAtOnceThenAtTheInterval,
	//     TestFailedRestoreIsRetried);
	//   - one that timed out right after a refused one: a Redis starting
	//     more often than a hung one. Its process listens before it
	//     answers, and the first connection to it (through a proxy, with
	//     AUTH and HELLO, while it loads its data) can outlive a Timeout;
	//     waiting ProbeInterval would keep this instance local after the
	//     others, and they wait for it to close
	//     (TestTimeoutAfterRefusalProbesAgainSoon).
	again, retried := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if l.lateReplies {
			l.expireLate()
		}
		switch l.br.State() {
		case BreakerClosed:
			l.heartbeat(ctx)
			if l.journal.Len() > 0 {
				// Grants made while recovering, or left by a failed
				// pass: fold them in now.
				if err := l.replayJournal(ctx); err != nil && ctx.Err() == nil {
					l.br.failure("replay: "+err.Error(), isTimeout(err))
				}
			}
		case BreakerOpen:
			soon := refused || (again && !retried)
			if now := l.clock.now(); soon || now.Sub(lastProbe) >= l.cfg.ProbeInterval-l.cfg.HeartbeatInterval/2 {
				lastProbe = now
				retried = again && !refused
				wasRefused := refused
				var answered bool
				refused, answered = l.probe(ctx)
				timedOut := !refused && !answered && l.br.State() == BreakerOpen
				again = answered || (wasRefused && timedOut)
			}
		case BreakerRecovering:
			l.heartbeat(ctx)
			l.maybeClose(ctx)
			again, retried = l.br.State() == BreakerOpen, false
		}
	}
}

// warm opens warmConnections connections of the store's pool beside the
// loop (on Sentinel each asks a Sentinel for the master, and a dial can
// outlive a heartbeat interval), one Warm at a time.
func (l *Limiter) warm(ctx context.Context) {
	w, ok := l.ext.(contract.Warmer)
	if !ok || !l.warming.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer l.warming.Store(false)
		w.Warm(ctx, warmConnections)
	}()
}

// slowBeatsToOpen is how many heartbeats in a row outliving their deadline
// open a closed breaker.
const slowBeatsToOpen = 3

func (l *Limiter) heartbeat(ctx context.Context) {
	callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	sent := l.clock.now()
	var fleet store.Fleet
	var err error
	written := l.stageToken()
	if st, ok := l.ext.(contract.Stager); ok {
		fleet, err = st.HeartbeatStage(callCtx, l.cfg.Instance, l.cfg.HeartbeatTTL, l.cfg.LeaseGrace, written)
	} else {
		fleet, err = l.store.Heartbeat(callCtx, l.cfg.Instance, l.cfg.HeartbeatTTL, l.cfg.LeaseGrace)
	}
	if err != nil {
		if fleet.Live > 0 {
			// The fleet's part answered and another part failed (on a
			// Cluster, the generation of a master that is down): the counts
			// are current, and they say which instances went local
			// (suspended) so that this one holds their shares back.
			l.setFleet(fleet.Live, fleet.Suspect)
		}
		if ctx.Err() == nil {
			l.stats.failures.Add(1)
			missed := int64(0) // heartbeats failed in a row while closed
			if l.br.State() == BreakerClosed {
				missed = l.missedBeats.Add(1)
			} else {
				l.missedBeats.Store(0)
			}
			if missed > 0 && (!isTimeout(err) || missed >= slowBeatsToOpen && l.br.quietFor(l.cfg.SlowWindow)) {
				// The store (on a Cluster, one of its masters) refused a
				// heartbeat, or three in a row did not answer in time. Every
				// instance's heartbeat reaches every master, so each of
				// them sees this within an interval or two. Counting it as
				// one failure among the decisions instead let an instance
				// whose decisions mostly reached the healthy masters stay
				// in Redis for up to a second while the others spent their
				// local shares: a partition the fleet could not see. Slow
				// heartbeats open it only when nothing else succeeded for
				// SlowWindow either: a store that answers the decisions,
				// late or not, is slow, not dead, and every instance that
				// went local over it made the others hold back their
				// shares from the polite clients
				// (TestBreakerSlowStoreStaysClosed,
				// TestSlowHeartbeatsOpenAfterThree).
				l.br.trip("heartbeat: " + err.Error())
			} else {
				l.br.failure("heartbeat: "+err.Error(), isTimeout(err))
			}
		}
		return
	}
	l.missedBeats.Store(0)
	l.br.success()
	l.learnOffset(fleet.Now, sent, l.clock.now())
	live, suspect, gen := fleet.Live, fleet.Suspect, fleet.Generation
	if _, ok := l.ext.(contract.Stager); ok {
		l.stages.Store(&fleet.Stages)
		l.recovering.Store(recoveringOthers(fleet.Stages, written))
	}
	l.setFleet(live, suspect)
	l.lastBeat.Store(l.clock.now().UnixMicro())
	l.pollResets(ctx)
	if l.gen.Load() == nil {
		l.gen.Store(&gen)
		stage := int32(stageReplayed)
		if l.br.State() == BreakerClosed {
			stage = stageClosed
		}
		l.beginSync(gen, stage)
		return
	}
	if l.generationChanged(gen) && l.br.State() == BreakerClosed && l.br.set(BreakerClosed, BreakerRecovering, "the store lost data") {
		// Redis lost its data between two heartbeats, too fast for the
		// breaker to notice. Decide locally while the fleet puts back
		// what the snapshots knew and replays its journals, as after an
		// outage (resync).
		l.liveBefore.Store(int64(live + suspect))
		if !l.resync(ctx, gen) {
			l.br.set(BreakerRecovering, BreakerOpen, "restore failed")
		}
	}
}

// The recovery stages an instance writes beside its heartbeats, for the
// data generation it recovers to. An instance decides in the store again
// only once every live instance is at stageReplayed; after a restore that
// raised keys, one replays only once every live instance has restored
// (a raise after another's replay could undo part of it).
//
// stageClosed is an instance deciding in the store again. One that has
// replayed goes on deciding locally until it closes, from its share; the
// grants it makes meanwhile reach the store only at its next pass. So a
// closed instance holds back the token bucket and GCRA shares of every live
// instance not yet closed, as it does a suspect's (weight): without that,
// the first to close spent in the store what was left of the shares that
// the others were still granting locally, and the fleet admitted over the
// limit right after a full outage (redis-kill).
const (
	stageBack     = 0 // back; what the store lost not yet put back
	stageRestored = 1 // put back (raised); journal not yet replayed
	stageReplayed = 2 // journal replayed (or nothing to replay)
	stageClosed   = 3 // deciding in the store again
)

// recoveringOthers counts the live instances other than this one whose
// stage (as a heartbeat returned them) is before stageClosed: recovering,
// they may be granting locally. An instance with no stage yet (its first
// heartbeat) or of another generation at stageClosed (it has not yet seen
// the store lose data) decides in the store. This instance wrote written
// with that heartbeat: it is among them if written was.
func recoveringOthers(stages []string, written string) int64 {
	n := int64(0)
	for _, v := range stages {
		if recoveringStage(v) {
			n++
		}
	}
	if recoveringStage(written) {
		n--
	}
	return max(0, n)
}

// recoveringStage reports whether a stage token ("<generation>:<stage>")
// is of an instance that has not closed.
func recoveringStage(token string) bool {
	_, s, ok := strings.Cut(token, ":")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(s)
	return err == nil && n < stageClosed
}

// beginSync starts the recovery to generation gen at stage.
func (l *Limiter) beginSync(gen string, stage int32) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(gen))
	tok := strconv.FormatUint(uint64(h.Sum32()), 36)
	l.syncGen.Store(&tok)
	l.stage.Store(stage)
}

// stageToken is what this instance writes beside its heartbeat:
// "<generation token>:<stage>", or "" before it knows a generation.
func (l *Limiter) stageToken() string {
	tok := l.syncGen.Load()
	if tok == nil {
		return ""
	}
	return *tok + ":" + strconv.Itoa(int(l.stage.Load()))
}

// fleetAt reports whether every live instance, at the last heartbeat, was
// recovering to this instance's generation and at stage or later, and were
// as many as were live or suspect before the outage (the others may be on their way
// back: a raise of theirs after this instance's replay could undo part of
// it). A store that keeps no stages says nothing against it.
func (l *Limiter) fleetAt(stage int32) bool {
	stages, tok := l.stages.Load(), l.syncGen.Load()
	if stages == nil || tok == nil {
		return true
	}
	if int64(len(*stages)) < l.liveBefore.Load() {
		return false
	}
	for _, v := range *stages {
		t, s, ok := strings.Cut(v, ":")
		if !ok || t != *tok {
			return false
		}
		if n, err := strconv.Atoi(s); err != nil || int32(n) < stage {
			return false
		}
	}
	return true
}

// resync puts back what a store that changed generation (to gen) lost, and
// replays the journal unless the restore raised keys (then maybeClose
// replays once every live instance has restored). It reports whether the
// store took it all; the new generation is recorded only then, so a
// failure is tried again by the next probe.
func (l *Limiter) resync(ctx context.Context, gen string) bool {
	l.recoverStart = l.clock.now()
	l.beginSync(gen, stageBack)
	raised := false
	if l.generationChanged(gen) {
		// Redis came back without its data, or without its last writes:
		// put back what the snapshots knew of the usage before the outage,
		// before the journal's grants go on top of it.
		var err error
		if raised, err = l.restore(ctx, *l.gen.Load(), gen); err != nil {
			l.cfg.Logger.Warn("restore failed", "err", err.Error())
			return false
		}
	}
	l.gen.Store(&gen)
	if raised {
		l.stage.Store(stageRestored)
		return true
	}
	if err := l.replayJournal(ctx); err != nil {
		l.cfg.Logger.Warn("replay failed", "err", err.Error())
		return false
	}
	l.stage.Store(stageReplayed)
	return true
}

// probe pings the store; on success the breaker moves to recovering and the
// journal is replayed. The breaker closes once the other instances are back
// (maybeClose). It reports whether the ping failed at once (within half the
// Timeout, not a timeout): the store, or the host it runs on, refused; and
// whether the ping was answered but the breaker is open again (answered: a
// later step failed).
func (l *Limiter) probe(ctx context.Context) (refused, answered bool) {
	// A ping is more than one round trip (redisstore's loads the function
	// library too), and a store whose calls answer within SlowWindow is
	// slow, not dead (breaker.failure): under one Timeout the probes of a
	// store answering each call just within it all failed, and the
	// instance stayed local, its share held back by the others, until the
	// store was fast again (TestOpenBreakerClosesOverASlowStore).
	callCtx, cancel := context.WithTimeout(ctx, max(l.cfg.Timeout, l.cfg.SlowWindow))
	sent := l.clock.now()
	err := l.store.Ping(callCtx)
	cancel()
	if err != nil {
		return !isTimeout(err) && l.clock.now().Sub(sent) < l.cfg.Timeout/2, false
	}
	if !l.br.set(BreakerOpen, BreakerRecovering, "probe succeeded") {
		return false, false
	}
	l.br.success()
	// The outage took the pool's connections with it: open some while the
	// journal replays, so the decisions after the close do not all dial
	// at once (the instances close within a few ms of each other, and each
	// decision would pay a dial, AUTH and HELLO: TestRecoveryWarmsThePool).
	l.warm(ctx)
	callCtx, cancel = context.WithTimeout(ctx, l.cfg.Timeout)
	gen, err := l.store.Generation(callCtx)
	cancel()
	if err != nil {
		l.br.set(BreakerRecovering, BreakerOpen, "generation: "+err.Error())
		return false, true
	}
	if !l.resync(ctx, gen) {
		l.br.set(BreakerRecovering, BreakerOpen, "restore or replay failed")
		return false, true
	}
	l.heartbeat(ctx)
	l.maybeClose(ctx)
	return false, l.br.State() == BreakerOpen
}

// setFleet records a heartbeat's counts. The first one is held back at
// once (nothing says the suspects are only late); after that, a suspect is
// held back from the second heartbeat in a row that finds it missing.
func (l *Limiter) setFleet(live, suspect int) {
	n := int64(suspect)
	held := n
	if l.fleetSeen.Swap(true) {
		held = min(n, l.suspect.Load())
	}
	l.live.Store(int64(live))
	l.heldBack.Store(held)
	l.suspect.Store(n)
}

// maybeClose closes a recovering breaker once every instance is back and
// has replayed its journal (fleetAt), or RecoveryWait has passed, replaying
// first the grants made while it waited. After a restore that raised keys,
// it replays this instance's journal once every live instance has
// restored.
func (l *Limiter) maybeClose(ctx context.Context) {
	if l.br.State() != BreakerRecovering {
		return
	}
	waited := l.clock.now().Sub(l.recoverStart) >= l.cfg.RecoveryWait
	if l.stage.Load() < stageReplayed {
		if !l.fleetAt(stageRestored) && !waited {
			return
		}
		if err := l.replayJournal(ctx); err != nil {
			l.br.set(BreakerRecovering, BreakerOpen, "replay failed: "+err.Error())
			return
		}
		// The others learn it from the next heartbeat.
		l.stage.Store(stageReplayed)
		if !waited {
			return
		}
	}
	missing := l.suspect.Load() > 0 || l.live.Load() < l.liveBefore.Load() || !l.fleetAt(stageReplayed)
	if missing && !waited {
		return
	}
	if err := l.replayJournal(ctx); err != nil {
		l.br.set(BreakerRecovering, BreakerOpen, "replay failed: "+err.Error())
		return
	}
	if l.br.set(BreakerRecovering, BreakerClosed, "recovered") {
		now := l.clock.now()
		l.lastRecovery.Store(&now)
		if l.journal.Len() > 0 {
			_ = l.replayJournal(ctx) // the few grants made during the last pass
		}
		// The others learn it from the next heartbeat (an interval); until
		// then they hold this instance's share back.
		l.stage.Store(stageClosed)
	}
}

// isTimeout reports whether err is a call that outlived its deadline, as
// opposed to an error the store or the network answered with.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// generationChanged reports whether the store's data generation differs from
// the one recorded (the store lost its data since). The caller records the
// new one once the usage is restored.
func (l *Limiter) generationChanged(gen string) bool {
	old := l.gen.Load()
	return old != nil && *old != gen
}
