package envoyrls

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// configMap lays dir out as the kubelet mounts a ConfigMap: the files in a
// timestamped directory, ..data a symbolic link to it, and each file a
// top-level link through ..data. update writes a new timestamped directory
// and renames a new ..data link over the old one, as an update does.
type configMap struct {
	t   *testing.T
	dir string
	n   int
}

func (m *configMap) update(files map[string]string) {
	m.t.Helper()
	m.n++
	ts := "..2026_12_04_10_00_0" + string(rune('0'+m.n))
	if err := os.Mkdir(filepath.Join(m.dir, ts), 0o755); err != nil {
		m.t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(m.dir, ts, name), []byte(body), 0o644); err != nil {
			m.t.Fatal(err)
		}
		link := filepath.Join(m.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				m.t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
}

// TestReloadConfigMapLayout: Load reads a ConfigMap's volume once (the top-level
// links, not ..data/ nor the timestamped directory again), and Stamp
// changes when an update swaps ..data, though no top-level entry changed.
func TestReloadConfigMapLayout(t *testing.T) {
	m := &configMap{t: t, dir: t.TempDir()}
	m.update(map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"})
	cfg, err := Load(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	if files := cfg.Files(); len(files) != 1 || files[0] != "a.yaml" {
		t.Fatalf("files %v, want [a.yaml] (read once, through the top-level link)", files)
	}
	before, v := Stamp(m.dir), cfg.Version()
	if Stamp(m.dir) != before {
		t.Fatal("Stamp changed with nothing changed")
	}
	// Same size and, as far as the links show, the same entries.
	m.update(map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 6}\n"})
	if Stamp(m.dir) == before {
		t.Fatal("Stamp missed the ..data swap")
	}
	cfg, err = Load(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := cfg.lookup("a", []entry{{"k", "x"}}); l == nil || l.Policy.Limit != 6 || cfg.Version() == v {
		t.Fatalf("after the swap: limit %+v, version %s (was %s)", l, cfg.Version(), v)
	}
}

// TestReloadStampInPlace: a file written in place, one added and one removed each
// change the stamp; a file Load does not read does not.
func TestReloadStampInPlace(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mtime time.Time) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	write("a.yaml", "domain: a\n", t0)
	s0 := Stamp(dir)
	write("notes.txt", "x", t0)
	write(".hidden.yaml", "x", t0)
	if Stamp(dir) != s0 {
		t.Fatal("Stamp changed for files Load does not read")
	}
	write("a.yaml", "domain: b\n", t0.Add(time.Second))
	s1 := Stamp(dir)
	if s1 == s0 {
		t.Fatal("Stamp missed a write in place (same size, new mtime)")
	}
	write("b.yml", "domain: c\n", t0)
	if Stamp(dir) == s1 {
		t.Fatal("Stamp missed an added file")
	}
	if err := os.Remove(filepath.Join(dir, "b.yml")); err != nil {
		t.Fatal(err)
	}
	if Stamp(dir) != s1 {
		t.Fatal("Stamp after removing the added file differs from before it")
	}
}

// TestReloadPolicyNamesCarryOver: a descriptor configured alike in two loads has
// the same policy (name and fingerprint: the store key of its counts); one
// whose rate changed keeps its name and fingerprint too (its usage is
// judged against the new rate), one whose unit changed keeps its name but
// not its fingerprint (fresh state).
func TestReloadPolicyNamesCarryOver(t *testing.T) {
	parse := func(a, b string) *Config {
		t.Helper()
		cfg, err := Parse([]string{"d.yaml"}, [][]byte{[]byte("domain: d\ndescriptors:\n" +
			"  - key: a\n    rate_limit: {unit: " + a + "}\n" +
			"  - key: b\n    rate_limit: {unit: " + b + "}\n")})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	old := parse("minute, requests_per_unit: 5", "minute, requests_per_unit: 5")
	cur := parse("minute, requests_per_unit: 5", "second, requests_per_unit: 5")
	rate := parse("minute, requests_per_unit: 5", "minute, requests_per_unit: 9")
	get := func(c *Config, key string) *Limit {
		l, _ := c.lookup("d", []entry{{key, "v"}})
		if l == nil {
			t.Fatalf("no limit for %s", key)
		}
		return l
	}
	if o, n := get(old, "a").Policy, get(cur, "a").Policy; o != n || o.Name != "d.a" {
		t.Errorf("unchanged descriptor: policy %+v, then %+v", o, n)
	}
	if o, n := get(old, "b").Policy, get(rate, "b").Policy; !sameState(o, n) || n.Limit != 9 {
		t.Errorf("rate changed: policy %+v, then %+v; want the same name, algorithm and window (the keys keep their state)", o, n)
	}
	if o, n := get(old, "b").Policy, get(cur, "b").Policy; o.Name != n.Name || sameState(o, n) {
		t.Errorf("unit changed: policy %+v, then %+v; want the same name, another window (fresh keys)", o, n)
	}
	if old.Version() == cur.Version() || old.Version() == "" {
		t.Errorf("versions %q and %q, want two different ones", old.Version(), cur.Version())
	}
}

// sameState reports whether the store keeps a key's state across a reload
// from policy a to b: the same name, algorithm and window (redisstore's
// policy fingerprint).
func sameState(a, b ratelimit.Policy) bool {
	return a.Name == b.Name && a.Algorithm == b.Algorithm && a.Window == b.Window
}
