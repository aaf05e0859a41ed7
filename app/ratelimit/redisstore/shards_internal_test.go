package redisstore

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// TestSlot checks the CRC16 against Redis' own CLUSTER KEYSLOT values.
func TestSlot(t *testing.T) {
	for tag, want := range map[string]int{"foo": 12182, "somekey": 11058, "123456789": 0x31C3 % slotCount} {
		if got := slot(tag); got != want {
			t.Errorf("slot(%q) = %d, want %d", tag, got, want)
		}
	}
}

// TestLoss: only keys in a range whose generation changed lost anything; a
// plain (single Redis) generation loses every key; a "lag-" generation is
// recent writes lost, any other a wipe.
func TestLoss(t *testing.T) {
	l := New(nil, Config{})
	old := "0-5460=a,5461-10922=b,10923-16383=c"
	loss := l.loss(old, "0-5460=a,5461-10922=B,10923-16383=lag-c")
	scope := func(p ratelimit.Policy, id store.Identity) bool {
		tag := l.tag(id)
		s := slot(tag[1 : len(tag)-1])
		want := contract.LossNone
		switch {
		case s >= 5461 && s <= 10922:
			want = contract.LossAll
		case s >= 10923:
			want = contract.LossRecent
		}
		if got := loss(p, id); got != want {
			t.Fatalf("slot %d: loss %v, want %v", s, got, want)
		}
		return want == contract.LossAll
	}
	in, out := 0, 0
	for i := range 300 {
		id := [32]byte{byte(i), byte(i >> 8), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(i), byte(i * 7)}
		tag := l.tag(id)
		s := slot(tag[1 : len(tag)-1])
		if got, want := scope(ratelimit.Policy{}, id), s >= 5461 && s <= 10922; got != want {
			t.Fatalf("slot %d: in scope %v, want %v", s, got, want)
		}
		if s >= 5461 && s <= 10922 {
			in++
		} else {
			out++
		}
	}
	if in == 0 || out == 0 {
		t.Fatalf("%d keys in the changed range and %d outside: the test covers nothing", in, out)
	}
	resharded := l.loss(old, "0-8000=a,8001-16383=z")
	for i := range 300 {
		if resharded(ratelimit.Policy{}, [32]byte{byte(i), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(i), byte(i * 7)}) != contract.LossNone {
			t.Fatal("after a resharding, a new range was taken as lost")
		}
	}
	for _, c := range []struct {
		old, new string
		want     contract.Loss
	}{{"gen-1", "gen-1", contract.LossNone}, {"gen-1", "gen-2", contract.LossAll}, {"gen-1", "lag-2", contract.LossRecent}, {"lag-2", "gen-3", contract.LossAll}} {
		if got := New(nil, Config{}).loss(c.old, c.new)(ratelimit.Policy{}, [32]byte{}); got != c.want {
			t.Errorf("single Redis, %s -> %s: loss %v, want %v", c.old, c.new, got, c.want)
		}
	}
}

// TestFingerprint: a policy's stored state is named by its name, algorithm
// and window; a change of limit, burst or lease keeps the name, so the
// keys keep their usage.
func TestFingerprint(t *testing.T) {
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 10, Window: 5 * time.Second}
	same, other := p, p
	same.Limit, same.Burst, same.Lease = 20, 30, time.Second
	other.Window = time.Second
	if fingerprint(same) != fingerprint(p) || len(fingerprint(p)) != policyIDLen {
		t.Errorf("limit, burst and lease changed the fingerprint %q -> %q", fingerprint(p), fingerprint(same))
	}
	if fingerprint(other) == fingerprint(p) {
		t.Error("a new window kept the fingerprint")
	}
}
