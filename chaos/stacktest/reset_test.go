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
// POST /admin/reset on one app's admin port, with the stack's admin token,
// lifts it on all four within a heartbeat or so: every instance admits it
// again. Without the token (or with another) the reset is refused (401) and
// lifts nothing.
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

	reset := func(token string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, s.info.Apps[0].AdminURL+"/admin/reset",
			strings.NewReader(fmt.Sprintf(`{"key": "k:%s", "policy": %q}`, id, policy)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// Without the stack's admin token: refused, and the key stays spent.
	for _, token := range []string{"", stackSecret + "-not-the-admin-token"} {
		resp := reset(token)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("POST /admin/reset with token %q: %d, want 401", token, resp.StatusCode)
		}
	}
	if r := s.mustGet(t, route, withKey(id)); r.status != http.StatusTooManyRequests {
		t.Fatalf("after refused resets the spent key answered %d by %s, want 429", r.status, r.servedBy())
	}
	resp := reset(stackAdminToken)
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
