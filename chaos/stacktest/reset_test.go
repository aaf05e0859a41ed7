//go:build linux

package stacktest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// checkReset: a key spent on the sliding window log through nginx is
// refused by every instance (after the first refusal, from each one's
// cache: without a reset they would refuse it for the whole window). One
// POST /admin/reset on one app's admin port lifts it on all four within a
// heartbeat or so: every instance admits it again.
func checkReset(t *testing.T, s *stack, run string) {
	const route, policy = "/api/sliding-window-log", "sliding-window-log"
	id := "reset-" + run
	for i := 0; ; i++ {
		r := s.mustGet(t, route, withKey(id))
		if r.status == http.StatusTooManyRequests {
			break
		}
		if r.status != http.StatusOK || i > 1000 {
			t.Fatalf("spending the key: request %d answered %d", i, r.status)
		}
	}
	refused := map[string]bool{}
	for range 4 * len(s.info.Apps) {
		r := s.mustGet(t, route, withKey(id))
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("the spent key answered %d by %s", r.status, r.servedBy())
		}
		refused[r.servedBy()] = true
	}
	if len(refused) != len(s.info.Apps) {
		t.Fatalf("refused by %v only, want every instance (nginx round robin)", refused)
	}

	resp, err := s.client.Post(s.info.Apps[0].AdminURL+"/admin/reset", "application/json",
		strings.NewReader(fmt.Sprintf(`{"key": "k:%s", "policy": %q}`, id, policy)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var res struct {
		Scope string `json:"scope"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &res) != nil || res.Scope != "fleet" {
		t.Fatalf("POST /admin/reset: %d %s, want 200 and scope fleet", resp.StatusCode, body)
	}
	admitted := map[string]bool{}
	took, err := waitFor(5*time.Second, func() error {
		r := s.mustGet(t, route, withKey(id))
		if r.status == http.StatusOK {
			admitted[r.servedBy()] = true
		}
		if len(admitted) < len(s.info.Apps) {
			return fmt.Errorf("admitted by %v", admitted)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after the reset: %v", err)
	}
	t.Logf("after one reset on %s every instance admitted the spent key within %v", s.info.Apps[0].Name, took.Round(time.Millisecond))
}
