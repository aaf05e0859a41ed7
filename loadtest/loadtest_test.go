package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
)

func TestParsePolicyHeader(t *testing.T) {
	tests := []struct {
		in      string
		want    Policy
		wantErr bool
	}{
		{in: `"token-bucket";q=100;w=10`, want: Policy{Name: "token-bucket", Quota: 100, Window: 10 * time.Second}},
		{in: ` "gcra" ; q=5 ; w=1 `, want: Policy{Name: "gcra", Quota: 5, Window: time.Second}},
		{in: `"a";q=7`, want: Policy{Name: "a", Quota: 7, Window: time.Second}},
		{in: `"a";w=60;q=1000, "b";q=1;w=1`, want: Policy{Name: "a", Quota: 1000, Window: time.Minute}},
		{in: `"a";q=100;w=10;pk=:abc=:`, want: Policy{Name: "a", Quota: 100, Window: 10 * time.Second}},
		{in: ``, wantErr: true},
		{in: `a;q=1;w=1`, wantErr: true},
		{in: `"a;q=1;w=1`, wantErr: true},
		{in: `"a";w=10`, wantErr: true},
		{in: `"a";q=-1;w=10`, wantErr: true},
		{in: `"a";q=1;w=x`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePolicyHeader(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestCheckLoopback(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:8080", "http://localhost:1", "https://[::1]:443/x", "http://127.9.9.9"} {
		if err := CheckLoopback(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, u := range []string{"http://10.0.0.1:8080", "http://example.com", "ftp://127.0.0.1", "http://[::ffff:8.8.8.8]", "::"} {
		if err := CheckLoopback(u); err == nil {
			t.Errorf("%s: accepted", u)
		}
	}
}

// TestAllowTarget: a private address allowed is a target like loopback;
// another private one is not, and no public one can be allowed.
func TestAllowTarget(t *testing.T) {
	for _, a := range []string{"8.8.8.8", "192.0.2.1", "::ffff:1.1.1.1", "2001:db8::1"} {
		if err := AllowTarget(netip.MustParseAddr(a)); err == nil {
			t.Errorf("%s: allowed", a)
		}
	}
	if err := AllowTarget(netip.MustParseAddr("10.255.0.7")); err != nil {
		t.Fatal(err)
	}
	if err := CheckLoopback("http://10.255.0.7:8080"); err != nil {
		t.Errorf("allowed target: %v", err)
	}
	if err := CheckLoopback("http://10.255.0.8:8080"); err == nil {
		t.Error("10.255.0.8: accepted, only 10.255.0.7 was allowed")
	}
	if _, err := DialRLS("10.255.0.8:8090"); err == nil {
		t.Error("rate limit service at 10.255.0.8: accepted")
	}
	if _, err := loopbackDialer().Dial("tcp", "10.255.0.8:9"); err == nil || !strings.Contains(err.Error(), "not a loopback") {
		t.Errorf("dial 10.255.0.8: %v, want a refusal", err)
	}
}

func TestRunRefusesNonLoopback(t *testing.T) {
	_, err := Run(context.Background(), Config{BaseURL: "http://192.0.2.1:80", Duration: time.Second})
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("err = %v, want a loopback refusal", err)
	}
}

func TestKeys(t *testing.T) {
	pol := map[string]Policy{"/api/token-bucket": {Name: "tb", Quota: 100, Window: 10 * time.Second}}
	keys, err := Keys([]string{"/api/token-bucket"}, DefaultMix, nil, pol, "r1")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name     string
		class    Class
		interval time.Duration
	}{
		{"polite-tb-1-r1", Polite, 250 * time.Millisecond}, // 40 per 10 s
		{"polite-tb-2-r1", Polite, 250 * time.Millisecond},
		{"polite-tb-3-r1", Polite, 250 * time.Millisecond},
		{"polite-tb-4-r1", Polite, 250 * time.Millisecond},
		{"abusive-tb-1-r1", Abusive, 50 * time.Millisecond}, // 200 per 10 s
		{"abusive-tb-2-r1", Abusive, 50 * time.Millisecond},
		{"abusive-tb-3-r1", Abusive, 50 * time.Millisecond},
		{"abusive-tb-4-r1", Abusive, 50 * time.Millisecond},
		{"abusive-tb-5-r1", Abusive, 10 * time.Millisecond}, // 1000 per 10 s
	}
	if len(keys) != len(want) {
		t.Fatalf("%d keys, want %d", len(keys), len(want))
	}
	for i, w := range want {
		k := keys[i]
		if k.Name != w.name || k.Class != w.class || k.Interval != w.interval || k.Route != "/api/token-bucket" {
			t.Errorf("key %d = %+v, want %s %s every %v", i, k, w.name, w.class, w.interval)
		}
	}
	pol["/static/"] = Policy{Name: "st", Quota: 100, Window: 10 * time.Second}
	own := []KeySpec{{Class: Abusive, Factor: 2, Count: 2}}
	keys, err = Keys([]string{"/api/token-bucket", "/static/"}, DefaultMix, map[string][]KeySpec{"/static/": own}, pol, "r1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range keys[len(want):] {
		names = append(names, k.Name)
	}
	if len(keys) != len(want)+2 || keys[0].Name != "polite-tb-1-r1" || strings.Join(names, ",") != "abusive-static-1-r1,abusive-static-2-r1" {
		t.Errorf("with a route mix: the keys end %v, want the route's own two", names)
	}
	if _, err := Keys([]string{"/api/gcra"}, DefaultMix, nil, pol, "r1"); err == nil {
		t.Error("a route without a policy was accepted")
	}
}

// TestSchedule: the slots never drift, so a key at 40% of its quota sends
// at most 40 + 1 requests in any window, and the same seed gives the same
// schedule.
func TestSchedule(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	end := start.Add(10 * time.Minute)
	window := 10 * time.Second
	interval := 250 * time.Millisecond
	collect := func(seed uint64) []time.Time {
		var out []time.Time
		for at := range schedule(rand.New(rand.NewPCG(seed, 7)), start, end, interval, 0.8) {
			out = append(out, at)
		}
		return out
	}
	times := collect(42)
	if n, want := len(times), int(end.Sub(start)/interval); n < want-1 || n > want {
		t.Fatalf("%d sends, want about %d", n, want)
	}
	for i := 1; i < len(times); i++ {
		if d := times[i].Sub(times[i-1]); d < time.Duration(0.2*float64(interval)) {
			t.Fatalf("sends %d and %d are %v apart (jitter accumulated?)", i-1, i, d)
		}
	}
	j := 0
	for i := range times {
		for j < len(times) && times[j].Sub(times[i]) < window {
			j++
		}
		if n := j - i; n > 41 {
			t.Fatalf("%d sends within one window from %v", n, times[i].Sub(start))
		}
	}
	again := collect(42)
	for i := range times {
		if !times[i].Equal(again[i]) {
			t.Fatalf("send %d differs between runs with one seed", i)
		}
	}
	if other := collect(43); other[0].Equal(times[0]) && other[1].Equal(times[1]) {
		t.Error("another seed gave the same schedule")
	}
}

// fakeService imitates the stack's answers: a per-key fixed window limiter
// with the policy headers, X-Served-By from four instances in turn,
// X-RateLimit-Mode and X-Request-Id.
type fakeService struct {
	quota int
	mu    sync.Mutex
	seen  map[string]int
	keys  map[string]bool
	n     atomic.Int64
	// check, if set, checks X-API-Key as the service does: a refused key
	// gets 401, a valid one counts under its id.
	check *apikey.Verifier
}

// saw reports whether a request of key reached the handler. It locks: a
// request the client gave up on (its timeout) can still be in the handler.
func (f *fakeService) saw(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.keys[key]
}

func (f *fakeService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.n.Add(1)
	key := r.Header.Get("X-API-Key")
	if f.check != nil {
		id, err := f.check.Check(key)
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		key = id
	}
	name := strings.TrimPrefix(r.URL.Path, "/api/")
	window := time.Now().Unix() // 1 s windows
	f.mu.Lock()
	ck := fmt.Sprintf("%s|%s|%d", r.URL.Path, key, window)
	f.seen[ck]++
	count := f.seen[ck]
	f.keys[key] = true
	f.mu.Unlock()
	h := w.Header()
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=1", name, f.quota))
	h.Set("X-Request-Id", fmt.Sprintf("req-%d", n))
	h.Set("X-Served-By", fmt.Sprintf("app%d", n%4+1))
	h.Set("X-RateLimit-Mode", "redis")
	if count > f.quota {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	_, _ = w.Write([]byte(`{"ok":true}`))
}

func TestRunAgainstFakeService(t *testing.T) {
	svc := &fakeService{quota: 10, seen: map[string]int{}, keys: map[string]bool{}}
	srv := httptest.NewServer(svc)
	defer srv.Close()

	var (
		mu   sync.Mutex
		recs []Record
	)
	res, err := Run(context.Background(), Config{
		BaseURL:  srv.URL,
		RunID:    "t1",
		Seed:     1,
		Duration: time.Second,
		OnRecord: func(r Record) {
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range DefaultRoutes {
		p := res.Policies[r]
		if p.Quota != 10 || p.Window != time.Second || p.Name != strings.TrimPrefix(r, "/api/") {
			t.Errorf("%s: learned %+v", r, p)
		}
	}
	if int64(len(recs)) != res.Sent {
		t.Errorf("%d records, %d sent", len(recs), res.Sent)
	}
	// Per route: 4 x 4/s + 4 x 20/s + 100/s = 196/s, for 1 s. A loaded
	// machine (-race on two cores) may lag behind the schedule: the lower
	// bounds are loose.
	if want := 4 * 196.0; float64(len(recs)) < 0.6*want || float64(len(recs)) > 1.1*want {
		t.Errorf("%d records, want about %.0f", len(recs), want)
	}
	perKey := map[string]int{}
	instances := map[string]bool{}
	transport := 0
	for _, r := range recs {
		perKey[r.Key]++
		if r.Status == 0 && r.Error != "" {
			// A transport error is recorded as such (status 0 and the
			// error): on a machine loaded by -race tests of other
			// packages, a few requests can outlive the 2 s timeout.
			transport++
			continue
		}
		instances[r.Instance] = true
		if r.Status != 200 && r.Status != 429 {
			t.Fatalf("record %+v: unexpected status", r)
		}
		if r.TRecvMS < r.TSendMS || r.LatencyMS < 0 || r.TRecvMS-r.TSendMS-r.LatencyMS > 0.002 {
			t.Fatalf("record %+v: inconsistent times", r)
		}
		if r.RequestID == "" || r.Mode != "redis" || !strings.HasSuffix(r.Key, "-t1") {
			t.Fatalf("record %+v: missing fields", r)
		}
		if (r.Class == Polite) != strings.HasPrefix(r.Key, "polite-") {
			t.Fatalf("record %+v: class and key disagree", r)
		}
	}
	if transport > len(recs)/100 {
		t.Errorf("%d of %d requests failed in transport", transport, len(recs))
	}
	if len(perKey) != 4*9 {
		t.Errorf("%d keys sent, want 36", len(perKey))
	}
	if n := perKey["abusive-gcra-5-t1"]; n < 60 || n > 102 {
		t.Errorf("the 10x key sent %d, want about 100", n)
	}
	if n := perKey["polite-swl-1-t1"]; n < 2 || n > 5 {
		t.Errorf("a polite key sent %d, want about 4", n)
	}
	if len(instances) != 4 {
		t.Errorf("instances %v", instances)
	}
	// The probes are not records, but the service saw them.
	for _, r := range DefaultRoutes {
		if k := "probe-" + ShortRoute(r) + "-t1"; !svc.saw(k) || perKey[k] != 0 {
			t.Errorf("probe %s: seen %v, recorded %d", k, svc.saw(k), perKey[k])
		}
	}
	if res.ByStatus[429] == 0 || res.ByStatus[200] == 0 {
		t.Errorf("statuses %v: want both 200 and 429", res.ByStatus)
	}
}

// TestRunSignsKeys: with a secret, the probes and every key are signed as
// the service checks them, and the records name the keys by their ids.
func TestRunSignsKeys(t *testing.T) {
	const secret = "loadtest-secret-0123456789"
	v, err := apikey.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	svc := &fakeService{quota: 10, seen: map[string]int{}, keys: map[string]bool{}, check: v}
	srv := httptest.NewServer(svc)
	defer srv.Close()
	var recs []Record
	_, err = Run(context.Background(), Config{
		BaseURL: srv.URL, RunID: "s1", Seed: 1, Duration: 300 * time.Millisecond, APIKeySecret: secret,
		OnRecord: func(r Record) { recs = append(recs, r) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 {
		t.Fatal("no records")
	}
	for _, r := range recs {
		if r.Status == http.StatusUnauthorized || !svc.saw(r.Key) {
			t.Fatalf("record %+v: status %d, its key seen by the service: %v", r, r.Status, svc.saw(r.Key))
		}
	}
}

func TestRunBoundedByCount(t *testing.T) {
	svc := &fakeService{quota: 1000, seen: map[string]int{}, keys: map[string]bool{}}
	srv := httptest.NewServer(svc)
	defer srv.Close()
	start := time.Now()
	res, err := Run(context.Background(), Config{
		BaseURL:     srv.URL,
		Routes:      []string{"/api/gcra"},
		Policies:    map[string]Policy{"/api/gcra": {Name: "gcra", Quota: 1000, Window: time.Second}},
		Duration:    time.Minute,
		MaxRequests: 50,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 50 || res.ByStatus[200] != 50 {
		t.Errorf("sent %d, statuses %v; want 50", res.Sent, res.ByStatus)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("took %v: the count bound did not stop the run", time.Since(start))
	}
	if svc.saw("probe-gcra-" + res.RunID) {
		t.Error("probed a route whose policy was given")
	}
}

func TestTransportErrorIsStatusZero(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hj, ok := w.(http.Hijacker)
		if !ok {
			return
		}
		c, _, err := hj.Hijack()
		if err == nil {
			_ = c.Close()
		}
	}))
	defer srv.Close()
	var got []Record
	_, err := Run(context.Background(), Config{
		BaseURL:  srv.URL,
		Routes:   []string{"/api/gcra"},
		Mix:      []KeySpec{{Class: Polite, Factor: 1, Count: 1}},
		Policies: map[string]Policy{"/api/gcra": {Name: "gcra", Quota: 20, Window: time.Second}},
		Duration: 200 * time.Millisecond,
		OnRecord: func(r Record) { got = append(got, r) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("no records")
	}
	for _, r := range got {
		if r.Status != 0 || r.Error == "" {
			t.Errorf("record %+v: want status 0 and an error", r)
		}
	}
}
