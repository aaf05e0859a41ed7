package redisstore

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// TestSlot checks the CRC16 against Redis' own CLUSTER KEYSLOT values.
func TestSlot(t *testing.T) {
	for tag, want := range map[string]int{"foo": 12182, "somekey": 11058, "123456789": 0x31C3 % slotCount} {
		if got := slot(tag); got != want {
			t.Errorf("slot(%q) = %d, want %d", tag, got, want)
		}
	}
}

// TestRestoreScope: only keys in a range whose generation changed are put
// back; a plain (single Redis) generation puts back every key.
func TestRestoreScope(t *testing.T) {
	l := New(nil)
	old := "0-5460=a,5461-10922=b,10923-16383=c"
	scope := l.RestoreScope(old, "0-5460=a,5461-10922=B,10923-16383=c")
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
	resharded := l.RestoreScope(old, "0-8000=a,8001-16383=z")
	for i := range 300 {
		if resharded(ratelimit.Policy{}, [32]byte{byte(i), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(i), byte(i * 7)}) {
			t.Fatal("after a resharding, a new range was taken as lost")
		}
	}
	if !New(nil).RestoreScope("gen-1", "gen-2")(ratelimit.Policy{}, [32]byte{}) {
		t.Fatal("a single Redis' new generation must put back every key")
	}
}
