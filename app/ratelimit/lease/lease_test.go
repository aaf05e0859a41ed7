package lease_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

const instances = 4

// instance is one limiter as the service builds it in lease mode: its own
// Redis clients, store, resilient limiter and lease layer. Instances share
// nothing but Redis.
type instance struct {
	res   *resilient.Limiter
	lease *lease.Limiter
}

func startInstance(t *testing.T, addr, name string) *instance {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{addr}, Timeout: 200 * time.Millisecond, PoolSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{addr}, Timeout: 2 * time.Second, PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	res, err := resilient.New(redisstore.New(c, redisstore.Config{ReplayClient: rc}), resilient.Config{
		Instance: name, Timeout: 200 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 500 * time.Millisecond,
		LeaseGrace: 10 * time.Second, ExpectedInstances: instances,
	})
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{res: res, lease: lease.New(res, lease.Config{Instance: name})}
	t.Cleanup(func() {
		_ = in.lease.Close(context.Background())
		_ = res.Close(context.Background())
		_ = c.Close()
		_ = rc.Close()
	})
	return in
}

func startFleet(t *testing.T, addr string) []*instance {
	t.Helper()
	var fleet []*instance
	for i := range instances {
		fleet = append(fleet, startInstance(t, addr, fmt.Sprint("app", i+1)))
	}
	deadline := time.Now().Add(5 * time.Second)
	for fleet[0].res.Status().Live != instances {
		if time.Now().After(deadline) {
			t.Fatal("the instances' heartbeats did not meet")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fleet
}

// admission is an admitted request's decision interval, as the chaos
// suite's over-admission check reads it.
type admission struct{ send, recv time.Time }

// overAdmitted returns the largest excess over what GCRA admits of the
// admissions, in units: over every run i..j (in send order) n - capacity -
// rate × (latest recv - send_i), the run's decisions having certainly been
// made within that span (chaos/invariant.KeyOverAdmission).
func overAdmitted(p ratelimit.Policy, adm []admission) float64 {
	slices.SortFunc(adm, func(a, b admission) int { return a.send.Compare(b.send) })
	rate := float64(p.Limit) / float64(p.Window)
	worst := -float64(p.Capacity())
	for i := range adm {
		last := adm[i].recv
		for j := i; j < len(adm); j++ {
			if adm[j].recv.After(last) {
				last = adm[j].recv
			}
			if v := float64(j-i+1) - float64(p.Capacity()) - rate*float64(last.Sub(adm[i].send)); v > worst {
				worst = v
			}
		}
	}
	return worst
}

// TestLeasesNeverAdmitMoreThanGCRA: four instances sharing one Redis answer
// a hot key under its limit from leases, admitting every request, and then
// flooded past it never admit more than one GCRA limiter would over any
// interval; the flood's leftover leases are given back.
func TestLeasesNeverAdmitMoreThanGCRA(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	fleet := startFleet(t, srv.Addr())
	p := ratelimit.Policy{Name: "hot", Algorithm: ratelimit.GCRA, Limit: 2000, Window: time.Second, Lease: 50 * time.Millisecond}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var (
		mu       sync.Mutex
		adm      []admission
		refused  [2]int
		decided  [2]int
		failures []error
	)
	// run has 4 goroutines per instance decide for d, each pausing pause
	// between requests (phase 0: about 1200 a second in all, under the
	// limit; phase 1: as fast as they can).
	run := func(phase int, d, pause time.Duration) {
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for i, in := range fleet {
			for g := range 4 {
				wg.Go(func() {
					for n := 0; time.Now().Before(end); n++ {
						send := time.Now()
						dec, err := in.lease.Decide(ctx, ratelimit.Request{Policy: p, Key: "hot", ID: fmt.Sprintf("p%d-i%d-g%d-%d", phase, i, g, n)})
						recv := time.Now()
						mu.Lock()
						switch {
						case err != nil:
							failures = append(failures, err)
						case dec.Allowed:
							adm = append(adm, admission{send, recv})
						default:
							refused[phase]++
						}
						decided[phase]++
						mu.Unlock()
						time.Sleep(pause)
					}
				})
			}
		}
		wg.Wait()
	}
	run(0, 1500*time.Millisecond, 13*time.Millisecond)
	var served uint64
	for _, in := range fleet {
		served += in.lease.Stats().Served
	}
	if len(failures) > 0 {
		t.Fatalf("%d failed decisions, the first: %v", len(failures), failures[0])
	}
	if refused[0] > 0 || served < uint64(decided[0])/2 {
		t.Fatalf("under the limit: %d of %d refused, %d answered from leases; want none refused, at least half from leases",
			refused[0], decided[0], served)
	}
	run(1, time.Second, 0)
	if over := overAdmitted(p, adm); over > 0 {
		t.Fatalf("%d admitted; over some interval %.1f more than GCRA admits", len(adm), over)
	}
	if refused[1] == 0 {
		t.Fatalf("the flood was never refused (%d decided)", decided[1])
	}
	var draws uint64
	for _, in := range fleet {
		st := in.lease.Stats()
		draws += st.Draws
		if err := in.lease.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if st := in.lease.Stats(); st.Held != 0 || st.Units != 0 {
			t.Fatalf("closed with %d leases of %d units held", st.Held, st.Units)
		}
	}
	t.Logf("%d decided, %d admitted, %d from leases in phase 0, %d draws", decided[0]+decided[1], len(adm), served, draws)
}

// TestColdKeyIsDecidedInTheStore: a key asked fewer than lease.MinUnits
// units in a lifetime gets no lease: Redis holds for it exactly what it
// holds for a key decided without the lease layer.
func TestColdKeyIsDecidedInTheStore(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	in := startInstance(t, srv.Addr(), "app1")
	p := ratelimit.Policy{Name: "cold", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second, Lease: 100 * time.Millisecond}
	ctx := context.Background()
	for n := range 6 {
		for _, key := range []string{"leased", "plain"} {
			var l ratelimit.Limiter = in.lease
			if key == "plain" {
				l = in.res
			}
			d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: key, ID: fmt.Sprint(key, n)})
			if err != nil || !d.Allowed || d.Mode != ratelimit.ModeRedis {
				t.Fatalf("%s %d: %+v %v", key, n, d, err)
			}
		}
		time.Sleep(2 * p.Lease) // two requests a lifetime at most: cold
	}
	if st := in.lease.Stats(); st.Draws != 0 || st.Served != 0 {
		t.Fatalf("a cold key took leases: %+v", st)
	}
	a, _ := in.res.Decide(ctx, ratelimit.Request{Policy: p, Key: "leased", ReadOnly: true})
	b, _ := in.res.Decide(ctx, ratelimit.Request{Policy: p, Key: "plain", ReadOnly: true})
	if a.Remaining != b.Remaining {
		t.Fatalf("remaining %d through the lease layer, %d without", a.Remaining, b.Remaining)
	}
}

// TestUnusedUnitsAreGivenBack: a lease's units not used by the end of its
// lifetime go back to Redis, which then holds only the units used (and the
// hold's refill of a lifetime at most).
func TestUnusedUnitsAreGivenBack(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	in := startInstance(t, srv.Addr(), "app1")
	p := ratelimit.Policy{Name: "back", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Hour, Lease: time.Second}
	ctx := context.Background()
	used := 0
	for n := range 12 {
		d, err := in.lease.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint(n)})
		if err != nil || !d.Allowed {
			t.Fatalf("%d: %+v %v", n, d, err)
		}
		used++
	}
	st := in.lease.Stats()
	if st.Draws == 0 || st.Units == 0 {
		t.Fatalf("no lease held after %d requests: %+v", used, st)
	}
	held := st.Units
	deadline := time.Now().Add(5 * time.Second)
	for in.lease.Stats().Refunded < uint64(held) {
		if time.Now().After(deadline) {
			t.Fatalf("%d units on lease, %d given back", held, in.lease.Stats().Refunded)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d, err := in.res.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	// The refill of one lifetime at 1000 an hour is less than a unit.
	if want := p.Capacity() - int64(used); d.Remaining < want-1 || d.Remaining > want {
		t.Fatalf("Redis has %d left after %d used; want %d", d.Remaining, used, want)
	}
}

// TestNoLeaseWhileTheStoreIsOut: with Redis down, a lease held is spent
// until it expires, no lease is taken, and every request is decided as
// without lease mode (by the fallback): the local share is charged the
// requests' own units, not a draw's.
func TestNoLeaseWhileTheStoreIsOut(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	in := startInstance(t, srv.Addr(), "app1")
	p := ratelimit.Policy{Name: "out", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second, Lease: 500 * time.Millisecond}
	ctx := context.Background()
	decide := func(n int) ratelimit.Decision {
		d, err := in.lease.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint(n)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for n := range 12 {
		decide(n)
	}
	if in.lease.Stats().Draws == 0 {
		t.Fatal("no lease taken")
	}
	srv.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for in.res.Breaker() == resilient.BreakerClosed {
		if time.Now().After(deadline) {
			t.Fatal("the breaker did not open")
		}
		decide(100)
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2 * p.Lease)
	draws, granted := in.lease.Stats().Draws, in.res.Status().Journal.Granted
	for n := range 50 {
		if d := decide(200 + n); d.Mode != ratelimit.ModeLocal || !d.Allowed {
			t.Fatalf("request %d with Redis out: %+v", n, d)
		}
	}
	if got := in.lease.Stats().Draws; got != draws {
		t.Fatalf("%d leases taken with Redis out", got-draws)
	}
	if got := in.res.Status().Journal.Granted - granted; got != 50 {
		t.Fatalf("50 requests of one unit granted locally charged %d units", got)
	}
}

// TestLeaseLongerThanTheWindow: a valid policy whose lease outlives its
// window (the burst refills over ten windows) draws leases and answers
// every request with a decision, never an invalid request, and admits no
// more than GCRA would.
func TestLeaseLongerThanTheWindow(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	in := startInstance(t, srv.Addr(), "app1")
	p := ratelimit.Policy{Name: "long", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second, Burst: 100, Lease: 2 * time.Second}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var adm []admission
	for n := range 300 {
		sent := time.Now()
		d, err := in.lease.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint(n)})
		if err != nil {
			t.Fatalf("request %d: %v", n, err)
		}
		if d.Allowed {
			adm = append(adm, admission{sent, time.Now()})
		}
	}
	if in.lease.Stats().Draws == 0 {
		t.Fatalf("no lease drawn: %+v", in.lease.Stats())
	}
	// Under-admission: at most a lease's units (an eighth of the burst)
	// and a lifetime's refill (the hold), beside the burst of 100.
	if low := 100 - 100/8 - 20; len(adm) < low {
		t.Fatalf("%d of 300 admitted, fewer than %d", len(adm), low)
	}
	if over := overAdmitted(p, adm); over > 0 {
		t.Fatalf("admitted %.2f units more than GCRA", over)
	}
}

// TestRefundAtTheDrawsWeight: a lease drawn while the fleet decides at 1/1
// and given back after an instance turned suspect (a stricter weight) gives
// back the units it took, not more: Redis holds exactly the usage from
// before the draw.
func TestRefundAtTheDrawsWeight(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	proxy := redistest.StartProxy(t, srv.Addr())
	var fleet []*instance
	for i := range instances {
		addr := srv.Addr()
		if i == instances-1 {
			addr = proxy.Addr()
		}
		fleet = append(fleet, startInstance(t, addr, fmt.Sprint("app", i+1)))
	}
	a := fleet[0]
	waitFor(t, "the instances' heartbeats to meet", func() bool { return a.res.Status().Live == instances })
	p := ratelimit.Policy{Name: "w", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Hour, Lease: time.Second}
	ctx := context.Background()
	for n := range 5 {
		if d, err := a.res.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", Cost: 100, ID: fmt.Sprint("use", n)}); err != nil || !d.Allowed {
			t.Fatalf("use %d: %+v %v", n, d, err)
		}
	}
	draw := contract.Request{Request: ratelimit.Request{Policy: p, Key: "k", Cost: 100, ID: "draw"}, Hold: p.Lease}
	ds, errs := contract.Extension(a.res).(contract.Decider).DecideWire(ctx, []contract.Request{draw})
	d, err := ds[0], errs[0]
	if err != nil || !d.Allowed || d.Mode != ratelimit.ModeRedis {
		t.Fatalf("draw: %+v %v", d, err)
	}
	if d.Weight != (contract.Weight{}) {
		t.Fatalf("the draw was charged at %+v with every instance live", d.Weight)
	}
	proxy.Disable() // app4's heartbeats stop: the others hold its share back
	waitFor(t, "app4 to turn suspect", func() bool { return a.res.Status().Suspect > 0 })
	time.Sleep(300 * time.Millisecond) // held back from the second heartbeat that misses it
	probe, err := a.res.Decide(ctx, ratelimit.Request{Policy: p, Key: "other", ID: "probe"})
	if err != nil || probe.Remaining >= p.Capacity()-1 { // 749 at 4/3
		t.Fatalf("no stricter weight with app4 suspect: %+v %v", probe, err)
	}
	back := draw
	back.Hold = 0
	n, err := contract.Extension(a.res).(contract.Refunder).Refund(ctx, back, d)
	if err != nil || n != 100 {
		t.Fatalf("refund: %d units, %v", n, err)
	}
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{srv.Addr()}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Read at 1/1 straight from Redis (a resilient limiter would read at
	// its weight).
	rd, err := redisstore.New(c, redisstore.Config{}).Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	// 500 used; the refill of the test's few seconds at 1000 an hour is
	// under two units.
	if rd.Remaining < 500 || rd.Remaining > 502 {
		t.Fatalf("Redis has %d left after 500 used and the draw given back; want 500", rd.Remaining)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestResetEndsTheLease: a reset of a key whose lease this instance holds
// ends the lease without giving its units back (they were counted before
// the reset, which lifted them): the key's next request is not served from
// it, and Redis holds the fresh key's usage only.
func TestResetEndsTheLease(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	in := startInstance(t, srv.Addr(), "app1")
	p := ratelimit.Policy{Name: "reset", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Hour, Lease: time.Second}
	ctx := context.Background()
	for n := range 12 {
		if d, err := in.lease.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint(n)}); err != nil || !d.Allowed {
			t.Fatalf("%d: %+v %v", n, d, err)
		}
	}
	st := in.lease.Stats()
	if st.Units == 0 {
		t.Fatalf("no lease held: %+v", st)
	}
	if err := in.res.Reset(ctx, "k", p); err != nil {
		t.Fatalf("reset: %v", err)
	}
	after := in.lease.Stats()
	if after.Units != 0 || after.Lost != st.Lost+uint64(st.Units) {
		t.Fatalf("after the reset: %+v; want the lease's %d units dropped, not held", after, st.Units)
	}
	d, err := in.lease.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: "after"})
	if err != nil || !d.Allowed || in.lease.Stats().Served != after.Served {
		t.Fatalf("the first request after the reset: %+v %v, served %d; want decided in Redis, not from the old lease", d, err, in.lease.Stats().Served-after.Served)
	}
	time.Sleep(2 * p.Lease) // any refund would be sent by now
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{srv.Addr()}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd, err := redisstore.New(c, redisstore.Config{}).Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ReadOnly: true})
	if err != nil || rd.Remaining != 999 {
		t.Fatalf("Redis after the reset: %+v %v; want 999 left (the one request since), no old units given back", rd, err)
	}
}
