package envoyrls_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
)

// TestReloadSetConfigCarriesCounts: SetConfig applies to the next call, and a
// descriptor the new configuration leaves alone keeps its counts (3 of 5
// spent before: exactly 2 more are admitted), while the descriptor whose
// limit changed is judged by the new limit from the next call.
func TestReloadSetConfigCarriesCounts(t *testing.T) {
	load := func(other int) *envoyrls.Config {
		t.Helper()
		dir := t.TempDir()
		body := "domain: d\ndescriptors:\n" +
			"  - key: kept\n    rate_limit: {unit: minute, requests_per_unit: 5}\n" +
			"  - key: other\n    rate_limit: {unit: minute, requests_per_unit: " + string(rune('0'+other)) + "}\n"
		if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := envoyrls.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
	s := startRLS(t, "testdata/integration", clk)
	first, second := load(2), load(1)
	s.svc.SetConfig(first)
	kept, other := limit(5, minute), limit(2, minute)
	for i := range 3 {
		s.call(t, request("d", 1, "kept=x"), response(okCode, ok(kept, uint32(4-i))), 2*time.Minute)
	}
	s.call(t, request("d", 1, "other=x"), response(okCode, ok(other, 1)), 2*time.Minute)

	s.svc.SetConfig(second)
	if s.svc.Config() != second {
		t.Fatal("Config is not the one set")
	}
	other = limit(1, minute)
	// other had 1 of its old 2 spent: under the new limit of 1 it is over.
	s.call(t, request("d", 1, "other=x"), response(overCd, over(other)), 2*time.Minute)
	s.call(t, request("d", 1, "kept=x"), response(okCode, ok(kept, 1)), 2*time.Minute)
	s.call(t, request("d", 1, "kept=x"), response(okCode, ok(kept, 0)), 2*time.Minute)
	s.call(t, request("d", 1, "kept=x"), response(overCd, over(kept)), 2*time.Minute)
}
