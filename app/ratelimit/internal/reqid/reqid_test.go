package reqid

import (
	"regexp"
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
