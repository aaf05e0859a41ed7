package stack

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeToxiproxy records the API calls it gets.
type fakeToxiproxy struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeToxiproxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path+" "+string(b))
	f.mu.Unlock()
	switch {
	case r.Method == http.MethodDelete:
		http.NotFound(w, r) // removing a toxic that is not there is fine
	case r.URL.Path == "/status":
		_, _ = w.Write([]byte(`{"instance":"app2"}`))
	default:
		_, _ = w.Write([]byte(`{}`))
	}
}

func testLocal(t *testing.T) (*Local, *fakeToxiproxy) {
	f := &fakeToxiproxy{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	l := NewLocal(t.TempDir(), io.Discard)
	l.info = Info{ProxyAPI: srv.URL, Apps: []App{
		{Name: "app1", Proxy: "app1-redis", AdminURL: srv.URL},
		{Name: "app2", Proxy: "app2-redis", AdminURL: srv.URL + "/"},
	}}
	return l, f
}

func TestLocalToxiproxyCalls(t *testing.T) {
	l, f := testLocal(t)
	ctx := context.Background()
	if err := l.Partition(ctx, "app1", true); err != nil {
		t.Fatal(err)
	}
	if err := l.Partition(ctx, "app1", false); err != nil {
		t.Fatal(err)
	}
	if err := l.Latency(ctx, 300*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.Latency(ctx, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.Partition(ctx, "app9", true); err == nil {
		t.Error("partitioned an unknown app")
	}
	toxic := `{"name":"chaos-latency","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":300,"jitter":0}}`
	want := []string{
		`POST /proxies/app1-redis {"enabled":false}`,
		`POST /proxies/app1-redis {"enabled":true}`,
		`POST /proxies/app1-redis/toxics ` + toxic,
		`POST /proxies/app2-redis/toxics ` + toxic,
		`DELETE /proxies/app1-redis/toxics/chaos-latency `,
		`DELETE /proxies/app2-redis/toxics/chaos-latency `,
	}
	if !slices.Equal(f.calls, want) {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
	b, err := l.Status(ctx, "app2")
	if err != nil || string(b) != `{"instance":"app2"}` {
		t.Errorf("status %s, %v", b, err)
	}
}

func TestCmdline(t *testing.T) {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("no /proc")
	}
	exe, _ := os.Executable()
	if args := cmdline(os.Getpid()); len(args) == 0 || filepath.Base(args[0]) != filepath.Base(exe) {
		t.Errorf("cmdline %q, want this test binary first", args)
	}
}

func TestRedisPassword(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "redis"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "redis", "redis.conf"), []byte("port 6379\nrequirepass \"from-conf\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_PASSWORD", "")
	if got := RedisPassword(root, nil); got != "from-conf" {
		t.Errorf("from the conf: %q", got)
	}
	if got := RedisPassword(root, []string{"redis-server", "x.conf", "--requirepass", "from-args"}); got != "from-args" {
		t.Errorf("from the command line: %q", got)
	}
	t.Setenv("REDIS_PASSWORD", "from-env")
	if got := RedisPassword(root, []string{"--requirepass", "from-args"}); got != "from-env" {
		t.Errorf("from the environment: %q", got)
	}
}

func TestFindRoot(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "chaos", "cmd")
	for _, d := range []string{filepath.Join(root, "scripts"), deep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "Makefile"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := FindRoot(deep)
	if err != nil || got != root {
		t.Errorf("FindRoot = %q, %v; want %q", got, err, root)
	}
	if _, err := FindRoot(t.TempDir()); err == nil {
		t.Error("found a root where there is none")
	}
}

// Both stacks inject every fault; compose adds its fault proxy only when Up
// is told the fault needs latency, and refuses latency without it.
func TestEveryFaultSupported(t *testing.T) {
	c := NewCompose(t.TempDir(), io.Discard)
	if c.Unsupported("latency") != "" || c.Unsupported("") != "" {
		t.Error("compose should support every fault")
	}
	var u *UnsupportedError
	if err := c.Latency(context.Background(), time.Second, 0); err == nil || !errors.As(err, &u) || u.Fault != "latency" {
		t.Errorf("Latency before Up(latency): %v", err)
	}
	if NewLocal(t.TempDir(), io.Discard).Unsupported("latency") != "" {
		t.Error("the native stack should support latency")
	}
}

// A policy change one instance at a time needs each app's own policy file:
// the native stack has them only when Up was told (NeedsReload); the
// compose stack never, nor an app URL for reset-partition.
func TestReloadNeedsItsOwnFiles(t *testing.T) {
	var u *UnsupportedError
	l := NewLocal(t.TempDir(), io.Discard)
	if l.Unsupported(NeedsReload) != "" || l.Unsupported(NeedsResetPartition) != "" {
		t.Error("the native stack should run both")
	}
	if _, err := l.SetPolicies(context.Background(), "app1", "p.json"); !errors.As(err, &u) || u.Fault != NeedsReload {
		t.Errorf("SetPolicies before Up(reload): %v", err)
	}
	c := NewCompose(t.TempDir(), io.Discard)
	if c.Unsupported(NeedsReload) == "" || c.Unsupported(NeedsResetPartition) == "" {
		t.Error("compose should skip reload-under-load and reset-partition")
	}
	if _, err := c.SetPolicies(context.Background(), "app1", "p.json"); !errors.As(err, &u) {
		t.Errorf("compose SetPolicies: %v", err)
	}
}
