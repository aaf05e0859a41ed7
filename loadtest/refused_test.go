package loadtest

import (
	"net/http"
	"testing"
)

func TestRefusedBy(t *testing.T) {
	tests := []struct {
		name, header, body, want string
	}{
		{"problem body", `"gcra";r=3;t=2, "per-address";r=0;t=9`, `{"type":"x","status":429,"policy":"per-address"}`, "per-address"},
		{"body wins over the header", `"gcra";r=0;t=2`, `{"policy":"per-address"}`, "per-address"},
		{"header: the item at r=0, not the first", `"gcra";r=3;t=2, "per-address";r=0;t=9`, `not json`, "per-address"},
		{"header: the first at r=0", `"gcra";r=0;t=2, "per-address";r=0;t=9`, ``, "gcra"},
		{"header: none at 0", `"gcra";r=1;t=2`, `{}`, "gcra"},
		{"nothing", ``, ``, ""},
		{"malformed items", `gcra;r=0, "x`, ``, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.header != "" {
				h.Set("RateLimit", tt.header)
			}
			if got := RefusedBy(h, []byte(tt.body)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
