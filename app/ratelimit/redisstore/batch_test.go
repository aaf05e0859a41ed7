package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// mixedRound is the requests of one round of the batch equivalence tests:
// every algorithm, a few keys each (several requests of one key in a
// round, so order matters), costs above 1, read-only requests, weights
// that hold back part of the limit, and resends of ids admitted before (in
// this round or the one before), at limits small enough to refuse.
func mixedRound(round int) []contract.Request {
	var reqs []contract.Request
	for i, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "mix-" + string(alg), Algorithm: alg, Limit: 6, Window: time.Minute, Burst: 2}
		if alg == ratelimit.SlidingWindowLog || alg == ratelimit.SlidingWindowCounter {
			p.Burst = 0
		}
		for j := range 9 {
			r := contract.Request{Request: ratelimit.Request{Policy: p, Key: fmt.Sprint("id-", (i+j)%3), ID: fmt.Sprint("r", round, "-", i, "-", j)}}
			switch j % 5 {
			case 1:
				r.Cost = 2
			case 2:
				r.ReadOnly, r.ID = true, ""
			case 3:
				r.Weight = contract.Weight{Num: 4, Den: 3}
			case 4:
				r.ID = fmt.Sprint("r", max(round-1, 0), "-", i, "-", j-4) // a resend
			}
			reqs = append(reqs, r)
		}
	}
	return reqs
}

// decideOneByOne decides reqs with l, one call each, in order.
func decideOneByOne(l *redisstore.Store, reqs []contract.Request) ([]contract.Decision, []error) {
	ds, errs := make([]contract.Decision, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		ds[i], errs[i] = l.DecideWire(context.Background(), r)
	}
	return ds, errs
}

// sameAnswers fails t unless the batch's answers are the one-by-one ones.
func sameAnswers(t *testing.T, round int, reqs []contract.Request, bds, ods []contract.Decision, berrs, oerrs []error) {
	t.Helper()
	for i := range reqs {
		if berrs[i] != nil || oerrs[i] != nil {
			t.Fatalf("round %d, request %d: batch %v, one by one %v", round, i, berrs[i], oerrs[i])
		}
		if bds[i] != ods[i] {
			t.Errorf("round %d, request %d (%s %+v):\n batch      %+v\n one by one %+v", round, i, reqs[i].Policy.Algorithm, reqs[i], bds[i], ods[i])
		}
	}
}

// scriptCalls is how many function calls (FCALL and FCALL_RO) c's server
// ran.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	return commandCalls(t, c, "fcall") + commandCalls(t, c, "fcall_ro")
}

// TestBatchDecidesAsOneByOne: a pipeline of decisions of different keys
// and algorithms goes to a single Redis as one batch script call
// (lua/batch.lua), and each gets the answer, state and resend hint that
// the same decisions made one call each give, in the same order, at the
// same instants.
func TestBatchDecidesAsOneByOne(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	var now int64
	clock := func() time.Time { return time.UnixMicro(now) }
	batched := redisstore.New(c, redisstore.Config{Clock: clock, Prefix: "batch"})
	alone := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Clock: clock, Prefix: "alone"})
	if err := batched.Ping(context.Background()); err != nil { // loads the library, as a start does
		t.Fatal(err)
	}
	seen := map[string]int{}
	for round := range 6 {
		now = vectors.T0 + int64(round)*7_000_000
		reqs := mixedRound(round)
		before := scriptCalls(t, c)
		bds, berrs := batched.Ext().DecideWire(context.Background(), reqs)
		if calls := scriptCalls(t, c) - before; calls != 1 {
			t.Errorf("round %d: %d script calls for a batch of %d, want 1", round, calls, len(reqs))
		}
		ods, oerrs := decideOneByOne(alone, reqs)
		sameAnswers(t, round, reqs, bds, ods, berrs, oerrs)
		for _, d := range bds {
			switch {
			case d.ResendID != "":
				seen["refusal with a resend hint"]++
			case !d.Allowed:
				seen["refusal"]++
			default:
				seen["admission"]++
			}
		}
	}
	if len(seen) != 3 {
		t.Fatalf("the rounds gave %v: the test did not test every kind of answer", seen)
	}
}

// TestBatchDecidesAsOneByOneOnCluster: on a Cluster, a pipeline's
// decisions go as one batch script call per hash slot (the keys of one
// identity share a slot), with the answers the same decisions give one
// call each.
func TestBatchDecidesAsOneByOneOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	var now int64
	clock := func() time.Time { return time.UnixMicro(now) }
	cc := cl.Client()
	batched := redisstore.New(cc, redisstore.Config{Clock: clock, Prefix: "batch"})
	oc := redis.NewClusterClient(cl.ClusterOptions())
	t.Cleanup(func() { _ = oc.Close() })
	alone := redisstore.New(oc, redisstore.Config{Clock: clock, Prefix: "alone"})
	calls := func() int64 {
		var n int64
		for _, s := range cl.Nodes() {
			n += scriptCalls(t, s.Client())
		}
		return n
	}
	if err := batched.Ping(context.Background()); err != nil { // loads the scripts on every node
		t.Fatal(err)
	}
	for round := range 4 {
		now = vectors.T0 + int64(round)*7_000_000
		reqs := mixedRound(round)
		slots := map[int64]bool{}
		for _, r := range reqs {
			s, err := cc.ClusterKeySlot(context.Background(), batched.Key(r.Policy, r.Key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots[s] = true
		}
		before := calls()
		bds, berrs := batched.Ext().DecideWire(context.Background(), reqs)
		if n := calls() - before; n != int64(len(slots)) {
			t.Errorf("round %d: %d script calls for %d requests in %d slots, want one per slot", round, n, len(reqs), len(slots))
		}
		ods, oerrs := decideOneByOne(alone, reqs)
		sameAnswers(t, round, reqs, bds, ods, berrs, oerrs)
	}
}

// TestBatchCorruptKeyFailsAlone: in a batch, a key whose state is not the
// algorithm's fails its own request with ErrBadReply, and the others are
// decided; under a write refusal (OOM) every request of the batch is
// unavailable, not a bad reply.
func TestBatchCorruptKeyFailsAlone(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	var reqs []contract.Request
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "odd", Algorithm: alg, Limit: 5, Window: time.Minute}
		reqs = append(reqs, contract.Request{Request: ratelimit.Request{Policy: p, Key: "corrupt"}}, contract.Request{Request: ratelimit.Request{Policy: p, Key: "fine"}})
		if err := c.RPush(ctx, l.Key(p, "corrupt"), "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	ds, errs := l.Ext().DecideWire(ctx, reqs)
	for i, r := range reqs {
		if r.Key == "corrupt" {
			if !errors.Is(errs[i], ratelimit.ErrBadReply) {
				t.Errorf("%s, corrupt key: %v, want ErrBadReply", r.Policy.Algorithm, errs[i])
			}
			continue
		}
		if errs[i] != nil || !ds[i].Allowed {
			t.Errorf("%s, sound key: %+v %v, want admitted", r.Policy.Algorithm, ds[i], errs[i])
		}
	}
	admin := srv.Client()
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	defer admin.ConfigSet(ctx, "maxmemory", "0")
	var fresh []contract.Request
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.TokenBucket, ratelimit.SlidingWindowCounter} {
		p := ratelimit.Policy{Name: "oom", Algorithm: alg, Limit: 5, Window: time.Minute}
		fresh = append(fresh, contract.Request{Request: ratelimit.Request{Policy: p, Key: "a"}}, contract.Request{Request: ratelimit.Request{Policy: p, Key: "b"}})
	}
	_, errs = l.Ext().DecideWire(ctx, fresh)
	for i, err := range errs {
		if !errors.Is(err, ratelimit.ErrUnavailable) || errors.Is(err, ratelimit.ErrBadReply) {
			t.Errorf("request %d under OOM: %v, want ErrUnavailable", i, err)
		}
	}
}

// TestVectorsInBatches runs the shared vector table through the batch
// script: each step goes in a batch with a request of another key and
// algorithm, and gets the answer the table gives.
func TestVectorsInBatches(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	for i, vc := range vectors.All() {
		t.Run(vc.Name, func(t *testing.T) {
			var now int64
			l := redisstore.New(c, redisstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
			key := fmt.Sprintf("vector-%d", i)
			other := ratelimit.Policy{Name: "other", Algorithm: ratelimit.SlidingWindowLog, Limit: 3, Window: time.Second}
			if vc.Policy.Algorithm == other.Algorithm {
				other.Algorithm = ratelimit.GCRA
			}
			for j, s := range vc.Steps {
				now = vectors.T0 + s.At
				ds, errs := l.Ext().DecideWire(context.Background(), []contract.Request{
					{Request: ratelimit.Request{Policy: other, Key: key, ID: fmt.Sprintf("other-%d", j)}},
					{Request: ratelimit.Request{Policy: vc.Policy, Key: key, Cost: s.Cost, ReadOnly: s.ReadOnly, ID: fmt.Sprintf("req-%d", j)}, Weight: s.Weight},
				})
				if errs[0] != nil || errs[1] != nil {
					t.Fatal(errs)
				}
				want := vc.Decision(s)
				want.Mode = ratelimit.ModeRedis
				if got := withoutHint(ds[1]); got != want {
					t.Errorf("step %d:\n got %+v\nwant %+v", j, got, want)
				}
			}
		})
	}
}

// TestBatchOnOneClusterNode: a single client on a server in Cluster mode
// (a one-node Cluster, say) sees a batch of several hash slots refused
// (CROSSSLOT) before it runs; its requests go again one batch per slot, and
// each is counted once.
func TestBatchOnOneClusterNode(t *testing.T) {
	cl := redistest.StartCluster(t)
	p := ratelimit.Policy{Name: "one-node", Algorithm: ratelimit.GCRA, Limit: 2, Window: time.Minute}
	probe := redisstore.New(cl.Client(), redisstore.Config{})
	node := cl.MasterFor(probe.Key(p, "id-0"))
	c := redis.NewClient(&redis.Options{Addr: node.Addr(), DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	l := redisstore.New(c, redisstore.Config{})
	var reqs []contract.Request
	slots := map[int64]bool{}
	for i := 0; len(reqs) < 6 && i < 1000; i++ {
		id := fmt.Sprint("id-", i)
		if cl.MasterFor(l.Key(p, id)) != node {
			continue
		}
		s, err := cl.Client().ClusterKeySlot(context.Background(), l.Key(p, id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[s] = true
		reqs = append(reqs, contract.Request{Request: ratelimit.Request{Policy: p, Key: id}})
	}
	if len(slots) < 2 {
		t.Fatalf("%d requests in %d slots: the test needs several", len(reqs), len(slots))
	}
	for round, want := range []bool{true, true, false} {
		for i := range reqs {
			reqs[i].ID = fmt.Sprint("r", round, "-", i)
		}
		ds, errs := l.Ext().DecideWire(context.Background(), reqs)
		for i := range reqs {
			if errs[i] != nil || ds[i].Allowed != want {
				t.Fatalf("round %d, request %d: %+v %v, want allowed %v", round, i, ds[i], errs[i], want)
			}
		}
	}
}
