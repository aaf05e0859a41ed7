package resilient_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/mocks"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// fakeStore is a mocked Store whose decisions, while up, come from an
// in-memory twin of the Redis scripts on the (synctest) clock; while down,
// every call fails like a refused connection, or hangs until its deadline.
type fakeStore struct {
	*mocks.Store
	twin        atomic.Pointer[memstore.Store] // swapped for an empty one: a wipe
	gen         atomic.Pointer[string]
	down, hang  atomic.Bool
	failReplay  atomic.Bool
	failBeats   atomic.Bool  // heartbeats refused, decisions answered (a Cluster master down)
	slowBeats   atomic.Int64 // heartbeats left that outlive their deadline (a store busy with other instances' replays)
	slowPings   atomic.Int64 // pings left that outlive their deadline (a Redis starting: its first connection is slow)
	live, susp  atomic.Int64
	lastRequest atomic.Pointer[contract.Request]
	// skew is the store's clock minus the local one, µs.
	skew atomic.Int64
}

func newFakeStore() *fakeStore {
	f := &fakeStore{}
	f.twin.Store(memstore.New(memstore.Config{}))
	gen := "gen-1"
	f.gen.Store(&gen)
	f.live.Store(4)
	fail := f.fail
	f.Store = &mocks.Store{
		DecideFunc: func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
			r := contract.Request{Request: req}
			c, _ := ctx.Value(wireKey{}).(*wireCall)
			if c != nil {
				r = c.req
			}
			f.lastRequest.Store(&r)
			if f.down.Load() || f.hang.Load() {
				return ratelimit.Decision{}, fail(ctx)
			}
			ds, errs := contract.Extension(f.twin.Load()).(contract.Decider).DecideWire(ctx, []contract.Request{r})
			ds[0].Mode = ratelimit.ModeRedis
			if c != nil {
				c.d = ds[0]
			}
			return ds[0].Decision, errs[0]
		},
		PingFunc: func(ctx context.Context) error {
			if f.down.Load() || f.hang.Load() {
				return fail(ctx)
			}
			if f.slowPings.Add(-1) >= 0 {
				<-ctx.Done()
				return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
			}
			return nil
		},
		HeartbeatFunc: func(ctx context.Context, _ string, _, _ time.Duration) (store.Fleet, error) {
			if f.down.Load() || f.hang.Load() {
				return store.Fleet{}, fail(ctx)
			}
			if f.failBeats.Load() {
				return store.Fleet{}, fmt.Errorf("%w: connection refused", ratelimit.ErrUnavailable)
			}
			if f.slowBeats.Add(-1) >= 0 {
				<-ctx.Done()
				return store.Fleet{}, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
			}
			return store.Fleet{Live: int(f.live.Load()), Suspect: int(f.susp.Load()), Generation: *f.gen.Load(),
				Now: time.Now().UnixMicro() + f.skew.Load()}, nil
		},
		GenerationFunc: func(ctx context.Context) (string, error) {
			if f.down.Load() || f.hang.Load() {
				return "", fail(ctx)
			}
			return *f.gen.Load(), nil
		},
		LeaveFunc: func(context.Context, string, time.Duration, time.Duration) error { return nil },
		ReplayFunc: func(ctx context.Context, batches []store.ReplayBatch) ([]store.ReplayResult, []error) {
			if f.down.Load() || f.hang.Load() || f.failReplay.Load() {
				errs := make([]error, len(batches))
				for i := range errs {
					errs[i] = fail(ctx)
				}
				return make([]store.ReplayResult, len(batches)), errs
			}
			return contract.Extension(f.twin.Load()).(interface {
				Replay(context.Context, []store.ReplayBatch) ([]store.ReplayResult, []error)
			}).Replay(ctx, batches)
		},
	}
	return f
}

// hangDecisions makes the store's decisions, from when the returned flag
// is set, time out at their deadlines while its heartbeats answer: a slow
// store, with the breaker closed.
func (f *fakeStore) hangDecisions() *atomic.Bool {
	hang := new(atomic.Bool)
	decide := f.DecideFunc
	f.DecideFunc = func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
		if hang.Load() {
			<-ctx.Done()
			return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
		}
		return decide(ctx, req)
	}
	return hang
}

// fail fails a call like a refused connection, or, hanging, at its
// deadline.
func (f *fakeStore) fail(ctx context.Context) error {
	if f.hang.Load() {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
	}
	return fmt.Errorf("%w: connection refused", ratelimit.ErrUnavailable)
}

// DecideWire decides as a store of the module does (contract.Decider),
// with weights and states, each request through the mock's Decide (so that
// tests count the calls and wrap or replace DecideFunc); the default
// DecideFunc decides in the twin and hands the state back through ctx.
func (f *fakeStore) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	ds, errs := make([]contract.Decision, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		c := &wireCall{req: r}
		d, err := f.Store.Decide(context.WithValue(ctx, wireKey{}, c), r.Request)
		ds[i], errs[i] = c.d, err
		ds[i].Decision = d
	}
	return ds, errs
}

// wireCall carries a request's weight to the default DecideFunc, and the
// twin's state back.
type wireCall struct {
	req contract.Request
	d   contract.Decision
}

type wireKey struct{}

func newLimiter(t *testing.T, s store.Store, cfg resilient.Config) *resilient.Limiter {
	t.Helper()
	if cfg.Instance == "" {
		cfg.Instance = "test"
	}
	l, err := resilient.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	synctest.Wait() // the first heartbeat
	return l
}

// admit sends n requests and returns how many were allowed, checking the mode.
func admit(t *testing.T, l ratelimit.Limiter, p ratelimit.Policy, key string, n int, mode ratelimit.Mode) int {
	t.Helper()
	allowed := 0
	for range n {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if d.Mode != mode {
			t.Fatalf("mode %s, want %s", d.Mode, mode)
		}
		if d.Allowed {
			allowed++
		}
	}
	return allowed
}

// shardedFake is the fake store as a Redis Cluster: its masters fail on
// their own.
type shardedFake struct{ *fakeStore }

func (shardedFake) Sharded() bool { return true }

// stagedFake is a fakeStore that keeps recovery stages: its heartbeats
// return the others' (set by the test) and the caller's own.
type stagedFake struct {
	*fakeStore
	others atomic.Pointer[[]string]
}

func (f *stagedFake) HeartbeatStage(ctx context.Context, instance string, ttl, grace time.Duration, stage string) (store.Fleet, error) {
	fleet, err := f.Heartbeat(ctx, instance, ttl, grace)
	if err == nil {
		fleet.Stages = append(slices.Clone(*f.others.Load()), stage)
	}
	return fleet, err
}

// settle lets fake time pass (inside a synctest bubble) and waits until the
// limiter's loop is idle again, off the ticker's instants.
func settle(d time.Duration) {
	time.Sleep(d + 7*time.Millisecond)
	synctest.Wait()
}

// nullStore answers every decision with the same reply and keeps nothing;
// down fails every call like a refused connection.
type nullStore struct{ down atomic.Bool }

func (s *nullStore) err() error {
	if s.down.Load() {
		return fmt.Errorf("%w: connection refused", ratelimit.ErrUnavailable)
	}
	return nil
}

func (s *nullStore) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	ds, errs := s.DecideWire(ctx, []contract.Request{{Request: req}})
	return ds[0].Decision, errs[0]
}

func (s *nullStore) DecideWire(_ context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	ds, errs := make([]contract.Decision, len(reqs)), make([]error, len(reqs))
	for i, req := range reqs {
		if errs[i] = s.err(); errs[i] != nil {
			continue
		}
		ds[i] = contract.Decision{
			Decision: ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: time.Second, Mode: ratelimit.ModeRedis},
			State:    contract.State{Now: time.Now().UnixMicro(), Tokens: 99 * req.Policy.Window.Microseconds(), Current: 1},
		}
	}
	return ds, errs
}

func (s *nullStore) Ping(context.Context) error { return s.err() }

func (s *nullStore) Heartbeat(context.Context, string, time.Duration, time.Duration) (store.Fleet, error) {
	return store.Fleet{Live: 1, Generation: "g", Now: time.Now().UnixMicro()}, s.err()
}

func (s *nullStore) Generation(context.Context) (string, error) { return "g", s.err() }

func (s *nullStore) Leave(context.Context, string, time.Duration, time.Duration) error { return nil }

func (s *nullStore) Replay(_ context.Context, b []store.ReplayBatch) ([]store.ReplayResult, []error) {
	errs := make([]error, len(b))
	for i := range errs {
		errs[i] = s.err()
	}
	return make([]store.ReplayResult, len(b)), errs
}
