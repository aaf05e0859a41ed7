package native

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// keys returns an object's keys, sorted.
func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestStackJSON: stack.json has the keys its readers use (CONTRACT.md's,
// then the topologies'), each app and node its own, the pids of the
// running services, and reads back as written.
func TestStackJSON(t *testing.T) {
	contract := []string{"apps", "nginx_url", "prometheus_url", "proxy_api", "redis_addr", "redis_nodes", "redis_pid",
		"rls_addr", "topology", "upstream_url"}
	for _, tc := range []struct {
		topology string
		extra    []string
		nodes    int
		via      string
	}{
		{"single", nil, 1, "127.0.0.1:16391"},
		{"sentinel", []string{"master_name", "replication_proxy", "sentinels"}, 2, "127.0.0.1:16391"},
		{"cluster", nil, 6, ""},
	} {
		t.Run(tc.topology, func(t *testing.T) {
			run := t.TempDir()
			s := topologySettings(t, tc.topology, "LOCAL_RUN_DIR="+run)
			// redis "runs": the test binary under the name redis-server.
			if err := os.MkdirAll(filepath.Join(run, pidDir), 0o755); err != nil {
				t.Fatal(err)
			}
			st := New(s.RunDir, s, os.Stderr)
			pid, err := st.spawn("redis", command{argv: []string{program(t, "redis-server")}, env: []string{helperEnv + "=sleep"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { stop(run, 0, &strings.Builder{}, "redis") })
			if err := s.writeStackJSON(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(run, stackJSON))
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			want := slices.Sorted(slices.Values(append(slices.Clone(contract), tc.extra...)))
			if got := keys(m); !slices.Equal(got, want) {
				t.Errorf("keys %v, want %v", got, want)
			}
			apps := m["apps"].([]any)
			if len(apps) != 4 {
				t.Fatalf("%d apps", len(apps))
			}
			app := apps[1].(map[string]any)
			if got := keys(app); !slices.Equal(got, []string{"admin_url", "name", "pid", "proxy", "redis_via", "url"}) {
				t.Errorf("app keys %v", got)
			}
			if app["name"] != "app2" || app["url"] != "http://127.0.0.1:8082" || app["admin_url"] != "http://127.0.0.1:9082" || app["pid"] != 0.0 {
				t.Errorf("app2: %v", app)
			}
			if first := apps[0].(map[string]any); first["redis_via"] != tc.via {
				t.Errorf("app1's redis_via %v, want %q", first["redis_via"], tc.via)
			}
			nodes := m["redis_nodes"].([]any)
			node := nodes[0].(map[string]any)
			if len(nodes) != tc.nodes || !slices.Equal(keys(node), []string{"addr", "name", "pid"}) ||
				node["name"] != "redis" || node["pid"] != float64(pid) {
				t.Errorf("redis_nodes %v, want %d with redis (pid %d) first", nodes, tc.nodes, pid)
			}
			if m["redis_pid"] != float64(pid) || m["nginx_url"] != "http://127.0.0.1:8080" || m["redis_addr"] != "127.0.0.1:6390" ||
				m["proxy_api"] != "http://127.0.0.1:8474" || m["upstream_url"] != "http://127.0.0.1:8080/static/" ||
				m["rls_addr"] != "127.0.0.1:8090" || m["prometheus_url"] != "" || m["topology"] != tc.topology {
				t.Errorf("stack.json:\n%s", b)
			}
			info, err := readInfo(run)
			if err != nil || !reflect.DeepEqual(info, s.info()) {
				t.Errorf("read back %+v, %v; want %+v", info, err, s.info())
			}
			readByScripts(t, filepath.Join(run, stackJSON))
		})
	}
}

// readByScripts: scripts/lib/stack-json.sh (scripts/measure-*.sh) reads
// the file.
func readByScripts(t *testing.T, path string) {
	t.Helper()
	for _, p := range []string{"bash", "python3"} {
		if _, err := exec.LookPath(p); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not found (CI is set: a missing dependency is a failure)", p)
			}
			t.Skipf("%s not found: scripts/lib/stack-json.sh not tried", p)
		}
	}
	lib, err := filepath.Abs(filepath.Join("..", "..", "scripts", "lib", "stack-json.sh"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "-c", `. "$1" && read_stack_json "$2" &&
		echo "$STACK_REDIS_ADDR|${STACK_APP_NAMES[*]}|${STACK_APP_PIDS[*]}|${STACK_APP_ADMINS[*]}"`, "_", lib, path).CombinedOutput()
	want := "127.0.0.1:6390|app1 app2 app3 app4|0 0 0 0|http://127.0.0.1:9081 http://127.0.0.1:9082 http://127.0.0.1:9083 http://127.0.0.1:9084\n"
	if err != nil || string(out) != want {
		t.Errorf("stack-json.sh: %q, %v; want %q", out, err, want)
	}
}
