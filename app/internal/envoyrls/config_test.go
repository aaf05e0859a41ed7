package envoyrls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// TestLookup: the descriptor a request's entries match, as envoyproxy/
// ratelimit's configuration tests have it (their basic and wildcard
// configurations, in testdata/lookup).
func TestLookup(t *testing.T) {
	cfg, err := Load("testdata/lookup")
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		rpu       uint32
		unit      pb.RateLimitResponse_RateLimit_Unit
		name      string
		unlimited bool
	}
	none := (*want)(nil)
	perSecond := func(n uint32) *want { return &want{rpu: n, unit: pb.RateLimitResponse_RateLimit_SECOND} }
	perMinute := func(n uint32) *want { return &want{rpu: n, unit: pb.RateLimitResponse_RateLimit_MINUTE} }
	cases := []struct {
		domain  string
		entries string // "k=v,k=v"
		want    *want
	}{
		{"foo_domain", "key1=value1", none},
		{"test-domain", "", none},
		{"test-domain", "key1=something", none},
		{"test-domain", "key1=value1", none},
		{"test-domain", "key2=value2,subkey=subvalue", none},
		{"test-domain", "key5=value5,subkey5=subvalue", none},
		{"test-domain", "key1=value1,subkey1=something", perSecond(5)},
		{"test-domain", "key1=value1,subkey1=subvalue1", perSecond(10)},
		{"test-domain", "key1=value1,subkey1=subvalue1,more=x", none},
		{"test-domain", "key2=something", perMinute(20)},
		{"test-domain", "key2=value2", perMinute(30)},
		{"test-domain", "key2=value3", none},
		{"test-domain", "key3=foo", &want{rpu: 1, unit: pb.RateLimitResponse_RateLimit_HOUR}},
		{"test-domain", "key4=foo", &want{rpu: 1, unit: pb.RateLimitResponse_RateLimit_DAY, name: "key4_rate_limit"}},
		{"test-domain", "key5=value5", &want{rpu: 15, unit: pb.RateLimitResponse_RateLimit_DAY}},
		{"test-domain", "key5=value5,subkey5=subvalue5", &want{rpu: 25, unit: pb.RateLimitResponse_RateLimit_DAY}},
		{"test-domain", "key6=foo", &want{unlimited: true}},
		{"test-domain", "wild=foo", perMinute(21)},
		{"test-domain", "wild=foo1", perMinute(21)},
		{"test-domain", "wild=bar", none},
		{"test-domain", "midWild=barb", perMinute(22)},
		{"test-domain", "midWild=bar-any-b", perMinute(22)},
		{"test-domain", "midWild=barbc", none},
		{"test-domain", "multiWild=foo1bar2baz", perMinute(11)},
		{"test-domain", "multiWild=foobarbaz", perMinute(11)},
		{"test-domain", "multiWild=foobaz", none},
		{"test-domain", "multiWild=foo1baz2bar", none},
		{"test-domain", "nestedWild=val1,wild=goo2", perMinute(23)},
		{"test-domain", "nestedWild=val1,wild=foo", none},
	}
	for _, c := range cases {
		t.Run(c.domain+"/"+c.entries, func(t *testing.T) {
			var entries []entry
			if c.entries != "" {
				for kv := range strings.SplitSeq(c.entries, ",") {
					k, v, _ := strings.Cut(kv, "=")
					entries = append(entries, entry{k, v})
				}
			}
			l, _ := cfg.lookup(c.domain, entries)
			switch {
			case c.want == nil && l == nil:
			case c.want == nil:
				t.Fatalf("limit %+v, want none", l)
			case l == nil:
				t.Fatalf("no limit, want %+v", c.want)
			case c.want.unlimited:
				if !l.Unlimited {
					t.Fatalf("limit %+v, want unlimited", l)
				}
			default:
				if l.Unlimited || l.RateLimit.GetRequestsPerUnit() != c.want.rpu || l.RateLimit.GetUnit() != c.want.unit || l.Name != c.want.name {
					t.Fatalf("limit %v %q, want %+v", l.RateLimit, l.Name, c.want)
				}
			}
		})
	}
}

// TestPolicies: the policy each limited descriptor is decided with: the
// default algorithm, our keys, and names derived from the path.
func TestPolicies(t *testing.T) {
	cfg, err := Parse([]string{"p.yaml"}, [][]byte{[]byte(`
domain: shop
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: burst
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 100, algorithm: gcra, burst: 150, failure_mode: closed}
  - key: path
    value: /checkout*
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding-window-log}
`)})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		entries []entry
		want    ratelimit.Policy
	}{
		{[]entry{{"client", "a"}}, ratelimit.Policy{Name: "shop.client", Algorithm: ratelimit.SlidingWindowCounter, Limit: 10, Window: time.Second}},
		{[]entry{{"burst", "a"}}, ratelimit.Policy{Name: "shop.burst", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second,
			Burst: 150, FailureMode: ratelimit.ModeClosed}},
		{[]entry{{"path", "/checkout/1"}}, ratelimit.Policy{Name: policyName("shop.path_/checkout*"), Algorithm: ratelimit.SlidingWindowLog, Limit: 5, Window: time.Minute}},
	}
	for _, c := range cases {
		l, _ := cfg.lookup("shop", c.entries)
		if l == nil || l.Policy != c.want {
			t.Errorf("%v: %+v, want policy %+v", c.entries, l, c.want)
		}
	}
	if n := policyName("shop.path_/checkout*"); !strings.HasPrefix(n, "rls-") || ratelimit.ValidateName(n) != nil {
		t.Errorf("policy name %q of a path that is no valid name", n)
	}
	if l, _ := cfg.lookup("shop", []entry{{"burst", "a"}}); l.RateLimit.GetUnitMultiplier().GetValue() != 10 {
		t.Errorf("current_limit %v: want the unit multiplier 10", l.RateLimit)
	}
}

// TestConfigErrors: every error names the file, and the line where there
// is one; the cases of envoyproxy/ratelimit's configuration tests and ours.
func TestConfigErrors(t *testing.T) {
	const head = "domain: test-domain\ndescriptors:\n"
	cases := []struct {
		name, yaml, want string
	}{
		{"empty file", "", "f.yaml: config file cannot have empty domain"},
		{"empty domain", "descriptors:\n", "f.yaml:1: config file cannot have empty domain"},
		{"bad yaml", "'''\n", "f.yaml: yaml: line 2: found unexpected end of stream"},
		{"two documents", "domain: a\n---\ndomain: b\n", "f.yaml:2: more than one YAML document"},
		{"not a mapping", "- a\n", "f.yaml:1: the file must be a mapping"},
		{"non-string key", "0.25: test-domain\n", "f.yaml:1: config error, key is not of type string: 0.25"},
		{"unknown top key", "domain: d\nratelimits: []\n", "f.yaml:2: config error, unknown key 'ratelimits'"},
		{"non-map list", head + "  - a\n  - b\n", "f.yaml:3: config error, yaml file contains list of type other than map: a"},
		{"empty key", head + "  - value: value1\n", "f.yaml:3: descriptor has empty key"},
		{"duplicate key", head + "  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
			"f.yaml:5: duplicate descriptor composite key 'test-domain.key1_value1'"},
		{"misspelled rate_limit", head + "  - key: key1\n    ratelimit:\n      unit: day\n",
			"f.yaml:4: config error, unknown key 'ratelimit'"},
		{"misspelled requests_per_unit", head + "  - key: key1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			"f.yaml:6: config error, unknown key 'requestsperunit'"},
		{"key given twice", head + "  - key: key1\n    key: key2\n", "f.yaml:4: key 'key' given twice"},
		{"bad unit", head + "  - key: key1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
			"f.yaml:5: invalid rate limit unit 'foo'"},
		{"no unit", head + "  - key: key1\n    rate_limit:\n      requests_per_unit: 5\n", "f.yaml:5: invalid rate limit unit ''"},
		{"unlimited with unit", head + "  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n",
			"f.yaml:5: should not specify rate limit unit when unlimited"},
		{"replaces itself", head + "  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n      requests_per_unit: 5\n",
			"f.yaml:7: replaces should not contain name of same descriptor"},
		{"empty replaces", head + "  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n",
			"f.yaml:7: should not have an empty replaces entry"},
		{"not supported", head + "  - key: files\n    value: files/*\n    share_threshold: true\n",
			"f.yaml:5: key 'share_threshold' of envoyproxy/ratelimit is not supported by fleetlimit"},
		{"negative rate", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			"f.yaml:4: requests_per_unit must be an integer from 0 to 4294967295, got \"-1\""},
		{"rate not a number", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: lots}\n",
			"f.yaml:4: requests_per_unit must be an integer"},
		{"shadow_mode not a bool", head + "  - key: k\n    shadow_mode: yes please\n", "f.yaml:4: shadow_mode must be true or false"},
		{"a year is too long", head + "  - key: k\n    rate_limit: {unit: year, requests_per_unit: 5}\n",
			"f.yaml:4: window must be between 1ms and 744h0m0s, got 8760h0m0s"},
		{"too many requests per window", head + "  - key: k\n    rate_limit: {unit: month, requests_per_unit: 100000000}\n",
			"f.yaml:4: window limit × window is too large"},
		{"unknown algorithm", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: leaky_bucket}\n",
			"f.yaml:4: algorithm must be token_bucket, sliding_window_log, sliding_window_counter or gcra, got \"leaky_bucket\""},
		{"unknown failure mode", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, failure_mode: retry}\n",
			"f.yaml:4: failure_mode must be fallback, open or closed, got \"retry\""},
		{"burst of a window algorithm", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 9}\n",
			"f.yaml:4: burst applies only to token_bucket and gcra"},
		{"our key on an unlimited one", head + "  - key: k\n    rate_limit: {unlimited: true, algorithm: gcra}\n",
			"f.yaml:4: algorithm has no meaning for an unlimited descriptor"},
		{"names that collide", head + "  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
			"f.yaml:7: the policy name test-domain.a_b derived from test-domain.a_b is also used in f.yaml"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]string{"f.yaml"}, [][]byte{[]byte(c.yaml)})
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("error %v, want one starting %q", err, c.want)
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: one\n")
	write("b.yml", "domain: two\n")
	write(".hidden.yaml", "not: valid\n")
	write("notes.txt", "not: yaml\n")
	cfg, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Domains(), ","); got != "one,two" {
		t.Fatalf("domains %s, want one,two", got)
	}
	write("c.yaml", "domain: one\n")
	if _, err := Load(dir); err == nil || err.Error() != "c.yaml: duplicate domain 'one' (also in a.yaml)" {
		t.Fatalf("error %v, want the duplicate domain named with both files", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing directory loaded")
	}
}

// TestShippedConfigurations: the example the demo stacks load, and the
// chaos suite's, which keeps to the contract (a 10 s window, a capacity of
// at least 100).
func TestShippedConfigurations(t *testing.T) {
	if _, err := Load("../../../envoy/ratelimit"); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load("../../../chaos/rls")
	if err != nil {
		t.Fatal(err)
	}
	l, _ := cfg.lookup("chaos", []entry{{"gcra", "client-1"}})
	if l == nil || l.Policy.Name != "chaos.gcra" || l.Policy.Window != 10*time.Second || l.Policy.Capacity() < 100 {
		t.Fatalf("chaos limit %+v, want chaos.gcra with a 10 s window and a capacity of at least 100", l)
	}
}

// TestLoadRefusesEmptyDirectory: a directory with no configuration file
// would load as no domain and answer OK to everything; Load refuses it,
// naming the directory.
func TestLoadRefusesEmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{".hidden.yaml": "domain: one\n", "notes.txt": "domain: two\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	if cfg, err := Load(dir); err == nil {
		t.Fatalf("a directory without a configuration file loaded (domains %v)", cfg.Domains())
	} else if !strings.HasPrefix(err.Error(), dir+": no configuration file") {
		t.Fatalf("error %v, want one naming %s", err, dir)
	}
}
