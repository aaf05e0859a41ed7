//go:build linux

package stacktest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// policyFileName is the test stack's policy file in its run dir: a copy of
// the service's embedded default, so that every other check sees the demo
// policies, and checkReload can change it.
const policyFileName = "policies.json"

func writeDefaultPolicies(t *testing.T, s *stack) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.root, "app", "internal", "service", "default_policies.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.runDir, policyFileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkPrometheus: the stack's Prometheus (Debian's, started when
// installed) scrapes all four apps' admin ports, and every instance exports
// its policy version.
func checkPrometheus(t *testing.T, s *stack) {
	var info struct {
		PrometheusURL string `json:"prometheus_url"`
	}
	b, err := os.ReadFile(filepath.Join(s.runDir, "stack.json"))
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	if err != nil {
		t.Fatal(err)
	}
	if info.PrometheusURL == "" {
		msg := "stacktest: the stack runs no prometheus (not installed: apt-get install prometheus, or make deps)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// query GETs a Prometheus API path and decodes its data.
	query := func(path string, data any) error {
		resp, err := s.client.Get(info.PrometheusURL + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body struct {
			Status string          `json:"status"`
			Data   json.RawMessage `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if body.Status != "success" {
			return fmt.Errorf("%s: status %q", path, body.Status)
		}
		return json.Unmarshal(body.Data, data)
	}
	// The first scrapes come within the 5 s scrape interval of the start.
	var why string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var targets struct {
			Active []struct {
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := query("/api/v1/targets", &targets); err != nil {
			why = err.Error()
			continue
		}
		var up []string
		for _, tg := range targets.Active {
			if tg.Health == "up" && tg.Labels["job"] == "fleetlimit" {
				up = append(up, tg.Labels["instance"])
			}
		}
		slices.Sort(up)
		if !slices.Equal(up, s.appNames()) {
			why = fmt.Sprintf("targets up: %v, want %v (all: %+v)", up, s.appNames(), targets.Active)
			continue
		}
		var versions struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
			} `json:"result"`
		}
		if err := query("/api/v1/query?query=ratelimit_policy_info", &versions); err != nil {
			why = err.Error()
			continue
		}
		if len(versions.Result) != len(s.appNames()) {
			why = fmt.Sprintf("ratelimit_policy_info: %+v", versions.Result)
			continue
		}
		return
	}
	t.Fatalf("prometheus at %s: %s", info.PrometheusURL, why)
}

// checkReload changes the stack's policy file and runs scripts/reload.sh
// (make reload): every instance reports the new version, and answers from
// each of the four carry the new RateLimit-Policy. A bad file then makes
// reload.sh fail saying why, and the policies stay.
func checkReload(t *testing.T, s *stack) {
	path := filepath.Join(s.runDir, policyFileName)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const from, to = `{"name": "gcra", "algorithm": "gcra", "limit": 100,`, `{"name": "gcra", "algorithm": "gcra", "limit": 60,`
	if !bytes.Contains(orig, []byte(from)) {
		t.Fatalf("%s does not hold %s", path, from)
	}
	changed := bytes.Replace(orig, []byte(from), []byte(to), 1)
	if err := os.WriteFile(path, changed, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := s.script("reload.sh")
	if err != nil {
		t.Fatalf("reload.sh: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), " policy version "); n != 4 || strings.Contains(string(out), "REJECTED") {
		t.Errorf("reload.sh printed:\n%s", out)
	}
	const want = `"gcra";q=60;w=10, "per-address";q=1000;w=10`
	seen := map[string]bool{}
	for i := 0; len(seen) < 4 && i < 40; i++ {
		r := s.mustGet(t, "/api/gcra", withKey(fmt.Sprintf("reload-%d", i)))
		if got := r.header.Get("RateLimit-Policy"); got != want {
			t.Fatalf("%s answered RateLimit-Policy %q after the reload, want %q", r.servedBy(), got, want)
		}
		seen[r.servedBy()] = true
	}
	if len(seen) != 4 {
		t.Errorf("answers came from %v only", seen)
	}

	if err := os.WriteFile(path, bytes.Replace(changed, []byte(to), []byte(`{"name": "gcra", "algorithm": "gcra", "limit": 0,`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = s.script("reload.sh")
	if err == nil || strings.Count(string(out), "REJECTED") != 4 || !strings.Contains(string(out), `policy "gcra": limit must be`) {
		t.Errorf("reload.sh with a bad file: %v\n%s", err, out)
	}
	if r := s.mustGet(t, "/api/gcra", withKey("reload-after-bad")); r.header.Get("RateLimit-Policy") != want || r.status != http.StatusOK {
		t.Errorf("after a bad file: %d, RateLimit-Policy %q, want %q", r.status, r.header.Get("RateLimit-Policy"), want)
	}
}
