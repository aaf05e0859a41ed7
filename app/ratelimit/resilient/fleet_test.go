package resilient_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// The fleet tests run four resilient limiters that share nothing but one
// real redis-server, each reaching it through its own fault-injection proxy,
// under the chaos suite's load pattern (scaled down: 3 s windows), and check
// the invariants from the decisions they record.

const (
	fleetWindow = 3 * time.Second
	fleetLimit  = 100
	instances   = 4
	// The contract's largest per-call timeout: the tests share two cores
	// with Redis and each other, and a stray slow call must not open a
	// breaker in the healthy phase.
	fleetTimeout = 100 * time.Millisecond
)

type phase int

const (
	warmup phase = iota
	healthy
	fault
	recovery
	phases
)

var phaseNames = [phases]string{"warmup", "healthy", "fault", "recovery"}

// record is one request as the client saw it (µs, local clock).
type record struct {
	alg      ratelimit.Algorithm
	key      string
	abusive  bool
	send     int64
	recv     int64
	allowed  bool
	mode     ratelimit.Mode
	instance int
}

type fleet struct {
	srv      *redistest.Server
	proxies  []*redistest.Proxy
	limiters []*resilient.Limiter
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	f := &fleet{srv: redistest.StartServer(t, redistest.ServerOptions{AOF: true})}
	for i := range instances {
		px := redistest.StartProxy(t, f.srv.Addr())
		// As the service ships it: replies read past their deadline, and
		// concurrent decisions coalesced.
		client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{px.Addr()}, Timeout: fleetTimeout, PoolSize: 16, LateReplies: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		// Replays on a client of their own, as the service ships it.
		replay, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{px.Addr()}, Timeout: 2 * time.Second, PoolSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = replay.Close() })
		rs := redisstore.New(client, redisstore.Config{ReplayClient: replay, Timeout: fleetTimeout, Coalescing: 4})
		l, err := resilient.New(rs, resilient.Config{
			Instance:          fmt.Sprint("app", i+1),
			Timeout:           fleetTimeout,
			ProbeInterval:     250 * time.Millisecond,
			HeartbeatInterval: 50 * time.Millisecond,
			HeartbeatTTL:      150 * time.Millisecond,
			LeaseGrace:        10 * time.Second,
			ExpectedInstances: instances,
			// On a loaded machine the instances' probes drift apart;
			// give the last one time to replay before the first decides
			// in Redis again.
			RecoveryWait: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		f.proxies = append(f.proxies, px)
		f.limiters = append(f.limiters, l)
	}
	return f
}

func fleetPolicy(alg ratelimit.Algorithm) ratelimit.Policy {
	return ratelimit.Policy{Name: "fleet-" + string(alg), Algorithm: alg, Limit: fleetLimit, Window: fleetWindow}
}

// run drives the load through the phases, calling inject at the start of
// the fault phase and heal at its end, and returns the records and the phase
// boundaries (µs).
func (f *fleet) run(t *testing.T, faultFor time.Duration, inject, heal func()) ([]record, [phases + 1]int64) {
	t.Helper()
	var bounds [phases + 1]int64
	durations := [phases]time.Duration{fleetWindow, fleetWindow, faultFor, 2 * fleetWindow}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu   sync.Mutex
		recs []record
		wg   sync.WaitGroup
	)
	client := func(alg ratelimit.Algorithm, key string, abusive bool, every time.Duration) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(uint64(len(key)), uint64(every)))
		p := fleetPolicy(alg)
		for ctx.Err() == nil {
			i := rng.IntN(instances)
			send := time.Now().UnixMicro()
			d, err := f.limiters[i].Decide(ctx, ratelimit.Request{Policy: p, Key: key})
			recv := time.Now().UnixMicro()
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("%s: %v", key, err)
				}
				return
			}
			mu.Lock()
			recs = append(recs, record{alg: alg, key: key, abusive: abusive, send: send, recv: recv, allowed: d.Allowed, mode: d.Mode, instance: i})
			mu.Unlock()
			// Jittered pacing: ±50% around the mean interval.
			time.Sleep(every/2 + time.Duration(rng.Int64N(int64(every))))
		}
	}
	for _, alg := range contract.Algorithms {
		wg.Add(2)
		// Polite at 40% of the quota, abusive at twice it.
		go client(alg, "polite-"+string(alg), false, fleetWindow*10/(4*fleetLimit))
		go client(alg, "abusive-"+string(alg), true, fleetWindow/(2*fleetLimit))
	}
	start := time.Now()
	bounds[0] = start.UnixMicro()
	at := start
	for ph := range phases {
		if ph == fault {
			inject()
		}
		at = at.Add(durations[ph])
		time.Sleep(time.Until(at))
		if ph == fault {
			heal()
		}
		bounds[ph+1] = time.Now().UnixMicro()
	}
	cancel()
	wg.Wait()
	return recs, bounds
}

func phaseOf(bounds [phases + 1]int64, t int64) phase {
	for ph := phases - 1; ph > 0; ph-- {
		if t >= bounds[ph] {
			return ph
		}
	}
	return warmup
}

// overAdmission returns, per phase, the contract's over-admission ratio for
// one key's records: what is certain under the send/receive bracket, divided
// by the quota, attributed to the phase of the last request received.
func overAdmission(p ratelimit.Policy, recs []record, bounds [phases + 1]int64) [phases]float64 {
	var adm []record
	for _, r := range recs {
		if r.allowed {
			adm = append(adm, r)
		}
	}
	slices.SortFunc(adm, func(a, b record) int { return int(a.send - b.send) })
	var worst [phases]float64
	w, limit := p.Window.Microseconds(), float64(p.Limit)
	note := func(lastRecv int64, ratio float64) {
		if ph := phaseOf(bounds, lastRecv); ratio > worst[ph] {
			worst[ph] = ratio
		}
	}
	switch p.Algorithm {
	case ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter:
		for i := range adm {
			lo, hi := adm[i].send, adm[i].send+w // a window starting at send_i
			if p.Algorithm == ratelimit.SlidingWindowCounter {
				lo = adm[i].send - adm[i].send%w // the aligned window holding send_i
				hi = lo + w
			}
			n, last := 0, int64(0)
			for _, r := range adm {
				if r.send >= lo && r.recv < hi {
					n++
					last = max(last, r.recv)
				}
			}
			note(last, float64(n)/limit)
		}
	default:
		capacity, rate := float64(p.Capacity()), float64(p.Limit)/float64(w)
		for i := range adm {
			last := int64(0)
			for j := i; j < len(adm); j++ {
				last = max(last, adm[j].recv)
				n := float64(j - i + 1)
				v := 1 + (n-capacity-rate*float64(last-adm[i].send))/capacity
				note(last, v)
			}
		}
	}
	return worst
}

// goodput returns, per phase, the key's admitted count divided by what an
// ideal single limiter admits when fed the same requests at their send time.
func goodput(p ratelimit.Policy, recs []record, bounds [phases + 1]int64) [phases]float64 {
	var now int64
	ideal := memstore.New(memstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
	sorted := slices.Clone(recs)
	slices.SortFunc(sorted, func(a, b record) int { return int(a.send - b.send) })
	var got, want [phases]float64
	for _, r := range sorted {
		now = r.send
		d, _ := ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: r.key})
		ph := phaseOf(bounds, r.recv)
		if d.Allowed {
			want[ph]++
		}
		if r.allowed {
			got[ph]++
		}
	}
	var out [phases]float64
	for ph := range out {
		out[ph] = math.Inf(1)
		if want[ph] > 0 {
			out[ph] = got[ph] / want[ph]
		}
	}
	return out
}

// check asserts the invariants for the judged phases.
func check(t *testing.T, recs []record, bounds [phases + 1]int64, judged []phase) {
	t.Helper()
	for _, alg := range contract.Algorithms {
		p := fleetPolicy(alg)
		var polite, abusive []record
		for _, r := range recs {
			if r.alg != alg {
				continue
			}
			if r.abusive {
				abusive = append(abusive, r)
			} else {
				polite = append(polite, r)
			}
		}
		over, good := overAdmission(p, abusive, bounds), goodput(p, abusive, bounds)
		var politeN, politeLimited [phases]int
		for _, r := range polite {
			ph := phaseOf(bounds, r.recv)
			politeN[ph]++
			if !r.allowed {
				politeLimited[ph]++
			}
		}
		for _, ph := range judged {
			overBound, goodBound, politeBound := 1.0, 0.9, 0.0
			if ph == fault || ph == recovery {
				overBound, goodBound, politeBound = 1.10, 0.70, 0.01
			}
			share := float64(politeLimited[ph]) / float64(max(1, politeN[ph]))
			t.Logf("%-22s %-8s over_admission %.3f  goodput %.2f  polite_limited %d/%d", alg, phaseNames[ph], over[ph], good[ph], politeLimited[ph], politeN[ph])
			if over[ph] > overBound+1e-9 {
				t.Errorf("%s %s: over-admission %.3f > %.2f", alg, phaseNames[ph], over[ph], overBound)
			}
			if good[ph] < goodBound {
				t.Errorf("%s %s: goodput %.2f < %.2f", alg, phaseNames[ph], good[ph], goodBound)
			}
			if share > politeBound {
				t.Errorf("%s %s: %d of %d polite requests limited", alg, phaseNames[ph], politeLimited[ph], politeN[ph])
			}
		}
	}
}

func modesIn(recs []record, bounds [phases + 1]int64, ph phase, instance int) map[ratelimit.Mode]int {
	m := map[ratelimit.Mode]int{}
	for _, r := range recs {
		if phaseOf(bounds, r.recv) == ph && (instance < 0 || r.instance == instance) {
			m[r.mode]++
		}
	}
	return m
}

func TestFleetFaults(t *testing.T) {
	scenarios := []struct {
		name          string
		inject, heal  func(f *fleet, t *testing.T)
		localInstance int // -1: all
		// staysClosed: the fault is a slow store, not a dead one; the
		// breaker need not open.
		staysClosed bool
		faultFor    time.Duration // 0: one window
	}{
		{"redis-kill", func(f *fleet, t *testing.T) { f.srv.Kill() }, func(f *fleet, t *testing.T) { f.srv.Restart(t) }, -1, false, 0},
		{"redis-pause", func(f *fleet, t *testing.T) { f.srv.Stop() }, func(f *fleet, t *testing.T) { f.srv.Cont() }, -1, false, 0},
		{"redis-latency", func(f *fleet, t *testing.T) {
			for _, p := range f.proxies {
				p.Latency(300 * time.Millisecond)
			}
		}, func(f *fleet, t *testing.T) {
			for _, p := range f.proxies {
				p.ClearToxics()
			}
		}, -1, false, 0},
		{"partition-one", func(f *fleet, t *testing.T) { f.proxies[0].Disable() }, func(f *fleet, t *testing.T) { f.proxies[0].Enable() }, 0, false, 0},
		// Every reply delayed at random across the timeout (0.4-1.2 of
		// it): some calls answer in time, some time out after Redis
		// applied them.
		{"redis-slow", func(f *fleet, t *testing.T) {
			for _, p := range f.proxies {
				p.LatencyJitter(fleetTimeout*4/10, fleetTimeout*8/10)
			}
		}, func(f *fleet, t *testing.T) {
			for _, p := range f.proxies {
				p.ClearToxics()
			}
		}, -1, true, 3 * fleetWindow},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			f := startFleet(t)
			var opensBefore [instances]uint64
			faultFor := sc.faultFor
			if faultFor == 0 {
				faultFor = fleetWindow
			}
			recs, bounds := f.run(t, faultFor, func() {
				for i, l := range f.limiters {
					opensBefore[i] = l.Status().Opens
				}
				sc.inject(f, t)
			}, func() { sc.heal(f, t) })
			if testing.Verbose() {
				timeline(t, recs, bounds)
			}
			check(t, recs, bounds, []phase{healthy, fault, recovery})
			reconcile(t, f)
			if m := modesIn(recs, bounds, healthy, -1); m[ratelimit.ModeLocal]*10 > m[ratelimit.ModeRedis] {
				t.Errorf("healthy phase decided locally: %v", m)
			}
			if m := modesIn(recs, bounds, fault, sc.localInstance); m[ratelimit.ModeLocal] == 0 {
				t.Errorf("fault phase: modes %v, want local decisions", m)
			}
			for i, l := range f.limiters {
				faulty := sc.localInstance < 0 || i == sc.localInstance
				opened := l.Status().Opens > opensBefore[i]
				if faulty && !opened && !sc.staysClosed {
					t.Errorf("%s: breaker did not open during the fault", l.Status().Instance)
				}
				// An instance the fault did not touch may still trip on a
				// stray slow call on a loaded machine; it must decide in
				// Redis nearly always.
				if m := modesIn(recs, bounds, fault, i); !faulty && m[ratelimit.ModeLocal]*10 > m[ratelimit.ModeRedis] {
					t.Errorf("%s: untouched by the fault but decided locally: %v", l.Status().Instance, m)
				}
				if l.Breaker() != resilient.BreakerClosed {
					t.Errorf("%s: breaker %s after recovery", l.Status().Instance, l.Breaker())
				}
			}
			if m := modesIn(recs, bounds, recovery, -1); m[ratelimit.ModeRedis] == 0 {
				t.Errorf("recovery phase: modes %v, want redis again", m)
			}
		})
	}
}

// reconcile checks every instance's journal: each local grant was replayed,
// found present, or dropped as expired; none is pending, none was refused as
// a duplicate.
func reconcile(t *testing.T, f *fleet) {
	t.Helper()
	for _, l := range f.limiters {
		st := l.Status()
		j := st.Journal
		if j.Granted+j.Reloaded != j.Replayed+j.Present+j.Dropped+j.DuplicateUnits+j.Pending {
			t.Errorf("%s: journal does not reconcile: %+v", st.Instance, j)
		}
		if j.Pending != 0 || j.Duplicates != 0 || j.Overflow != 0 {
			t.Errorf("%s: journal after recovery: %+v, want nothing pending, duplicated or overflowed", st.Instance, j)
		}
		if st.LocalGrants != j.Granted {
			t.Errorf("%s: %d local grants, %d journaled", st.Instance, st.LocalGrants, j.Granted)
		}
		t.Logf("%s: %d local grants: %d replayed, %d present, %d dropped; late %+v; %d opens, %d local decisions of %d",
			st.Instance, j.Granted, j.Replayed, j.Present, j.Dropped, st.Late, st.Opens, st.LocalDecisions, st.LocalDecisions+st.StoreDecisions)
	}
}

// timeline logs, per half second, each abusive key's admissions by mode
// (verbose runs: for looking at what a fault did).
func timeline(t *testing.T, recs []record, bounds [phases + 1]int64) {
	t.Helper()
	const slot = 500_000
	for _, alg := range contract.Algorithms {
		type cell struct{ redis, local, refused int }
		cells := map[int64]*cell{}
		for _, r := range recs {
			if r.alg != alg || !r.abusive {
				continue
			}
			s := (r.recv - bounds[0]) / slot
			c := cells[s]
			if c == nil {
				c = &cell{}
				cells[s] = c
			}
			switch {
			case !r.allowed:
				c.refused++
			case r.mode == ratelimit.ModeRedis:
				c.redis++
			default:
				c.local++
			}
		}
		line := ""
		for s := int64(0); s < (bounds[phases]-bounds[0])/slot; s++ {
			c := cells[s]
			if c == nil {
				c = &cell{}
			}
			if s*slot == bounds[fault]-bounds[0]-(bounds[fault]-bounds[0])%slot || s*slot == bounds[recovery]-bounds[0]-(bounds[recovery]-bounds[0])%slot {
				line += "| "
			}
			line += fmt.Sprintf("%d/%d ", c.redis, c.local)
		}
		t.Logf("%s abusive admitted redis/local per 0.5 s: %s", alg, line)
	}
}
