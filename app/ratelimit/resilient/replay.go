// The replay of the journal: its batches folded into the store, at most
// once each (recovery.go decides when).

package resilient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// replayJournal folds the journal into the store: it starts a new epoch
// (grants made meanwhile wait for the next pass), sends the older batches in
// pipelines of ReplayBatchKeys and clears each batch the store
// acknowledged. It stops at the first batch the store could not take, so a
// store that fails again mid-replay leaves the rest for the next attempt; the
// markers make resending a batch harmless.
func (l *Limiter) replayJournal(ctx context.Context) error {
	l.replay.Lock()
	defer l.replay.Unlock()
	// The resets logged while this instance was away first: its grants
	// from before a reset are usage the reset lifted. A reset logged after
	// this read fences its key (contract.ErrFenced): read again, and send
	// what the reset left.
	for range maxFencedPasses {
		if err := l.replayPass(ctx); !errors.Is(err, contract.ErrFenced) {
			return err
		}
	}
	// Resets keep coming: what they fence waits for the next pass. Not a
	// store failure.
	l.cfg.Logger.Info("journal replay fenced by resets; the rest waits for the next pass")
	return nil
}

// maxFencedPasses bounds the passes of one replay that resets made
// meanwhile refuse (each pass reads the reset log first).
const maxFencedPasses = 3

// replayPass reads the reset log, then sends the journal (replayJournal).
// A failed read is no reason not to send: the fences refuse what a reset
// the last read missed lifted (contract.ErrFenced), and the rest goes.
func (l *Limiter) replayPass(ctx context.Context) error {
	_ = l.readResets(ctx)
	read := l.resets.read.Load()
	through := l.journal.Rotate()
	pending, snaps := l.journal.Pending(through)
	if len(pending) == 0 {
		return nil
	}
	for i := range pending {
		pending[i].ResetsRead = read
	}
	// A token bucket or GCRA key goes as one charge: its grants net of the
	// refill its share would have wasted (netOfRefill), over all of the
	// key's batches of the same share. A key's grants can sit in several
	// batches: the epochs of this process and of the one before it, killed
	// during the outage, which left its grants in the file. Charged one
	// batch at a time, each batch's share would see again the refill that
	// the other batch's grants took, and the key would be charged less than
	// its grants took (TestRestartDuringOutageChargesTheWholeShare). The whole
	// charge goes with the key's first batch and a zero one with the others
	// (a resent first batch is refused by its marker; were it acknowledged
	// and a later one not, the later one is charged alone at the next pass:
	// more, never less).
	// Grouped by policy and identity (the key's snapshot is theirs), in
	// the order of their first batch. Indices, not copies: grouping by value (a
	// 370-byte map key and slice element per batch) would cost a recovering
	// instance time and memory in proportion to its keys before its first
	// pipeline (scripts/measure-drain.sh measures a drain).
	type chargeKey struct {
		policy   ratelimit.Policy
		identity store.Identity
	}
	// The batches of one epoch (one marker) are of distinct keys: no map
	// is needed then.
	oneEpoch := true
	for _, b := range pending {
		if b.Marker != pending[0].Marker {
			oneEpoch = false
			break
		}
	}
	var index map[chargeKey]int
	if !oneEpoch {
		index = make(map[chargeKey]int, len(pending))
	}
	groups := make([]chargeGroup, 0, len(pending))
	grouped := 0
	for i, b := range pending {
		if a := b.Policy.Algorithm; (a == ratelimit.TokenBucket || a == ratelimit.GCRA) && snaps[i] != nil {
			grouped++
			if index != nil {
				k := chargeKey{b.Policy, b.Identity}
				if g, ok := index[k]; ok {
					groups[g].more = append(groups[g].more, i)
					continue
				}
				index[k] = len(groups)
			}
			groups = append(groups, chargeGroup{first: i})
		}
	}
	now, cut := l.chargeTimes(ctx, groups, snaps)
	// A share an earlier pass charged through its time (chargedThrough) is
	// the store's to refill from then on: the grants made after it (while
	// recovering, waiting for the others) owe every unit. Netted against
	// the outage's share, which by then looks full again, a second pass
	// would charge a fraction of them (TestGrantsAfterTheChargeAreChargedInFull).
	charges := make([]store.Grant, grouped) // one charge per batch
	free := make([]bool, len(pending))      // the batches charged nothing
	var all []store.Grant
	for _, grp := range groups {
		policy, snap := pending[grp.first].Policy, *snaps[grp.first]
		all = all[:0]
		for j := -1; j < len(grp.more); j++ {
			i := grp.first
			if j >= 0 {
				i = grp.more[j]
			}
			all = append(all, pending[i].Grants...)
		}
		at, owed, ok := charge(policy, snap, all, cut, l.chargedThrough)
		if !ok {
			continue
		}
		for j := -1; j < len(grp.more); j++ {
			i, cost := grp.first, owed
			if j >= 0 {
				i, cost = grp.more[j], 0
			}
			charges[0] = store.Grant{At: at, Cost: cost}
			pending[i].Grants, charges = charges[:1:1], charges[1:]
			free[i] = owed == 0
		}
	}
	// A key that owes nothing (its share's refill covered its grants)
	// changes nothing in the store: its batches are acknowledged here,
	// without a round trip. In an outage of many keys each used a little,
	// most are such.
	// The zero batches of a key that owes something still go, after its
	// charge: acknowledged first, they would be lost were the charge not.
	start := l.clock.now()
	toSend, acked := pending[:0], make([]store.ReplayBatch, 0, grouped)
	for i, b := range pending {
		if free[i] {
			acked = append(acked, b)
		} else {
			toSend = append(toSend, b)
		}
	}
	if len(acked) > 0 {
		l.journal.Ack(acked, make([]store.ReplayResult, len(acked)))
	}
	replayed, err := l.send(ctx, toSend, l.journal.Ack)
	replayed += len(acked)
	if len(groups) > 0 && replayed > 0 {
		l.chargedThrough = now
	}
	if err != nil {
		return fmt.Errorf("replayed %d batches, then: %w", replayed, err)
	}
	l.cfg.Logger.Info("journal replayed", "batches", replayed, "took", l.clock.now().Sub(start).String())
	return nil
}

// charge is what a token bucket or GCRA key owes the store for its grants
// in an outage, and the time to charge it at: the grants up to cut net of
// the refill its share would have wasted (netOfRefill, at cut), and every
// unit of the grants after cut, or after through when an earlier pass
// charged the share through that time (0: none). ok is false when the
// snapshot cannot say. It reorders grants.
func charge(p ratelimit.Policy, snap journal.Snapshot, grants []store.Grant, cut, through int64) (at, owed int64, ok bool) {
	charged := through > 0 && max(snap.State.Now, snap.Confirmed) <= through
	early, late := grants[:0], int64(0)
	for _, g := range grants {
		if charged && g.At > through || g.At > cut {
			late += g.Cost
		} else {
			early = append(early, g)
		}
	}
	at, units := cut, 0.0
	if len(early) > 0 {
		if at, units, ok = netOfRefill(p, snap, early, cut); !ok {
			return 0, 0, false
		}
	}
	return at, int64(math.Ceil(units + float64(late) - 1e-9)), true
}

// chargeGroup is a token bucket or GCRA key's batches in one replay pass.
type chargeGroup struct {
	first int   // the key's first batch, which holds its snapshot
	more  []int // its other batches (rare: several epochs)
}

// chargeTimes returns the store's clock now, at the earliest it can read
// (netOfRefill), and the cutoff from which this pass charges the groups'
// grants in full (contract.Cutoff): the first charge of the fleet's
// recovery, when the store says, else now. Charged net of refill up to its own replay, a
// share that replays after another instance's would spend refill the
// store credits too: the store's bucket, full until the first charge,
// refills at the whole rate from then on, while the share counts only its
// part of that refill, and none once it is full itself
// (TestChargesAtDifferentTimesLeaveNoMoreThanTheIdeal). The call also
// reads the store's clock: an instance restarted during the outage has
// had no reply to learn it from.
func (l *Limiter) chargeTimes(ctx context.Context, groups []chargeGroup, snaps []*journal.Snapshot) (now, cut int64) {
	c, ok := l.ext.(contract.Cutoff)
	// The earliest time this instance's shares can have started from: a
	// cutoff older than that is an earlier recovery's. A share started
	// while the breaker was closed (its confirmed time is the end of time)
	// is charged without refill and needs none.
	start := int64(math.MaxInt64)
	for _, g := range groups {
		if s := snaps[g.first]; s.Confirmed < math.MaxInt64 {
			start = min(start, max(s.State.Now, s.Confirmed))
		}
	}
	now = l.storeNow() - l.offsetErr()
	if !ok || start == math.MaxInt64 {
		return now, now
	}
	// A cutoff older than maxCutoffAge is not this recovery's first
	// replay's, or this instance comes too late to date its charges from
	// it (the store keeps a replayed key only so long).
	stale := max(start, now-maxCutoffAge.Microseconds())
	callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	sent := l.clock.now()
	cutoff, storeNow, err := c.Cutoff(callCtx, stale)
	if err != nil {
		return now, now
	}
	l.learnOffset(storeNow, sent, l.clock.now())
	now = l.storeNow() - l.offsetErr()
	return now, min(cutoff, now)
}

// maxCutoffAge bounds how long after the fleet's cutoff an instance still
// dates its charges from it (the replays of one recovery follow one another
// within a probe interval or two). A key a replay wrote outlives that
// (redisstore's replay_margin_ms), so a charge dated from the cutoff never
// meets a key that expired after it.
const maxCutoffAge = 5 * time.Second

// send sends batches to the store in pipelines of ReplayBatchKeys, each within
// ReplayTimeout, and hands each pipeline's acknowledged batches to ack, with
// their results, as they come back, so progress is kept per batch. It stops
// after the first pipeline with a failed batch (the store is failing again;
// what is left waits for the next pass) and returns how many were
// acknowledged.
func (l *Limiter) send(ctx context.Context, batches []store.ReplayBatch, ack func([]store.ReplayBatch, []store.ReplayResult)) (int, error) {
	var done int
	for len(batches) > 0 {
		chunk := batches[:min(len(batches), l.cfg.ReplayBatchKeys)]
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
