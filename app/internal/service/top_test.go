package service

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestAdminTop (memory mode): three API keys refused 60, 45 and 30 times
// and 100 keys refused once each, interleaved, under a policy of 2 per hour;
// GET /admin/top reports the three first with their exact counts (error 0)
// and the rest within Space-Saving's bound, and a shadow policy on the same
// route, marked, with its own counts. policy= and n= narrow the answer; bad
// values are 400 problems; without the admin token, 401.
func TestAdminTop(t *testing.T) {
	const token = "top-test-token-0123456789abcdef0123"
	file := t.TempDir() + "/policies.json"
	policies := `{"policies": [
	  {"name": "tight", "algorithm": "gcra", "limit": 2, "window": "1h"},
	  {"name": "dry", "algorithm": "gcra", "limit": 1, "window": "1h", "shadow": true},
	  {"name": "ceiling", "algorithm": "gcra", "limit": 100000, "window": "1h", "per": "address"}
	], "routes": [{"pattern": "/api/*", "policies": ["tight", "dry", "ceiling"]}]}`
	if err := os.WriteFile(file, []byte(policies), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, map[string]string{"RL_POLICY_FILE": file, "RL_ADMIN_TOKEN": token})
	api, admin := "http://"+s.PublicAddr()+"/api/x", "http://"+s.AdminAddr()+"/admin/top"

	request := func(id string, want int) {
		t.Helper()
		if resp, body := get(t, api, "X-API-Key", id); resp.StatusCode != want {
			t.Fatalf("%s: %d %s, want %d", id, resp.StatusCode, body, want)
		}
	}
	heavy := []int{60, 45, 30} // refusals by tight
	for h := range heavy {
		request(fmt.Sprintf("heavy-%d", h), 200)
		request(fmt.Sprintf("heavy-%d", h), 200)
	}
	refused := make([]int, len(heavy))
	for r := range 100 {
		for h, want := range heavy {
			if refused[h] < want {
				request(fmt.Sprintf("heavy-%d", h), 429)
				refused[h]++
			}
		}
		single := fmt.Sprintf("single-%03d", r)
		request(single, 200)
		request(single, 200)
		request(single, 429)
	}

	auth := []string{"Authorization", "Bearer " + token}
	read := func(query string) topResponse {
		t.Helper()
		resp, body := get(t, admin+query, auth...)
		var out topResponse
		if err := json.Unmarshal(body, &out); resp.StatusCode != 200 || err != nil {
			t.Fatalf("GET /admin/top%s: %d %s (%v)", query, resp.StatusCode, body, err)
		}
		return out
	}
	now := time.Now()
	got := read("")
	if got.Instance != "test-1" || got.WindowSeconds != 60 ||
		got.Since.Before(now.Add(-61*time.Second)) || got.Since.After(now.Add(-29*time.Second)) {
		t.Errorf("instance %q, window %d s, since %v (now %v)", got.Instance, got.WindowSeconds, got.Since, now)
	}
	if len(got.Policies) != 2 || got.Policies[0].Policy != "dry" || !got.Policies[0].Shadow ||
		got.Policies[1].Policy != "tight" || got.Policies[1].Shadow {
		t.Fatalf("policies %+v, want dry (shadow) and tight: ceiling refused no one", got.Policies)
	}
	for _, c := range []struct {
		policy string
		p      topPolicy
		extra  uint64 // refusals of each identity beyond tight's
	}{
		{"tight", got.Policies[1], 0},
		{"dry", got.Policies[0], 1}, // a quota of 1: every key's second request too
	} {
		top := c.p.Top
		if len(top) != topEntries {
			t.Fatalf("%s: %d identities, want %d", c.policy, len(top), topEntries)
		}
		for h, want := range heavy {
			w := topEntry{Identity: fmt.Sprintf("k:heavy-%d", h), Refused: uint64(want) + c.extra}
			if top[h] != w {
				t.Errorf("%s #%d: %+v, want %+v", c.policy, h+1, top[h], w)
			}
		}
		for _, e := range top[len(heavy):] {
			if truth := 1 + c.extra; !strings.HasPrefix(e.Identity, "k:single-") || e.Refused-e.Error > truth || truth > e.Refused {
				t.Errorf("%s: %+v, want a single key with %d refusals in [refused-error, refused]", c.policy, e, truth)
			}
		}
	}

	narrow := read("?policy=tight&n=3")
	if len(narrow.Policies) != 1 || narrow.Policies[0].Policy != "tight" ||
		fmt.Sprint(narrow.Policies[0].Top) != fmt.Sprint(got.Policies[1].Top[:3]) {
		t.Errorf("policy=tight&n=3: %+v", narrow.Policies)
	}
	if none := read("?policy=ceiling"); len(none.Policies) != 1 || none.Policies[0].Policy != "ceiling" ||
		none.Policies[0].Top == nil || len(none.Policies[0].Top) != 0 {
		t.Errorf("policy=ceiling: %+v, want it with an empty top", none.Policies)
	}

	// format=rows: the same answer, flat, one row per policy and identity.
	resp, body := get(t, admin+"?policy=tight&policy=dry&n=3&format=rows", auth...)
	var rows []topRow
	if err := json.Unmarshal(body, &rows); resp.StatusCode != 200 || err != nil || len(rows) != 6 {
		t.Fatalf("format=rows: %d %s (%v), want 6 rows", resp.StatusCode, body, err)
	}
	for i, r := range rows {
		p := got.Policies[1-i/3] // tight, then dry
		e := p.Top[i%3]
		if w := (topRow{Instance: "test-1", Policy: p.Policy, Shadow: p.Shadow, Identity: e.Identity, Refused: e.Refused, Error: e.Error}); r != w {
			t.Errorf("row %d: %+v, want %+v", i, r, w)
		}
	}

	for _, query := range []string{"?n=0", "?n=17", "?n=x", "?n=", "?policy=", "?policy=a/b", "?policy=tight&policy=%7B", "?polcy=tight", "?format=csv"} {
		resp, body := get(t, admin+query, auth...)
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(body, &p) != nil || p.Status != 400 || !strings.HasSuffix(p.Type, "#invalid-request") || p.Detail == "" {
			t.Errorf("%s: %d %s %s, want a 400 problem", query, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong-0123456789abcdef0123456789ab"}} {
		if resp, _ := get(t, admin, h...); resp.StatusCode != 401 {
			t.Errorf("GET /admin/top with %v: %d, want 401", h, resp.StatusCode)
		}
	}
}
