package service

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDebugClock: /debug/clock exists only with RL_DEBUG_CLOCK=true, and
// moves the instance's wall clock by the offset posted.
func TestDebugClock(t *testing.T) {
	s, _ := startServer(t, nil)
	if resp, _ := get(t, "http://"+s.AdminAddr()+"/debug/clock"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("without RL_DEBUG_CLOCK: %d, want 404", resp.StatusCode)
	}
	s, _ = startServer(t, map[string]string{"RL_DEBUG_CLOCK": "true"})
	url := "http://" + s.AdminAddr() + "/debug/clock"
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"offset": "10s"}`))
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Offset, Now string }
	err = json.NewDecoder(resp.Body).Decode(&got)
	_ = resp.Body.Close()
	now, perr := time.Parse(time.RFC3339Nano, got.Now)
	if err != nil || perr != nil || resp.StatusCode != 200 || got.Offset != "10s" || time.Until(now) < 9*time.Second {
		t.Fatalf("POST: %d %+v (%v %v), want the clock 10 s ahead", resp.StatusCode, got, err, perr)
	}
	if time.Until(s.clock.Now()) < 9*time.Second {
		t.Fatal("the service's clock did not move")
	}
	resp, err = http.Post(url, "application/json", strings.NewReader(`{"offset": "soon"}`))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a bad offset: %v %v, want 400", resp.StatusCode, err)
	}
	_ = resp.Body.Close()
}
