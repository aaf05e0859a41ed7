package resilient_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

func TestReplayRunsBeforeClosing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.failReplay.Store(true)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: time.Minute}
		f.down.Store(true)
		settle(2 * time.Second) // heartbeats fail: the breaker opens without traffic
		if l.Breaker() != resilient.BreakerOpen {
			t.Fatalf("%s, want open after failed heartbeats", l.Breaker())
		}
		if got := admit(t, l, p, "k", 10, ratelimit.ModeLocal); got != 10 {
			t.Fatalf("local grants: %d of 10", got)
		}
		f.down.Store(false) // pings answer, replays fail
		settle(3 * time.Second)
		if l.Breaker() != resilient.BreakerOpen || len(f.ReplayCalls()) == 0 {
			t.Fatalf("%s after %d replays, want open while the replay fails", l.Breaker(), len(f.ReplayCalls()))
		}
		f.failReplay.Store(false)
		settle(1500 * time.Millisecond)
		if l.Breaker() != resilient.BreakerClosed {
			t.Fatalf("%s, want closed after a successful replay", l.Breaker())
		}
		// The store now holds the 10 local grants: 90 left.
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
		if err != nil || d.Mode != ratelimit.ModeRedis || d.Remaining != 89 {
			t.Fatalf("after replay: %+v %v, want 89 left in the store", d, err)
		}
		js := l.Status().Journal
		if js.Granted != 10 || js.Replayed != 10 || js.Pending != 0 {
			t.Fatalf("journal %+v, want 10 granted and replayed", js)
		}
	})
}

// A replay that fails right after the probe's ping was answered (a store
// that just came back, its first new connections slow) is tried again at
// the next tick, not a ProbeInterval later; a store that keeps failing the
// replay is probed at the ProbeInterval, not at every tick.
func TestFailedReplayIsRetriedAtOnceThenAtTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{HeartbeatInterval: 100 * time.Millisecond, ProbeInterval: time.Second})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Minute}
		f.down.Store(true)
		settle(2 * time.Second)
		if got := admit(t, l, p, "k", 5, ratelimit.ModeLocal); got != 5 {
			t.Fatalf("local grants: %d of 5", got)
		}
		// The next probe's ping is answered and its replay fails, once.
		f.failReplay.Store(true)
		f.down.Store(false)
		for len(f.ReplayCalls()) == 0 {
			settle(10 * time.Millisecond)
		}
		failedAt := time.Now()
		f.failReplay.Store(false)
		for l.Breaker() != resilient.BreakerClosed && time.Since(failedAt) < 3*time.Second {
			settle(10 * time.Millisecond)
		}
		if took := time.Since(failedAt); l.Breaker() != resilient.BreakerClosed || took > 250*time.Millisecond {
			t.Fatalf("%s %v after the failed replay, want closed within a tick or two (not a probe interval)", l.Breaker(), took)
		}
		// A store that keeps failing the replay: one quick retry, then
		// one probe per ProbeInterval.
		f.down.Store(true)
		settle(2 * time.Second)
		admit(t, l, p, "k", 1, ratelimit.ModeLocal)
		f.failReplay.Store(true)
		f.down.Store(false)
		before := len(f.PingCalls())
		settle(5 * time.Second)
		if n := len(f.PingCalls()) - before; n < 5 || n > 7 {
			t.Fatalf("%d probes in 5 s of failing replays, want 5-7 (one per interval, and one quick retry)", n)
		}
	})
}

func TestInvalidRequestsAndOddReplies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Second}
		if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "a\x00"}); !errors.Is(err, ratelimit.ErrInvalidRequest) {
			t.Fatalf("bad key: %v", err)
		}
		f.DecideFunc = func(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
			return ratelimit.Decision{}, fmt.Errorf("%w: WRONGTYPE", ratelimit.ErrBadReply)
		}
		admit(t, l, p, "k", 10, ratelimit.ModeLocal)
		if l.Breaker() != resilient.BreakerClosed {
			t.Fatal("odd replies for one key opened the breaker")
		}
	})
}

// TestKeyCapacityBoundsMemory: the keys remembered never exceed
// KeyCapacity, however many distinct clients come, and every key beyond it
// is an eviction. The capacity is split among the shards exactly (1000 over
// 64 shards: 15 or 16 each), and 5000 keys fill every shard.
func TestKeyCapacityBoundsMemory(t *testing.T) {
	for _, c := range []struct{ capacity, keys int }{{1, 20}, {10, 2000}, {1000, 5000}} {
		t.Run(fmt.Sprint(c.capacity), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				l := newLimiter(t, f, resilient.Config{KeyCapacity: c.capacity})
				p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Second}
				for i := range c.keys {
					admit(t, l, p, fmt.Sprint("k", i), 1, ratelimit.ModeRedis)
				}
				if s := l.Status(); s.Keys != c.capacity || int(s.Evictions) != c.keys-c.capacity {
					t.Fatalf("keys %d evictions %d, want %d and %d", s.Keys, s.Evictions, c.capacity, c.keys-c.capacity)
				}
			})
		})
	}
}

// TestFailedRestoreIsRetried: Redis comes back without its data while the
// breaker is closed, and the first restores fail. The new generation is not
// taken as known until a restore went through, so it is tried again until
// it does, and the usage before the wipe is back in the store.
func TestFailedRestoreIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "r", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Hour}
		if n := admit(t, l, p, "k", 30, ratelimit.ModeRedis); n != 30 {
			t.Fatalf("%d of 30 admitted", n)
		}
		f.twin.Store(memstore.New(memstore.Config{}))
		gen := "gen-2"
		f.gen.Store(&gen)
		f.failReplay.Store(true)
		time.Sleep(time.Second) // heartbeats see the new generation; every restore fails
		synctest.Wait()
		if n := l.Status().Restores; n != 0 {
			t.Fatalf("%d restores while the store refused them", n)
		}
		f.failReplay.Store(false)
		time.Sleep(3 * time.Second) // probes or heartbeats try again
		synctest.Wait()
		if n := l.Status().Restores; n != 1 {
			t.Fatalf("%d restores once the store took them, want 1", n)
		}
		d, err := f.twin.Load().Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != 100-31 {
			t.Errorf("%d remaining after the restore, want %d: the 30 granted before the wipe are back", d.Remaining, 100-31)
		}
	})
}

// TestHeartbeatTeachesTheStoreClock: the store's clock is learned from the
// first heartbeat, before any decision, so grants made locally right after
// a restart are stamped in the store's time.
func TestHeartbeatTeachesTheStoreClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		ahead := 10 * time.Minute
		f.skew.Store(ahead.Microseconds())
		l := newLimiter(t, f, resilient.Config{})
		if got := time.Duration(l.Status().ClockOffsetUS) * time.Microsecond; got != ahead {
			t.Fatalf("clock offset %v after the first heartbeat, want %v", got, ahead)
		}
	})
}

// TestStatusIsOneInstant: local_grants and the journal's counters are read
// at one instant, so every grant is in both or in neither and the books
// balance, however busy the instance (a killed instance's last status is
// compared with what its successor finds in the journal file).
func TestStatusIsOneInstant(t *testing.T) {
	f := &nullStore{}
	f.down.Store(true)
	l, err := resilient.New(f, resilient.Config{Instance: "instant", FailureThreshold: 1, JournalMax: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1_000_000, Window: time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprintf("k%d-%d", g, i%50)})
			}
		})
	}
	for range 2000 {
		s := l.Status()
		if s.LocalGrants != s.Journal.Granted || s.Journal.Reconcile() != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("local_grants %d, journal %+v at the same instant: %v", s.LocalGrants, s.Journal, s.Journal.Reconcile())
		}
	}
	close(stop)
	wg.Wait()
}

// TestRefusalAnsweredLocally: a key the store refused until T is refused
// without a round trip until T, for requests at least as costly; a cheaper
// request still asks the store (it might fit), and after T the store is
// asked again and admits. No admission changes: only refusals are cached.
func TestRefusalAnsweredLocally(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 6, Window: time.Minute} // a token every 10 s
		ctx := context.Background()
		decide := func(cost int64) ratelimit.Decision {
			t.Helper()
			d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", Cost: cost})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		for range 5 {
			if !decide(1).Allowed {
				t.Fatal("refused within the burst")
			}
		}
		// One token left: a cost of 3 is refused by the store (20 s to wait).
		calls := len(f.DecideCalls())
		if d := decide(3); d.Allowed || d.Mode != ratelimit.ModeRedis {
			t.Fatalf("cost 3: %+v, want the store's refusal", d)
		}
		if got := len(f.DecideCalls()) - calls; got != 1 {
			t.Fatalf("%d store calls, want 1", got)
		}
		// The same cost again, and a larger one: no round trip.
		for _, cost := range []int64{3, 4} {
			if d := decide(cost); d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("cost %d: %+v, want a refusal with a retry time", cost, d)
			}
		}
		if got := len(f.DecideCalls()) - calls; got != 1 {
			t.Fatalf("%d store calls for three refusals of the same key, want 1", got)
		}
		// A cheaper request may fit: the store is asked, and admits it.
		if d := decide(1); !d.Allowed {
			t.Fatalf("cost 1 with a token left: %+v, want admitted", d)
		}
		if got := len(f.DecideCalls()) - calls; got != 2 {
			t.Fatalf("%d store calls, want the cheaper request asked", got)
		}
		if s := l.Status(); s.CachedRefusals != 2 {
			t.Fatalf("cached_refusals %d, want 2", s.CachedRefusals)
		}
		// Past the retry time the store is asked again.
		decide(1) // refused by the store: empty
		time.Sleep(31 * time.Second)
		if d := decide(3); !d.Allowed {
			t.Fatalf("after 31 s (3 tokens back): %+v, want admitted", d)
		}
	})
}

// TestGrantsAfterTheChargeAreChargedInFull: once a replay pass has charged
// a token bucket or GCRA key's share through its time, the store refills the
// key at the whole rate: the grants the instance still makes locally while
// it waits for a missing instance owe every unit, and the next pass charges
// all of them. Netted against the outage's share, which by then looked full
// again, they were charged a fraction (1 unit for 10 grants here).
func TestGrantsAfterTheChargeAreChargedInFull(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				f.live.Store(2)
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
				var (
					l              *resilient.Limiter
					local, atFirst atomic.Int64
					passes         [][]store.ReplayBatch
				)
				decide := func() {
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed && d.Mode == ratelimit.ModeLocal {
						local.Add(1)
					}
				}
				inner := f.ReplayFunc
				f.ReplayFunc = func(ctx context.Context, batches []store.ReplayBatch) ([]store.ReplayResult, []error) {
					if !f.down.Load() { // the passes that reach the store
						if len(passes) == 0 {
							atFirst.Store(local.Load())
							// A request during the pass: the journal keeps the
							// outage's snapshots for the grants after it.
							time.Sleep(200 * time.Millisecond)
							decide()
						}
						passes = append(passes, slices.Clone(batches))
					}
					return inner(ctx, batches)
				}
				l = newLimiter(t, f, resilient.Config{ExpectedInstances: 2})
				send := func(n int, every time.Duration) {
					for range n {
						decide()
						time.Sleep(every)
					}
				}
				send(10, 50*time.Millisecond)
				f.down.Store(true)
				send(400, 50*time.Millisecond) // 20 s at 20/s against a share of 5/s
				// The other instance stays away: this one replays, then waits
				// for it (RecoveryWait), granting locally meanwhile at the
				// share's own rate.
				f.live.Store(1)
				f.down.Store(false)
				send(15, 200*time.Millisecond)
				settle(time.Second)
				if l.Breaker() != resilient.BreakerClosed || len(passes) < 2 {
					t.Fatalf("breaker %s after %d replay passes, want closed after two or more", l.Breaker(), len(passes))
				}
				after := local.Load() - atFirst.Load()
				var charged int64
				for _, pass := range passes[1:] {
					for _, b := range pass {
						for _, g := range b.Grants {
							charged += g.Cost
						}
					}
				}
				t.Logf("%d local grants after the first pass, %d units charged by the later passes", after, charged)
				if after == 0 || charged != after {
					t.Errorf("the passes after the first charged %d units for the %d grants made after it, want all of them", charged, after)
				}
			})
		})
	}
}

// TestFullJournalRefuses: once the journal holds its maximum, local grants
// are refused (and counted as overflow) instead of made without a record
// that would bring them to the store.
func TestFullJournalRefuses(t *testing.T) {
	f := &nullStore{}
	f.down.Store(true)
	l, err := resilient.New(f, resilient.Config{Instance: "full", FailureThreshold: 1, JournalMax: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Minute}
	allowed := 0
	for i := range 300 {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("k", i%10)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	s := l.Status()
	if allowed != int(s.Journal.Granted) || s.Journal.Held > 100 || s.Journal.Overflow == 0 || int(s.Journal.Granted)+int(s.Journal.Overflow) != 300 {
		t.Fatalf("%d allowed; journal %+v: want every grant journaled, at most 100 held, the rest refused as overflow", allowed, s.Journal)
	}
}
