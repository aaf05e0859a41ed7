package service

import (
	"net/http"
	"testing"
)

// TestNearLimitCounted: on the sliding window log (100 per window, exact),
// the admissions that leave 20 or fewer are counted as near the limit (21
// of the 100), the refusals after them are not, and the per-address
// policy, far from its 1000, counts none.
func TestNearLimitCounted(t *testing.T) {
	s, _ := startServer(t, nil)
	base := "http://" + s.PublicAddr()
	refused := 0
	for range 110 {
		resp, _ := get(t, base+"/api/sliding-window-log", "X-API-Key", "near")
		if resp.StatusCode == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused != 10 {
		t.Fatalf("refused %d of 110, want 10", refused)
	}
	_, body := get(t, "http://"+s.AdminAddr()+"/metrics")
	want := `ratelimit_near_limit_total{mode="memory",policy="sliding-window-log"} 21`
	if got := grep(body, "ratelimit_near_limit_total{"); got != want {
		t.Errorf("near-limit series:\n%s\nwant\n%s", got, want)
	}
}
