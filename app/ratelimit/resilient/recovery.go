// Recovery: the background loop (heartbeats while closed, probes while
// open), the breaker's way back to closed, and the replay of the journal.

package resilient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// loop heartbeats while closed and probes while open, until Close.
func (l *Limiter) loop(ctx context.Context) {
	defer close(l.done)
	l.heartbeat(ctx)
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		switch l.br.State() {
		case Closed:
			l.heartbeat(ctx)
			if l.journal.Len() > 0 {
				// Grants made while recovering, or left by a failed
				// pass: fold them in now.
				if err := l.replayJournal(ctx); err != nil && ctx.Err() == nil {
					l.br.failure("replay: "+err.Error(), isTimeout(err))
				}
			}
		case Open:
			if now := l.cfg.Now(); refused || now.Sub(lastProbe) >= l.cfg.ProbeInterval-l.cfg.HeartbeatInterval/2 {
				lastProbe = now
				refused = l.probe(ctx)
			}
		case Recovering:
			l.heartbeat(ctx)
			l.maybeClose(ctx)
		}
	}
}

func (l *Limiter) heartbeat(ctx context.Context) {
	callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	sent := l.cfg.Now()
	fleet, err := l.store.Heartbeat(callCtx, l.cfg.Instance, l.cfg.HeartbeatTTL, l.cfg.LeaseGrace)
	if err != nil {
		if ctx.Err() == nil {
			l.stats.failures.Add(1)
			l.br.failure("heartbeat: "+err.Error(), isTimeout(err))
		}
		return
	}
	l.br.success()
	l.learnOffset(fleet.Now, sent, l.cfg.Now())
	live, suspect, gen := fleet.Live, fleet.Suspect, fleet.Generation
	if l.generationChanged(gen) && l.br.State() == Closed {
		// Redis lost its data between two heartbeats, too fast for the
		// breaker to notice: put back what the snapshots knew. Until that
		// succeeds the new generation is not recorded, so the next
		// heartbeat (or probe) tries again.
		if err := l.restore(ctx, *l.gen.Load(), gen); err != nil {
			l.br.failure("restore: "+err.Error(), isTimeout(err))
		} else {
			l.gen.Store(&gen)
		}
	} else if l.gen.Load() == nil {
		l.gen.Store(&gen)
	}
	l.live.Store(int64(live))
	l.suspect.Store(int64(suspect))
	l.fleetSeen.Store(true)
	l.lastBeat.Store(l.cfg.Now().UnixMicro())
}

// probe pings the store; on success the breaker moves to recovering and the
// journal is replayed. The breaker closes once the other instances are back
// (maybeClose). It reports whether the ping failed at once (within half the
// Timeout, not a timeout): the store, or the host it runs on, refused.
func (l *Limiter) probe(ctx context.Context) (refused bool) {
	callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	sent := l.cfg.Now()
	err := l.store.Ping(callCtx)
	cancel()
	if err != nil {
		return !isTimeout(err) && l.cfg.Now().Sub(sent) < l.cfg.Timeout/2
	}
	if !l.br.set(Open, Recovering, "probe succeeded") {
		return false
	}
	l.br.success()
	callCtx, cancel = context.WithTimeout(ctx, l.cfg.Timeout)
	gen, err := l.store.Generation(callCtx)
	cancel()
	if err != nil {
		l.br.set(Recovering, Open, "generation: "+err.Error())
		return false
	}
	if l.generationChanged(gen) {
		// Redis came back without its data: put back what the snapshots
		// knew of the usage before the outage, before the journal's grants
		// go on top of it.
		// Not recorded until the restore succeeded: a failed one is tried
		// again at the next probe.
		if err := l.restore(ctx, *l.gen.Load(), gen); err != nil {
			l.br.set(Recovering, Open, "restore failed: "+err.Error())
			return false
		}
	}
	l.gen.Store(&gen)
	if err := l.replayJournal(ctx); err != nil {
		l.br.set(Recovering, Open, "replay failed: "+err.Error())
		return false
	}
	l.recoverStart = l.cfg.Now()
	l.heartbeat(ctx)
	l.maybeClose(ctx)
	return false
}

// maybeClose closes a recovering breaker once no instance is missing (all
// have replayed and heartbeat again) or RecoveryWait has passed, replaying
// first the grants made while it waited.
func (l *Limiter) maybeClose(ctx context.Context) {
	if l.br.State() != Recovering {
		return
	}
	missing := l.suspect.Load() > 0 || l.live.Load() < l.liveBefore.Load()
	if missing && l.cfg.Now().Sub(l.recoverStart) < l.cfg.RecoveryWait {
		return
	}
	if err := l.replayJournal(ctx); err != nil {
		l.br.set(Recovering, Open, "replay failed: "+err.Error())
		return
	}
	if l.br.set(Recovering, Closed, "recovered") {
		now := l.cfg.Now()
		l.lastRecovery.Store(&now)
		if l.journal.Len() > 0 {
			_ = l.replayJournal(ctx) // the few grants made during the last pass
		}
	}
}

// replayJournal folds the journal into the store: it starts a new epoch
// (grants made meanwhile wait for the next pass), sends the older batches in
// pipelines of ReplayBatch keys and clears each batch the store
// acknowledged. It stops at the first batch the store could not take, so a
// store that fails again mid-replay leaves the rest for the next attempt; the
// markers make resending a batch harmless.
func (l *Limiter) replayJournal(ctx context.Context) error {
	l.replay.Lock()
	defer l.replay.Unlock()
	through := l.journal.Rotate()
	pending := l.journal.Pending(through)
	if len(pending) == 0 {
		return nil
	}
	start := l.cfg.Now()
	replayed, err := l.send(ctx, pending, l.journal.Ack)
	if err != nil {
		return fmt.Errorf("replayed %d batches, then: %w", replayed, err)
	}
	l.cfg.Logger.Info("journal replayed", "batches", replayed, "took", l.cfg.Now().Sub(start).String())
	return nil
}

// send sends batches to the store in pipelines of ReplayBatch, each within
// ReplayTimeout, and hands each pipeline's acknowledged batches to ack, with
// their results, as they come back, so progress is kept per batch. It stops
// after the first pipeline with a failed batch (the store is failing again;
// what is left waits for the next pass) and returns how many were
// acknowledged.
func (l *Limiter) send(ctx context.Context, batches []ratelimit.ReplayBatch, ack func([]ratelimit.ReplayBatch, []ratelimit.ReplayResult)) (int, error) {
	var done int
	for len(batches) > 0 {
		chunk := batches[:min(len(batches), l.cfg.ReplayBatch)]
		batches = batches[len(chunk):]
		callCtx, cancel := context.WithTimeout(ctx, l.cfg.ReplayTimeout)
		results, errs := l.store.Replay(callCtx, chunk)
		cancel()
		var firstErr error
		acked, ackedResults := chunk[:0:0], results[:0:0]
		for i, b := range chunk {
			if errs[i] != nil {
				firstErr = cmp.Or(firstErr, errs[i])
				continue
			}
			acked, ackedResults = append(acked, b), append(ackedResults, results[i])
		}
		ack(acked, ackedResults)
		done += len(acked)
		if len(acked) > 0 {
			l.br.success() // the store answers: a timeout meanwhile is a busy store
		}
		if firstErr != nil {
			return done, firstErr
		}
	}
	return done, nil
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
