package service

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// rlsFile is a configuration of domain d with descriptors a and b, a
// minute's window each, limited to the given rates.
func rlsFile(a, b int) string {
	return "domain: d\ndescriptors:\n" +
		"  - key: a\n    rate_limit: {unit: minute, requests_per_unit: " + strconv.Itoa(a) + "}\n" +
		"  - key: b\n    rate_limit: {unit: minute, requests_per_unit: " + strconv.Itoa(b) + "}\n"
}

// startRLSServer starts a service in memory mode serving the rate limit
// service on the configuration directory dir, polling it every 20 ms
// unless env says otherwise, and returns it with a client.
func startRLSServer(t *testing.T, dir string, env map[string]string) (*Server, pb.RateLimitServiceClient) {
	t.Helper()
	all := map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": dir,
		"RL_HEARTBEAT_INTERVAL": "20ms", "RL_HEARTBEAT_TTL": "100ms"}
	for k, v := range env {
		all[k] = v
	}
	s, _ := startServer(t, all)
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return s, pb.NewRateLimitServiceClient(conn)
}

// rlsCall asks for one hit of descriptor key=value of domain d.
func rlsCall(t *testing.T, c pb.RateLimitServiceClient, key, value string) *pb.RateLimitResponse_DescriptorStatus {
	t.Helper()
	r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return r.Statuses[0]
}

// waitForLimit waits until a call of descriptor key reports the limit
// want (each call with a value of its own, so none spends another's).
func waitForLimit(t *testing.T, c pb.RateLimitServiceClient, key string, want uint32) {
	t.Helper()
	n := 0
	eventually(t, func() string {
		n++
		if got := rlsCall(t, c, key, "probe-"+strconv.Itoa(n)).GetCurrentLimit().GetRequestsPerUnit(); got != want {
			return "descriptor " + key + " limited to " + strconv.Itoa(int(got)) + ", want " + strconv.Itoa(int(want))
		}
		return ""
	})
}

// TestRLSReloadOnFileChange: a new file in RL_RLS_CONFIG_DIR is picked up
// with no signal within a few polls and decides the calls that follow; a
// bad file then keeps the configuration in force (calls still decided by
// its limits) and says why in /status and the metrics; a good one clears
// that.
func TestRLSReloadOnFileChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.yaml")
	writeFile(t, path, rlsFile(5, 5))
	s, c := startRLSServer(t, dir, nil)
	first := statusOf(t, s)
	if first.RLSStatus == nil || first.RLSConfigVersion == "" || first.RLSConfigDir != dir ||
		strings.Join(first.RLSConfigFiles, ",") != "d.yaml" || first.RLSConfigReloadError != "" {
		t.Fatalf("/status at start: %+v", first.RLSStatus)
	}
	if got := rlsCall(t, c, "a", "x").GetCurrentLimit().GetRequestsPerUnit(); got != 5 {
		t.Fatalf("limit of a at start %d, want 5", got)
	}

	writeFile(t, path, rlsFile(2, 5))
	waitForLimit(t, c, "a", 2)
	second := statusOf(t, s)
	if second.RLSConfigVersion == first.RLSConfigVersion || second.RLSConfigReloads == 0 || second.RLSConfigReloadError != "" {
		t.Errorf("/status after the change: %+v (at start %+v)", second.RLSStatus, first.RLSStatus)
	}

	// A bad file: the configuration in force stays.
	writeFile(t, path, strings.Replace(rlsFile(7, 7), "requests_per_unit: 7}\n  - key: b", "requests_per_unt: 7}\n  - key: b", 1))
	eventually(t, func() string {
		if st := statusOf(t, s); !strings.Contains(st.RLSConfigReloadError, "unknown key 'requests_per_unt'") {
			return "rls_config_reload_error = " + st.RLSConfigReloadError
		}
		return ""
	})
	if st := statusOf(t, s); st.RLSConfigVersion != second.RLSConfigVersion || st.RLSConfigReloadErrorAt == nil ||
		!strings.HasPrefix(st.RLSConfigReloadError, "RL_RLS_CONFIG_DIR: d.yaml:") {
		t.Errorf("/status after a bad file: %+v", st.RLSStatus)
	}
	for i := range 3 {
		st := rlsCall(t, c, "a", "bad")
		if code := pb.RateLimitResponse_OK; i == 2 {
			code = pb.RateLimitResponse_OVER_LIMIT
			if st.Code != code {
				t.Errorf("call %d of a after a bad file: %v, want %v (the limit of 2 in force)", i+1, st.Code, code)
			}
		} else if st.Code != code || st.GetCurrentLimit().GetRequestsPerUnit() != 2 {
			t.Errorf("call %d of a after a bad file: %v, want OK under the limit of 2 in force", i+1, st)
		}
	}
	_, metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{
		`ratelimit_rls_config_info{version="` + second.RLSConfigVersion + `"} 1`,
		`ratelimit_rls_config_last_reload_success 0`,
		`ratelimit_rls_config_reloads_total{result="applied"} 1`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(metrics, "ratelimit_rls_config"))
		}
	}
	if strings.Contains(string(metrics), `ratelimit_rls_config_reloads_total{result="rejected"} 0`) {
		t.Errorf("no rejected reload counted:\n%s", grep(metrics, "ratelimit_rls_config"))
	}

	// A good file again clears the error.
	writeFile(t, path, rlsFile(3, 5))
	waitForLimit(t, c, "a", 3)
	if st := statusOf(t, s); st.RLSConfigReloadError != "" || st.RLSConfigReloadErrorAt != nil {
		t.Errorf("/status after a good file: %+v", st.RLSStatus)
	}
	_, metrics = get(t, "http://"+s.AdminAddr()+"/metrics")
	if want := `ratelimit_rls_config_last_reload_success 1`; !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s:\n%s", want, grep(metrics, "ratelimit_rls_config"))
	}
}

// TestRLSReloadConfigMap: a Kubernetes ConfigMap's update (a new
// timestamped directory, and a new ..data symbolic link renamed over the
// old one; the top-level links x.yaml -> ..data/x.yaml do not change) is
// picked up, and the files are read once, through the top-level links.
func TestRLSReloadConfigMap(t *testing.T) {
	dir := t.TempDir()
	update := func(ts, body string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ts, "d.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	update("..2026_12_04_10_00_00.1", rlsFile(5, 5))
	if err := os.Symlink(filepath.Join("..data", "d.yaml"), filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}
	s, c := startRLSServer(t, dir, nil)
	first := statusOf(t, s)
	if strings.Join(first.RLSConfigFiles, ",") != "d.yaml" {
		t.Fatalf("files at start %v, want [d.yaml]", first.RLSConfigFiles)
	}
	update("..2026_12_04_10_05_00.2", rlsFile(4, 5)) // the same size
	waitForLimit(t, c, "a", 4)
	if st := statusOf(t, s); st.RLSConfigVersion == first.RLSConfigVersion || strings.Join(st.RLSConfigFiles, ",") != "d.yaml" {
		t.Errorf("/status after the swap: %+v", st.RLSStatus)
	}
}

// TestRLSReloadSignal: Server.Reload, which cmd/ratelimiter calls on
// SIGHUP, reloads the configuration at once (the directory is polled only
// every 30 minutes here), and returns why it rejected a bad one.
func TestRLSReloadSignal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.yaml")
	writeFile(t, path, rlsFile(5, 5))
	s, c := startRLSServer(t, dir, map[string]string{"RL_HEARTBEAT_INTERVAL": "30m", "RL_HEARTBEAT_TTL": "1h"})
	writeFile(t, path, rlsFile(1, 5))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := rlsCall(t, c, "a", "x").GetCurrentLimit().GetRequestsPerUnit(); got != 1 {
		t.Fatalf("limit of a after Reload %d, want 1", got)
	}
	if st := statusOf(t, s); st.RLSConfigReloads != 1 || st.RLSConfigReloadError != "" {
		t.Errorf("/status after Reload: %+v", st.RLSStatus)
	}
	writeFile(t, path, "domain: d\ndescriptors: {}\n")
	if err := s.Reload(); err == nil || !strings.HasPrefix(err.Error(), "RL_RLS_CONFIG_DIR: d.yaml:") {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	if got := rlsCall(t, c, "a", "y").GetCurrentLimit().GetRequestsPerUnit(); got != 1 {
		t.Errorf("limit of a after a rejected Reload %d, want 1 still", got)
	}
}

// TestRLSReloadCarriesCounts: a reload that changes one descriptor leaves
// the counts of the others: 3 of a's 5 spent before it, exactly 2 more are
// admitted after. b's rate changed, not its unit: its usage carries over
// too, judged against the new rate (1 of 5 spent, then 2 allowed: 1 more).
func TestRLSReloadCarriesCounts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.yaml")
	writeFile(t, path, rlsFile(5, 5))
	s, c := startRLSServer(t, dir, nil)
	for i := range 3 {
		if st := rlsCall(t, c, "a", "tenant"); st.Code != pb.RateLimitResponse_OK || st.LimitRemaining != uint32(4-i) {
			t.Fatalf("call %d of a before the reload: %v", i+1, st)
		}
	}
	if st := rlsCall(t, c, "b", "tenant"); st.Code != pb.RateLimitResponse_OK || st.LimitRemaining != 4 {
		t.Fatalf("b before the reload: %v", st)
	}
	v := statusOf(t, s).RLSConfigVersion
	writeFile(t, path, rlsFile(5, 2))
	eventually(t, func() string {
		if got := statusOf(t, s).RLSConfigVersion; got == v {
			return "rls_config_version still " + got
		}
		return ""
	})
	var codes []string
	for range 3 {
		codes = append(codes, rlsCall(t, c, "a", "tenant").Code.String())
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OVER_LIMIT" {
		t.Errorf("a after the reload: %s, want OK,OK,OVER_LIMIT (3 of 5 spent before it)", got)
	}
	codes = codes[:0]
	for range 2 {
		codes = append(codes, rlsCall(t, c, "b", "tenant").Code.String())
	}
	if got := strings.Join(codes, ","); got != "OK,OVER_LIMIT" {
		t.Errorf("b after the reload: %s, want OK,OVER_LIMIT (1 spent before it, now of 2)", got)
	}
}
