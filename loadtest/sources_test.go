package loadtest

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestSources: with Sources, the keys' requests come from that many
// loopback addresses, 127.0.0.2 and up, each key from one of them.
func TestSources(t *testing.T) {
	var mu sync.Mutex
	from := map[string]map[string]bool{} // key -> source addresses
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		mu.Lock()
		defer mu.Unlock()
		k := r.Header.Get(HeaderAPIKey)
		if from[k] == nil {
			from[k] = map[string]bool{}
		}
		from[k][host] = true
	}))
	defer srv.Close()
	_, err := Run(context.Background(), Config{
		BaseURL: srv.URL, Routes: []string{"/a"}, Duration: 300 * time.Millisecond, Sources: 3, RunID: "src",
		Policies: map[string]Policy{"/a": {Name: "a", Quota: 100, Window: time.Second}},
	})
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]bool{}
	for k, addrs := range from {
		if len(addrs) != 1 {
			t.Errorf("key %s sent from %v, want one address", k, addrs)
		}
		for a := range addrs {
			all[a] = true
		}
	}
	var got []string
	for a := range all {
		got = append(got, a)
	}
	slices.Sort(got)
	if want := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}; len(from) != 9 || !slices.Equal(got, want) {
		t.Errorf("%d keys from %v, want 9 keys from %v", len(from), got, want)
	}
}
