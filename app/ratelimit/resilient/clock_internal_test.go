package resilient

import "testing"

// TestOffsetKeepsTheTightest: a reply that took long to wake its caller
// (a loaded host, a shared pipeline's last reader) does not replace an
// offset learned from a short round trip; a store clock that stepped
// (ranges that cannot both hold) replaces it at once; and an old tight
// offset gives way once its aged error exceeds a fresh one's.
func TestOffsetKeepsTheTightest(t *testing.T) {
	var h offsetHolder
	h.offer(storeOffset{us: 1000, errUS: 100, at: 0})
	// 20 ms round trip, offset 9 ms lower: consistent with the held one
	// within their errors, and looser: the held one stays.
	h.offer(storeOffset{us: 1000 - 9000, errUS: 10_000, at: 1000})
	if got := h.load(); got.us != 1000 || got.errUS != 100 {
		t.Fatalf("after a loose sample: %+v, want the tight one kept", got)
	}
	// The store's clock stepped 5 s ahead: the ranges do not overlap.
	h.offer(storeOffset{us: 5_000_000, errUS: 10_000, at: 2000})
	if got := h.load(); got.us != 5_000_000 {
		t.Fatalf("after a step: %+v, want the new offset", got)
	}
	// A tighter sample replaces a looser one.
	h.offer(storeOffset{us: 5_000_100, errUS: 50, at: 3000})
	if got := h.load(); got.us != 5_000_100 || got.errUS != 50 {
		t.Fatalf("after a tighter sample: %+v", got)
	}
	// 10 s later the held one's error has grown to 50 + 10 ms: a fresh
	// 1 ms sample is tighter.
	h.offer(storeOffset{us: 5_000_300, errUS: 1000, at: 3000 + 10_000_000})
	if got := h.load(); got.us != 5_000_300 {
		t.Fatalf("after aging: %+v, want the fresh sample", got)
	}
	if got := h.load().errAt(3000 + 10_000_000 + 2_000_000); got != 1000+2000 {
		t.Fatalf("aged error %d, want %d", got, 3000)
	}
}
