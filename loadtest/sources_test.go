package loadtest

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// sourcesOf runs a short load with sources against base (a server that
// records the source addresses, in from) and returns the keys' count and
// the distinct addresses, sorted; every key must send from one address.
func sourcesOf(t *testing.T, sources int, base func(*httptest.Server) string) (int, []string) {
	t.Helper()
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
		BaseURL: base(srv), Routes: []string{"/a"}, Duration: 300 * time.Millisecond, Sources: sources, RunID: "src",
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
	return len(from), got
}

func serverURL(s *httptest.Server) string { return s.URL }

// TestSources: with Sources, the keys' requests come from that many
// loopback addresses, 127.0.0.2 and up, each key from one of them.
func TestSources(t *testing.T) {
	keys, got := sourcesOf(t, 3, serverURL)
	if want := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}; keys != 9 || !slices.Equal(got, want) {
		t.Errorf("%d keys from %v, want 9 keys from %v", keys, got, want)
	}
}

// TestSourcePerKey: the default of the loadtest command sends each key
// from an address of its own against a loopback target, named by address
// or as localhost.
func TestSourcePerKey(t *testing.T) {
	for name, base := range map[string]func(*httptest.Server) string{
		"127.0.0.1": serverURL,
		"localhost": func(s *httptest.Server) string { return strings.Replace(s.URL, "127.0.0.1", "localhost", 1) },
	} {
		t.Run(name, func(t *testing.T) {
			keys, got := sourcesOf(t, SourcePerKey, base)
			if keys != 9 || len(got) != 9 || got[0] == "127.0.0.1" {
				t.Errorf("%d keys from %v, want 9 keys from 9 addresses, 127.0.0.2 and up", keys, got)
			}
		})
	}
}
