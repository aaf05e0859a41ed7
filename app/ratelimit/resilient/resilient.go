// Package resilient is a ratelimit.Limiter that stays correct while its
// shared store is out. It wraps the store (redisstore) with a circuit breaker
// and decides locally while the breaker is open: from a fallback budget that
// is this instance's share of what the store last said was left, so the
// fleet as a whole stays within the limit and polite clients are not
// blocked.
//
// The breaker opens after FailureThreshold consecutive failures, a failure
// being an error or a call that outlived Timeout. While open no request
// touches the store; a prober pings it every ProbeInterval and, once it
// answers, the breaker moves to Recovering (the journal of local grants is
// replayed) and then Closed.
//
// Every instance heartbeats into the store. An instance whose heartbeat is
// missing may be cut off from the store but still granting its share
// locally, for up to LeaseGrace: until then the others hold its share back
// (see ratelimit.Weight).
package resilient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/journal"
)

// Store is the shared store a Limiter wraps. *redisstore.Limiter satisfies
// it.
type Store interface {
	ratelimit.Limiter
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
	// Heartbeat records the instance as live and returns how many
	// instances are live and how many are suspect (missing for less than
	// grace), the store's data generation and its clock.
	Heartbeat(ctx context.Context, instance string, ttl, grace time.Duration) (ratelimit.Fleet, error)
	// Generation returns the store's data generation, which changes when
	// the store loses its data.
	Generation(ctx context.Context) (string, error)
	// Leave removes the instance's heartbeat.
	Leave(ctx context.Context, instance string, ttl, grace time.Duration) error
	// Replay folds journaled grants into the store, each batch at most
	// once (see ratelimit.ReplayBatch).
	Replay(ctx context.Context, batches []ratelimit.ReplayBatch) ([]ratelimit.ReplayResult, []error)
}

// Config configures a Limiter. Zero fields take the defaults shown.
type Config struct {
	// Instance names this instance in heartbeats and logs. Required.
	Instance string
	// Timeout bounds each store call (50 ms).
	Timeout time.Duration
	// FailureThreshold is the number of consecutive failures that opens
	// the breaker (3). Errors open it at once; timeouts only when nothing
	// has succeeded for SlowWindow as well.
	FailureThreshold int
	// SlowWindow tells a slow store from a dead one (250 ms): calls that
	// time out open the breaker only if no call or heartbeat has succeeded
	// for this long. Until then each timed-out call is decided locally and
	// the breaker stays closed. It adds to the time an unanswering store
	// takes to open the breaker, not to any request's latency.
	SlowWindow time.Duration
	// ProbeInterval is how often an open breaker pings the store (1 s)
	// while the pings time out. A ping refused at once (Redis' process
	// down, or loading) is repeated every HeartbeatInterval instead: it
	// costs the store nothing, and a restarted Redis is seen within 100 ms.
	ProbeInterval time.Duration
	// HeartbeatInterval is how often a closed breaker heartbeats (100 ms).
	HeartbeatInterval time.Duration
	// HeartbeatTTL is how long after its last heartbeat an instance counts
	// as missing (300 ms). Until then, plus one interval, the others do not
	// hold its share back, so a cut-off instance's fallback share does not
	// count capacity that frees up in that time: shorter is better for
	// goodput during an outage, as long as heartbeats are not missed.
	HeartbeatTTL time.Duration
	// LeaseGrace is how long a missing instance may keep granting its
	// fallback share, and so how long the others hold it back (30 s).
	LeaseGrace time.Duration
	// ExpectedInstances is the fleet size assumed until the first heartbeat
	// reply (1).
	ExpectedInstances int
	// KeyCapacity bounds the keys remembered locally (100 000); the least
	// recently used is evicted and, if needed again during an outage,
	// starts from a fresh share.
	KeyCapacity int
	// Logger receives transitions and replays (slog.Default()); add the
	// instance name with Logger.With if the log is shared.
	Logger *slog.Logger
	// Now is the local clock (time.Now). Decisions use the store's clock,
	// estimated from the local one and the offset seen in replies.
	Now func() time.Time
	// OnTransition, if set, is called on every breaker transition, with
	// the breaker's lock held: keep it short.
	OnTransition func(from, to State)
	// JournalDir holds the journal of local grants ("": memory only, lost
	// with the process).
	JournalDir string
	// JournalMax bounds the grants journaled (1 000 000); beyond it local
	// grants are counted as overflow and logged.
	JournalMax int
	// ReplayBatch is how many keys one replay pipeline carries (1000).
	ReplayBatch int
	// ReplayTimeout bounds one replay or restore pipeline (2 s), in place
	// of Timeout: a pipeline of ReplayBatch keys takes Redis tens of ms.
	// Give the store a client whose own timeouts allow it
	// (redisstore.WithReplayClient), or the client's read timeout cuts it.
	ReplayTimeout time.Duration
	// RecoveryWait bounds how long a recovered instance keeps deciding
	// locally while other instances are still missing (2 × ProbeInterval).
	// Until every instance has replayed its journal, the store
	// undercounts; an instance that decided in the store then could spend
	// refill that the others already used.
	RecoveryWait time.Duration
}

func (c *Config) setDefaults() error {
	if err := ratelimit.ValidateKey(c.Instance); err != nil {
		return fmt.Errorf("resilient: instance name: %w", err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Timeout, 50*time.Millisecond)
	def(&c.ProbeInterval, time.Second)
	def(&c.HeartbeatInterval, 100*time.Millisecond)
	def(&c.HeartbeatTTL, 300*time.Millisecond)
	def(&c.LeaseGrace, 30*time.Second)
	def(&c.SlowWindow, 250*time.Millisecond)
	def(&c.ReplayTimeout, 2*time.Second)
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = 3
	}
	if c.ExpectedInstances <= 0 {
		c.ExpectedInstances = 1
	}
	if c.KeyCapacity <= 0 {
		c.KeyCapacity = 100_000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ReplayBatch <= 0 {
		c.ReplayBatch = 1000
	}
	def(&c.RecoveryWait, 2*c.ProbeInterval)
	return nil
}

// Limiter is a fault-tolerant ratelimit.Limiter. It is safe for concurrent
// use. Create it with New and stop it with Close.
type Limiter struct {
	store   Store
	cfg     Config
	br      breaker
	seeds   ratelimit.StateKeySeeds
	journal *journal.Journal
	seq     atomic.Uint64
	idBase  string
	replay  sync.Mutex // one replay at a time

	offset    atomic.Int64 // store clock minus local clock, µs
	live      atomic.Int64
	suspect   atomic.Int64
	fleetSeen atomic.Bool
	lastBeat  atomic.Int64           // local µs of the last heartbeat Redis acknowledged
	gen       atomic.Pointer[string] // the store's data generation last seen
	// liveBefore is the live count when the breaker last opened: a store
	// that lost its data forgot the others' heartbeats, and recovery waits
	// for them to come back all the same.
	liveBefore atomic.Int64
	restores   atomic.Uint64

	mu       sync.Mutex // guards keys, the entries in it and policies; never held across I/O
	keys     *simplelru.LRU[key, *entry]
	policies map[ratelimit.Policy]*ratelimit.Policy // see policyRef

	stats struct {
		storeDecisions, localDecisions       atomic.Uint64
		failures, failedDecisions, evictions atomic.Uint64
	}
	lastRecovery atomic.Pointer[time.Time]
	recoverStart time.Time // owned by the loop goroutine

	cancel context.CancelFunc
	done   chan struct{}
	closed atomic.Bool
}

var _ ratelimit.Limiter = (*Limiter)(nil)

type key = ratelimit.StateKey

// New returns a Limiter wrapping store and starts its background loop
// (heartbeats and, while open, probes). The store is not contacted
// synchronously: an unreachable store at start is not an error.
//
// Grants left in the journal by an earlier process (killed during an
// outage) are reloaded: they are charged to the local budgets, so their
// quota is not granted again, and the breaker starts open, so they are
// replayed before the store is trusted.
func New(store Store, cfg Config) (*Limiter, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	l := &Limiter{store: store, cfg: cfg, seeds: ratelimit.NewStateKeySeeds(), done: make(chan struct{}),
		policies: map[ratelimit.Policy]*ratelimit.Policy{}}
	l.idBase = cfg.Instance + "-" + strconv.FormatInt(cfg.Now().UnixNano(), 36) + "-"
	keys, err := simplelru.NewLRU[key, *entry](cfg.KeyCapacity, func(key, *entry) { l.stats.evictions.Add(1) })
	if err != nil {
		return nil, fmt.Errorf("resilient: %w", err)
	}
	l.keys = keys
	if l.journal, err = journal.Open(cfg.JournalDir, cfg.Instance, cfg.JournalMax, cfg.Logger); err != nil {
		return nil, fmt.Errorf("resilient: %w", err)
	}
	if l.journal.Len() > 0 {
		l.journal.Each(func(p ratelimit.Policy, id ratelimit.Identity, g ratelimit.Grant, s *journal.Snapshot) {
			e := l.entry(l.keyOfIdentity(p, id))
			sh := share{n: float64(cfg.ExpectedInstances), factor: p.Factor()}
			if s != nil {
				// The share the last process started from.
				sh.n, sh.confirmed = s.N, s.Confirmed
				if !e.localInit && s.Valid {
					e.snap, e.snapValid, e.version = s.State, true, 1
				}
			}
			e.charge(p, g, sh)
			e.journaled = true
		})
		l.br.state.Store(int32(Open))
		l.br.opens.Add(1)
	}
	l.br.threshold = cfg.FailureThreshold
	l.br.slowWindow = cfg.SlowWindow
	l.br.now = cfg.Now
	l.br.lastSuccess.Store(cfg.Now().UnixMicro())
	l.br.onChange = func(from, to State, reason string) {
		if to == Open && from == Closed {
			l.liveBefore.Store(l.live.Load())
		}
		l.cfg.Logger.Warn("rate limiter breaker transition", "from", from.String(), "to", to.String(), "reason", reason)
		if cfg.OnTransition != nil {
			cfg.OnTransition(from, to)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go l.loop(ctx)
	return l, nil
}

// Decide decides in the store while the breaker is closed, and locally
// otherwise (or when this call fails). It returns an error only for an
// invalid request or a cancelled context.
func (l *Limiter) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := l.prepare(&req); err != nil {
		return ratelimit.Decision{}, err
	}
	id := ratelimit.IdentityOf(req.Key)
	if l.br.State() == Closed {
		if ok, probe := l.br.admit(); ok {
			r := req
			r.Weight = l.weight()
			callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
			sent := l.cfg.Now()
			d, err := l.store.Decide(callCtx, r)
			cancel()
			if probe {
				l.br.done()
			}
			if d, local, err := l.settle(ctx, req, id, d, err, sent, true); !local {
				return d, err
			}
		}
	}
	return l.decideLocal(l.keyOfIdentity(req.Policy, id), id, req), nil
}

// DecideBatch decides several requests as Decide does each, in one round
// trip when the store is a ratelimit.BatchLimiter (redisstore is). A store
// failure counts once against the breaker, however many requests it failed.
func (l *Limiter) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	ds, errs := make([]ratelimit.Decision, len(reqs)), make([]error, len(reqs))
	reqs = slices.Clone(reqs)
	ids := make([]ratelimit.Identity, len(reqs))
	pending := make([]int, 0, len(reqs))
	for i := range reqs {
		if errs[i] = l.prepare(&reqs[i]); errs[i] == nil {
			ids[i] = ratelimit.IdentityOf(reqs[i].Key)
			pending = append(pending, i)
		}
	}
	ok, probe := false, false
	if len(pending) > 0 && l.br.State() == Closed {
		ok, probe = l.br.admit()
	}
	if ok {
		sent := make([]ratelimit.Request, len(pending))
		w := l.weight()
		for j, i := range pending {
			sent[j] = reqs[i]
			sent[j].Weight = w
		}
		callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
		at := l.cfg.Now()
		sds, serrs := ratelimit.DecideAll(callCtx, l.store, sent)
		cancel()
		if probe {
			l.br.done()
		}
		local := make([]int, 0, len(pending))
		counted := false
		for j, i := range pending {
			d, fallback, err := l.settle(ctx, reqs[i], ids[i], sds[j], serrs[j], at, !counted)
			if fallback {
				counted = true
				local = append(local, i)
				continue
			}
			ds[i], errs[i] = d, err
		}
		pending = local
	}
	for _, i := range pending {
		ds[i] = l.decideLocal(l.keyOfIdentity(reqs[i].Policy, ids[i]), ids[i], reqs[i])
	}
	return ds, errs
}

// prepare validates req and gives it an id when it has none: one id for the
// store call and, if it fails, the local grant, so the sliding window log
// counts the request once even if the call still ran.
func (l *Limiter) prepare(req *ratelimit.Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if req.ID == "" {
		req.ID = l.idBase + strconv.FormatUint(l.seq.Add(1), 36)
	}
	return nil
}

// settle takes the store's answer (d, err) to req, sent at sent: a decision
// is remembered and returned, an invalid request or a cancelled caller
// returned as an error, and any other failure counted (against the breaker
// too when countFailure is set) and reported as local: decide it locally.
func (l *Limiter) settle(ctx context.Context, req ratelimit.Request, id ratelimit.Identity, d ratelimit.Decision, err error, sent time.Time, countFailure bool) (_ ratelimit.Decision, local bool, _ error) {
	switch {
	case err == nil:
		l.br.success()
		l.stats.storeDecisions.Add(1)
		l.remember(l.keyOfIdentity(req.Policy, id), req.Policy, id, d, sent, l.cfg.Now())
		return d, false, nil
	case errors.Is(err, ratelimit.ErrInvalidRequest) || errors.Is(err, ratelimit.ErrInvalidPolicy):
		return ratelimit.Decision{}, false, err
	case ctx.Err() != nil:
		return ratelimit.Decision{}, false, ctx.Err()
	}
	l.stats.failures.Add(1)
	l.stats.failedDecisions.Add(1)
	if countFailure && !errors.Is(err, ratelimit.ErrBadReply) { // one odd key is no outage
		l.br.failure(err.Error(), isTimeout(err))
	}
	return ratelimit.Decision{}, true, nil
}

func (l *Limiter) decideLocal(k key, id ratelimit.Identity, req ratelimit.Request) ratelimit.Decision {
	l.stats.localDecisions.Add(1)
	p := req.Policy
	now := l.storeNow()
	var d ratelimit.Decision
	switch p.Mode() {
	case ratelimit.FailOpen:
		d = ratelimit.Decision{Allowed: true, Limit: p.Capacity(), Remaining: p.Capacity(), Mode: ratelimit.ModeOpen}
	case ratelimit.FailClosed:
		return ratelimit.Decision{Limit: p.Capacity(), RetryAfter: l.cfg.ProbeInterval, ResetAfter: l.cfg.ProbeInterval, Mode: ratelimit.ModeClosed}
	default:
		sh := share{n: float64(l.fleetSize()), factor: p.Factor(), confirmed: l.confirmedAt()}
		l.mu.Lock()
		e := l.entry(k)
		d = e.decideLocal(p, now, req.Units(), sh)
		if d.Allowed && !e.journaled {
			// What this share started from, before its first grant, so a
			// restart rebuilds it.
			e.journaled = true
			_ = l.journal.AppendSnapshot(journal.Snapshot{Policy: p, Identity: id, State: e.snap, Valid: e.snapValid, N: e.n, Confirmed: e.confirmed})
		}
		l.mu.Unlock()
	}
	if d.Allowed {
		// Journaled before the response is sent; a full journal or a
		// failed write is counted and logged by the journal itself.
		_ = l.journal.Append(p, id, ratelimit.Grant{At: now, Cost: req.Units(), ID: req.ID})
	}
	return d
}

// remember keeps the store's reply as the key's snapshot and updates the
// clock offset (the reply's time is taken as the middle of the round trip).
func (l *Limiter) remember(k key, p ratelimit.Policy, id ratelimit.Identity, d ratelimit.Decision, sent, recv time.Time) {
	l.learnOffset(d.State.Now, sent, recv)
	l.mu.Lock()
	e := l.entry(k)
	e.snap, e.snapValid = d.State, true
	if e.policy == nil || *e.policy != p {
		e.policy = l.policyRef(p)
	}
	e.identity = id
	e.version++
	l.mu.Unlock()
}

// maxPolicies bounds how many distinct policies the limiter shares among
// its keys; policies beyond it get a copy per key.
const maxPolicies = 1024

// policyRef returns the limiter's one copy of p (l.mu held), so that keys
// of one policy do not each hold it.
func (l *Limiter) policyRef(p ratelimit.Policy) *ratelimit.Policy {
	if r, ok := l.policies[p]; ok {
		return r
	}
	r := &p
	if len(l.policies) < maxPolicies {
		l.policies[p] = r
	}
	return r
}

// learnOffset records the store's clock, read at storeNow between sent and
// recv: the reply's time is taken as the middle of the round trip. Both
// decisions and heartbeats teach it, so the offset is known from the first
// heartbeat and follows a local clock that steps.
func (l *Limiter) learnOffset(storeNow int64, sent, recv time.Time) {
	if storeNow <= 0 {
		return
	}
	mid := sent.UnixMicro() + recv.Sub(sent).Microseconds()/2
	l.offset.Store(storeNow - mid)
}

func (l *Limiter) entry(k key) *entry {
	e, ok := l.keys.Get(k)
	if !ok {
		e = &entry{}
		l.keys.Add(k, e)
	}
	return e
}

func (l *Limiter) keyOfIdentity(p ratelimit.Policy, id ratelimit.Identity) key {
	return l.seeds.Key(p, id)
}

// confirmedAt is when (store µs) the other instances can know this one is
// missing: they count it as missing HeartbeatTTL after its last heartbeat,
// and learn so at their next heartbeat.
func (l *Limiter) confirmedAt() int64 {
	beat := l.lastBeat.Load()
	if beat == 0 {
		return 0 // never in the fleet's view: nobody decides unaware of it
	}
	return beat + l.offset.Load() + (l.cfg.HeartbeatTTL + l.cfg.HeartbeatInterval).Microseconds()
}

// storeNow estimates the store's clock in µs.
func (l *Limiter) storeNow() int64 { return l.cfg.Now().UnixMicro() + l.offset.Load() }

// fleetSize is the number of instances that may be granting: live and
// suspect, as the last heartbeat said; ExpectedInstances before the first.
func (l *Limiter) fleetSize() int64 {
	if !l.fleetSeen.Load() {
		return int64(l.cfg.ExpectedInstances)
	}
	return max(1, l.live.Load()+l.suspect.Load())
}

// weight holds back the shares of suspect instances in store decisions.
func (l *Limiter) weight() ratelimit.Weight {
	live, suspect := l.live.Load(), l.suspect.Load()
	if suspect <= 0 || live <= 0 {
		return ratelimit.Weight{}
	}
	return ratelimit.Weight{Num: min(live+suspect, 1024), Den: min(live, 1024)}
}

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
		if err := l.restore(ctx, gen); err != nil {
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
		if err := l.restore(ctx, gen); err != nil {
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

// Close stops the background loop and removes this instance's heartbeat, so
// the others do not hold its share back.
func (l *Limiter) Close(ctx context.Context) error {
	if l.closed.Swap(true) {
		return nil
	}
	l.cancel()
	<-l.done
	if l.br.State() == Closed && l.journal.Len() > 0 {
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

// Status is a snapshot of the limiter's state, for /status and metrics.
type Status struct {
	Instance       string `json:"instance"`
	Breaker        string `json:"breaker"`
	Opens          uint64 `json:"breaker_opens"`
	Live           int64  `json:"live_instances"`
	Suspect        int64  `json:"suspect_instances"`
	FleetSize      int64  `json:"fleet_size"`
	StoreDecisions uint64 `json:"store_decisions"`
	LocalDecisions uint64 `json:"local_decisions"`
	LocalGrants    uint64 `json:"local_grants"`
	StoreFailures  uint64 `json:"store_failures"`
	// FailedDecisions are decisions whose store call failed or timed out
	// and that were decided locally instead. A timed-out call may still
	// have run in the store: for the token bucket, GCRA and the counter
	// each such request can be charged twice (the sliding window log
	// dedups by request id), so this bounds that overcharge.
	FailedDecisions uint64     `json:"failed_decisions"`
	Keys            int        `json:"keys"`
	Evictions       uint64     `json:"evictions"`
	LastRecovery    *time.Time `json:"last_recovery,omitempty"`
	ClockOffsetUS   int64      `json:"clock_offset_us"`
	// Restores counts the times Redis came back without its data and this
	// instance put back the usage its snapshots knew.
	Restores uint64 `json:"restores"`
	// Journal reconciles local grants: Granted + Reloaded = Replayed +
	// Present + Dropped + DuplicateUnits + Pending.
	Journal journal.Stats `json:"journal"`
}

// Status returns the current status.
func (l *Limiter) Status() Status {
	l.mu.Lock()
	n := l.keys.Len()
	l.mu.Unlock()
	// local_grants comes from the journal's counters, read at one instant:
	// read apart, a grant made between two reads was in one and not the
	// other, and a killed instance's last status then disagreed with its
	// journal file.
	js := l.journal.Stats()
	return Status{
		Instance:        l.cfg.Instance,
		Breaker:         l.br.State().String(),
		Opens:           l.br.opens.Load(),
		Live:            l.live.Load(),
		Suspect:         l.suspect.Load(),
		FleetSize:       l.fleetSize(),
		StoreDecisions:  l.stats.storeDecisions.Load(),
		LocalDecisions:  l.stats.localDecisions.Load(),
		LocalGrants:     js.Granted + js.Overflow,
		StoreFailures:   l.stats.failures.Load(),
		FailedDecisions: l.stats.failedDecisions.Load(),
		Keys:            n,
		Evictions:       l.stats.evictions.Load(),
		LastRecovery:    l.lastRecovery.Load(),
		ClockOffsetUS:   l.offset.Load(),
		Restores:        l.restores.Load(),
		Journal:         js,
	}
}

// State returns the breaker's state.
func (l *Limiter) State() State { return l.br.State() }

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

// restore puts back into a store that lost its data what this instance's
// snapshots knew of each key's usage, as replay batches of synthetic grants:
// the sliding window log's grants at the latest times their age buckets
// allow, the counter's counts in their windows, the token bucket's and
// GCRA's deficit at the snapshot's time. Each batch's marker names the new
// generation and not the instance, so the first instance to restore a key
// wins and the others' batches are refused: the usage is put back once,
// from the most recent snapshot that reached the store first.
func (l *Limiter) restore(ctx context.Context, gen string) error {
	now := l.storeNow()
	marker := "restore-" + gen
	var batches []ratelimit.ReplayBatch
	l.mu.Lock()
	for _, e := range l.keys.Values() {
		if !e.snapValid || e.policy == nil || e.snap.Now < now-2*e.policy.WindowMicros() {
			continue
		}
		if g := restoreGrants(*e.policy, e.snap, marker); len(g) > 0 {
			batches = append(batches, ratelimit.ReplayBatch{Policy: *e.policy, Identity: e.identity, Marker: marker, Grants: g})
		}
	}
	l.mu.Unlock()
	l.cfg.Logger.Warn("Redis lost its data: restoring the usage the snapshots knew", "keys", len(batches))
	if _, err := l.send(ctx, batches, func([]ratelimit.ReplayBatch, []ratelimit.ReplayResult) {}); err != nil {
		return err
	}
	l.restores.Add(1)
	return nil
}

// restoreGrants turns a snapshot into the grants that rebuild its usage.
func restoreGrants(p ratelimit.Policy, s ratelimit.State, marker string) []ratelimit.Grant {
	w := p.WindowMicros()
	var g []ratelimit.Grant
	add := func(at, cost int64, id string) {
		if cost > 0 {
			g = append(g, ratelimit.Grant{At: at, Cost: cost, ID: marker + "-" + id})
		}
	}
	switch p.Algorithm {
	case ratelimit.SlidingWindowLog:
		for i, n := range s.Ages {
			add(s.Now-int64(i)*w/ratelimit.AgeBuckets, n, strconv.Itoa(i))
		}
	case ratelimit.SlidingWindowCounter:
		add(s.WindowStart-w, s.Previous, "p")
		add(s.WindowStart, s.Current, "c")
	case ratelimit.TokenBucket:
		add(s.Now, (p.Capacity()*w-s.Tokens+w-1)/w, "t")
	case ratelimit.GCRA:
		if ahead := (s.TAT-s.Now)*p.Limit + s.TATRem; ahead > 0 {
			add(s.Now, (ahead+w-1)/w, "t")
		}
	}
	return g
}
