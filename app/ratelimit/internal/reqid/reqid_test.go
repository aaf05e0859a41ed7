package reqid

import (
	"regexp"
	"strings"
	"testing"
)

// TestIDsAreUniqueAndValid: a Minter's ids differ from each other and from
// another Minter's with the same prefix (a restarted instance), Random's
// are 32 hex digits, and all hold only request-id bytes.
func TestIDsAreUniqueAndValid(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	seen := map[string]bool{}
	a, b := New("app1-"), New("app1-")
	for range 1000 {
		for _, id := range []string{a.Next(), b.Next(), New("").Next()} {
			if seen[id] {
				t.Fatalf("id %q minted twice", id)
			}
			seen[id] = true
			if !valid.MatchString(id) {
				t.Fatalf("id %q is not a valid request id", id)
			}
		}
	}
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	if r1, r2 := Random(), Random(); !hex32.MatchString(r1) || r1 == r2 {
		t.Fatalf("Random: %q, %q; want two different 32-hex-digit ids", r1, r2)
	}
}

// TestShort: an id shorter than ShortLen is its own short form; a longer
// one becomes ShortLen base64url bytes, the same for the same id, and
// distinct ids (nginx's 32 hex digits, minted ids) stay distinct.
func TestShort(t *testing.T) {
	for _, id := range []string{"", "a", "0123456789"} {
		if got := Short(id); got != id || !IsShort(id, id) {
			t.Errorf("Short(%q) = %q, want it unchanged", id, got)
		}
	}
	m := New("app1-")
	seen := map[string]string{}
	for i := range 100_000 {
		id := Random()
		if i%2 == 1 {
			id = m.Next()
		}
		s := Short(id)
		if len(s) != ShortLen || strings.Trim(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			t.Fatalf("Short(%q) = %q, want %d base64url bytes", id, s, ShortLen)
		}
		if s != Short(id) || !IsShort(id, s) || IsShort(id, s[:ShortLen-1]+"!") {
			t.Fatalf("Short(%q) is not stable, or IsShort does not match it", id)
		}
		if o, ok := seen[s]; ok && o != id {
			t.Fatalf("Short(%q) = Short(%q) = %q", id, o, s)
		}
		seen[s] = id
	}
}

// TestIsShortAllocatesNothing: matching a request against a resend hint,
// on the path of cached refusals, allocates nothing.
func TestIsShortAllocatesNothing(t *testing.T) {
	id := Random()
	short := Short(id)
	if n := testing.AllocsPerRun(100, func() { _ = IsShort(id, short) }); n != 0 {
		t.Errorf("IsShort: %v allocations, want 0", n)
	}
}
