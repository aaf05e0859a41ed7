package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// hammer sends requests for one key through several limiters, from many
// goroutines, for d, and returns the grants in Redis time order.
func hammer(t *testing.T, limiters []*redisstore.Store, p ratelimit.Policy, key string, d time.Duration) []int64 {
	t.Helper()
	var (
		mu     sync.Mutex
		grants []int64
		wg     sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	for g := range 16 {
		wg.Go(func() {
			l := limiters[g%len(limiters)]
			for i := 0; time.Now().Before(deadline); i++ {
				dec, err := l.DecideWire(context.Background(), contract.Request{Request: ratelimit.Request{Policy: p, Key: key, ID: fmt.Sprintf("g%d-%d", g, i)}})
				if err != nil {
					t.Error(err)
					return
				}
				if dec.Allowed {
					mu.Lock()
					grants = append(grants, dec.State.Now)
					mu.Unlock()
				}
				time.Sleep(time.Millisecond) // pace the load, not a synchronisation
			}
		})
	}
	wg.Wait()
	sort.Slice(grants, func(i, j int) bool { return grants[i] < grants[j] })
	return grants
}

// checkAdmissions asserts the policy's bound over the grant times (µs).
func checkAdmissions(t *testing.T, p ratelimit.Policy, grants []int64) {
	t.Helper()
	w := p.Window.Microseconds()
	switch p.Algorithm {
	case ratelimit.SlidingWindowLog:
		for i, j := 0, 0; j < len(grants); j++ {
			for grants[j]-grants[i] >= w {
				i++
			}
			if n := int64(j - i + 1); n > p.Limit {
				t.Fatalf("%d grants within one window ending at %d, limit %d", n, grants[j], p.Limit)
			}
		}
	case ratelimit.SlidingWindowCounter:
		counts := map[int64]int64{}
		for _, g := range grants {
			counts[g/w]++
		}
		for win, n := range counts {
			if n > p.Limit {
				t.Fatalf("%d grants in aligned window %d, limit %d", n, win, p.Limit)
			}
		}
	default: // token bucket, GCRA: n <= capacity + rate × span for every run.
		for i := range grants {
			for j := i; j < len(grants); j++ {
				n := int64(j - i + 1)
				allowed := p.Capacity()*w + (grants[j]-grants[i])*p.Limit // × w
				if n*w > allowed {
					t.Fatalf("%d grants in %d µs, at most %.2f allowed", n, grants[j]-grants[i], float64(allowed)/float64(w))
				}
			}
		}
	}
	if len(grants) < int(p.Limit) {
		t.Fatalf("only %d grants: the load did not reach the limit %d", len(grants), p.Limit)
	}
}

// TestInstancesShareOnlyRedis runs four limiters with their own clients
// against one Redis and checks the fleet-wide bound from Redis' times.
func TestInstancesShareOnlyRedis(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "fleet", Algorithm: alg, Limit: 20, Window: 500 * time.Millisecond}
			var ls []*redisstore.Store
			for range 4 {
				ls = append(ls, redisstore.New(newClient(t, srv.Addr()), redisstore.Config{}))
			}
			checkAdmissions(t, p, hammer(t, ls, p, "shared-"+string(alg), 1500*time.Millisecond))
		})
	}
}

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	l := redisstore.New(cl.Client(), redisstore.Config{})
	// A Cluster's masters fail on their own: the breaker must not take one
	// refusing a call for the store being down.
	one := redis.NewClient(&redis.Options{Addr: cl.MasterFor("x").Addr()})
	t.Cleanup(func() { _ = one.Close() })
	if !l.Ext().Sharded() || redisstore.New(one, redisstore.Config{}).Ext().Sharded() {
		t.Fatalf("Sharded: %v on the Cluster, %v on one of its nodes; want true, false", l.Ext().Sharded(), redisstore.New(one, redisstore.Config{}).Ext().Sharded())
	}
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "cl", Algorithm: alg, Limit: 20, Window: 500 * time.Millisecond}
			var ls []*redisstore.Store
			for range 3 {
				c := redis.NewClusterClient(cl.ClusterOptions())
				t.Cleanup(func() { _ = c.Close() })
				ls = append(ls, redisstore.New(c, redisstore.Config{}))
			}
			checkAdmissions(t, p, hammer(t, ls, p, "cluster-"+string(alg), 1500*time.Millisecond))
		})
	}
	t.Run("keys spread over every master", func(t *testing.T) {
		p := ratelimit.Policy{Name: "spread", Algorithm: ratelimit.GCRA, Limit: 5, Window: time.Minute}
		masters := map[string]int{}
		for i := range 60 {
			k := fmt.Sprintf("client-%d", i)
			if d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: k}); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v %v", k, d, err)
			}
			masters[cl.MasterFor(l.Key(p, k)).Addr()]++
		}
		if len(masters) != 3 {
			t.Fatalf("60 keys landed on %d masters (%v), want all 3", len(masters), masters)
		}
	})
	t.Run("a client cannot choose the slot", func(t *testing.T) {
		p := ratelimit.Policy{Name: "tag", Algorithm: ratelimit.TokenBucket, Limit: 5, Window: time.Minute}
		slots := map[int64]bool{}
		for i := range 40 {
			k := fmt.Sprintf("{x}%d", i) // all would share slot("x") if used as is
			key := l.Key(p, k)
			if !strings.HasPrefix(key, "{rl:") || strings.Contains(key, "{x}") || len(key) > 80 {
				t.Fatalf("key %q for identity %q", key, k)
			}
			slot, err := cl.Client().ClusterKeySlot(context.Background(), key).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots[slot] = true
			if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: k}); err != nil {
				t.Fatal(err)
			}
		}
		if len(slots) < 20 {
			t.Fatalf("40 identities {x}N share %d slots: the client chose the slot", len(slots))
		}
	})
	// A master without the library (restarted empty, flushed): a pipeline
	// and single calls load it on every master and are counted once each.
	t.Run("masters without the library", func(t *testing.T) {
		ctx := context.Background()
		c := cl.Client()
		flush := func() {
			if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FunctionFlush(ctx).Err() }); err != nil {
				t.Fatal(err)
			}
		}
		p := ratelimit.Policy{Name: "nolib", Algorithm: ratelimit.SlidingWindowLog, Limit: 5, Window: time.Minute}
		reqs := make([]ratelimit.Request, 60)
		for i := range reqs {
			reqs[i] = ratelimit.Request{Policy: p, Key: fmt.Sprintf("client-%d", i)}
		}
		flush()
		ds, errs := l.DecideBatch(ctx, reqs)
		for i := range reqs {
			if errs[i] != nil || !ds[i].Allowed {
				t.Fatalf("batch, %s: %+v %v", reqs[i].Key, ds[i], errs[i])
			}
		}
		flush()
		for _, r := range reqs {
			if d, err := l.Decide(ctx, r); err != nil || !d.Allowed {
				t.Fatalf("single, %s: %+v %v", r.Key, d, err)
			}
		}
		for _, r := range reqs {
			if n, err := c.ZCard(ctx, l.Key(p, r.Key)).Result(); err != nil || n != 2 {
				t.Fatalf("%s holds %d grants (%v), want exactly 2", r.Key, n, err)
			}
		}
	})
}

func TestSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: s.SentinelAddrs(), MasterName: s.MasterName(), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	l := redisstore.New(client, redisstore.Config{})
	p := ratelimit.Policy{Name: "sent", Algorithm: ratelimit.SlidingWindowLog, Limit: 1000, Window: time.Minute}
	decide := func(id string) error {
		_, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k", ID: id})
		return err
	}
	for i := range 10 {
		if err := decide(fmt.Sprintf("before-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	oldMaster := s.Master().Addr()
	s.Failover(t)
	if s.Master().Addr() == oldMaster {
		t.Fatal("the master did not change")
	}
	// Decisions resume on the new master (a few may fail while the client
	// notices the switch).
	deadline := time.Now().Add(20 * time.Second)
	ok := 0
	for i := 0; ok < 10; i++ {
		err := decide(fmt.Sprintf("after-%d", i))
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, ratelimit.ErrUnavailable):
			t.Fatalf("after failover: %v, want success or ErrUnavailable", err)
		case time.Now().After(deadline):
			t.Fatalf("no decisions after failover: %v", err)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestClusterDeadMasterFailsAtOnce: with the shipped client, a heartbeat and
// a decision that reach a Cluster master that was just SIGKILLed fail with
// the refusal, not with their deadline. A refused heartbeat opens the
// breaker at once; a timed-out one only at the third in a row. With
// go-redis' default retries (a dead node's EOF and refused dials retried
// three times with back-off until the deadline) the refusal would come back
// as a timeout, and the instances would go on deciding in Redis while their
// peers' local shares counted those places free.
func TestClusterDeadMasterFailsAtOnce(t *testing.T) {
	cl := redistest.StartCluster(t)
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: cl.Addrs(), Cluster: true, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	p := ratelimit.Policy{Name: "dead", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Minute}
	fleetMaster := cl.MasterFor(l.Ext().FleetKey())
	var key string
	for i := 0; key == ""; i++ {
		if k := fmt.Sprint("client-", i); cl.MasterFor(l.Key(p, k)) != fleetMaster {
			key = k
		}
	}
	if _, err := l.Heartbeat(ctx, "app1", 300*time.Millisecond, time.Second); err != nil {
		t.Fatalf("heartbeat before the kill: %v", err)
	}
	if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: key}); err != nil {
		t.Fatalf("decision before the kill: %v", err)
	}
	cl.MasterFor(l.Key(p, key)).Kill()
	timedOut := func(err error) bool {
		var ne net.Error
		return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	}
	for i := range 3 {
		callCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := l.Heartbeat(callCtx, "app1", 300*time.Millisecond, time.Second)
		cancel()
		if err == nil || timedOut(err) {
			t.Fatalf("heartbeat %d after the kill: %v, want the refusal", i+1, err)
		}
		callCtx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = l.Decide(callCtx, ratelimit.Request{Policy: p, Key: key})
		cancel()
		if err == nil || timedOut(err) {
			t.Fatalf("decision %d on the dead master: %v, want the refusal", i+1, err)
		}
	}
}

// decideInParallel decides p from 64 goroutines on 2 CPUs, each on a key
// of its own, until b.N decisions.
func decideInParallel(b *testing.B, l *redisstore.Store, p ratelimit.Policy) {
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprint("client-", next.Add(1))
		for pb.Next() {
			if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: key}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
