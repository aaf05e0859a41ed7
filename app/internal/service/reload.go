// Policies replaced while the service runs: on SIGHUP (cmd/ratelimiter
// calls Server.Reload, which also reloads the rate limit service's
// configuration, rlsreload.go) and when RL_POLICY_FILE changes (its size,
// mtime and inode are polled every RL_HEARTBEAT_INTERVAL). The file is parsed and
// validated first; a bad one keeps the policies in force and says why in
// the log, /status and ratelimit_policy_reload_errors_total.
//
// A reload builds a new public router (new httplimit handlers for the new
// policies, the per-address set included) and swaps it in with one atomic
// store: a request is served entirely by the old policies or entirely by
// the new ones. The limiter itself is shared: it takes the policy with each
// request, and every store keys state by the policy's fingerprint
// (its name, algorithm and window in Redis keys and the journal,
// internal/statekey in memory), so a policy whose window or algorithm
// changed starts from fresh state and never meets the old one, and one
// whose limit or burst changed keeps each key's usage, judged against the
// new limit.
// TestReloadOnFileChange guards both.

package service

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// policyState is one loaded policy set and the public router that applies
// it. It is never changed once stored.
type policyState struct {
	set      PolicySet
	handler  http.Handler
	loadedAt time.Time
}

// policyReloads is the reload bookkeeping: reloads are serialised by mu;
// the counters and the last error are read by /status and the metrics
// without it.
type policyReloads struct {
	mu    sync.Mutex
	stamp fileStamp // of RL_POLICY_FILE when last read

	attempts atomic.Uint64
	failures atomic.Uint64
	lastErr  atomic.Pointer[reloadError] // nil: the last reload succeeded
}

type reloadError struct {
	msg string
	at  time.Time
}

// fileStamp is what the watcher compares: a file replaced by rename (as
// editors and Kubernetes ConfigMaps do) has another inode; one written in
// place, another size or mtime.
type fileStamp struct {
	info os.FileInfo
	err  string
}

func stampOf(path string) fileStamp {
	info, err := os.Stat(path)
	if err != nil {
		return fileStamp{err: err.Error()}
	}
	return fileStamp{info: info}
}

func (a fileStamp) same(b fileStamp) bool {
	if a.info == nil || b.info == nil {
		return a.info == nil && b.info == nil && a.err == b.err
	}
	return os.SameFile(a.info, b.info) && a.info.Size() == b.info.Size() && a.info.ModTime().Equal(b.info.ModTime())
}

// PolicyStatus is the policy part of /status.
type PolicyStatus struct {
	// PolicyVersion identifies the policy file in force (PolicySet.Version):
	// instances that report different versions have not converged.
	PolicyVersion string `json:"policy_version"`
	// PolicyFile is RL_POLICY_FILE; "" for the embedded default.
	PolicyFile     string    `json:"policy_file"`
	PolicyLoadedAt time.Time `json:"policy_loaded_at"`
	// PolicyReloads counts the reloads tried since the start (SIGHUP or a
	// change of the file), whether they succeeded or not.
	PolicyReloads uint64 `json:"policy_reloads"`
	// PolicyReloadError says why the last reload failed ("": it did not);
	// the policies of PolicyVersion stayed in force.
	PolicyReloadError   string     `json:"policy_reload_error"`
	PolicyReloadErrorAt *time.Time `json:"policy_reload_error_at,omitempty"`
	// RLSStatus is the rate limit service's configuration, reloaded by the
	// same rules (rlsreload.go); nil, and absent, without RL_GRPC_ADDR.
	*RLSStatus
}

// newPolicyState builds the public router of set.
func (s *Server) newPolicyState(set PolicySet, now time.Time) *policyState {
	cfg := httplimit.Config{
		TrustedProxies:    s.cfg.TrustedProxies,
		TrustedRequestIDs: s.cfg.TrustRequestID,
		Logger:            s.log,
		OnError:           s.limiterError,
		APIKeys:           s.checkAPIKey,
		PerAddress:        set.PerAddress,
	}
	if s.cfg.DebugHeaders {
		cfg.ServedBy = s.cfg.Instance
	}
	limits := httplimit.New(s.limiter, cfg)
	return &policyState{set: set, handler: s.publicRouter(set, limits), loadedAt: now}
}

// servePublic serves a request with the policies in force.
func (s *Server) servePublic(w http.ResponseWriter, r *http.Request) {
	s.policy.Load().handler.ServeHTTP(w, r)
}

// Policies returns the policy set in force.
func (s *Server) Policies() PolicySet { return s.policy.Load().set }

// Reload re-reads RL_POLICY_FILE and, when it is valid and differs from the
// policies in force, applies it to the requests that follow; then it does
// the same with RL_RLS_CONFIG_DIR when the rate limit service is served. A
// bad file changes nothing of its own kind: the error is returned, logged,
// counted and shown in /status until a reload succeeds. Without
// RL_POLICY_FILE the embedded default stays. Safe for concurrent use;
// cmd/ratelimiter calls it on SIGHUP.
func (s *Server) Reload() error {
	return errors.Join(s.reload("signal"), s.reloadRLS("signal"))
}

// reload is Reload, with what triggered it for the log.
func (s *Server) reload(trigger string) error {
	rl := &s.reloads
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.attempts.Add(1)
	path := s.cfg.PolicyFile
	cur := s.policy.Load()
	if path == "" {
		s.log.Info("no policy file to reload (RL_POLICY_FILE is not set): the embedded default stays",
			slog.String("trigger", trigger), slog.String("policy_version", cur.set.Version))
		rl.lastErr.Store(nil)
		return nil
	}
	rl.stamp = stampOf(path)
	set, err := LoadPolicies(path)
	if err != nil {
		err = &ConfigError{Var: "RL_POLICY_FILE", Err: err}
		rl.failures.Add(1)
		rl.lastErr.Store(&reloadError{msg: err.Error(), at: time.Now()})
		s.log.Error("policy file rejected; the policies in force stay",
			slog.String("trigger", trigger), slog.String("policy_version", cur.set.Version), slog.String("error", err.Error()))
		return err
	}
	rl.lastErr.Store(nil)
	if set.Version == cur.set.Version {
		level := slog.LevelInfo
		if trigger == "file_changed" {
			level = slog.LevelDebug // touched, not changed
		}
		s.log.Log(context.Background(), level, "policy file unchanged",
			slog.String("trigger", trigger), slog.String("policy_version", set.Version))
		return nil
	}
	s.policy.Store(s.newPolicyState(set, time.Now()))
	s.log.Info("policies reloaded",
		slog.String("trigger", trigger), slog.String("from_version", cur.set.Version), slog.String("policy_version", set.Version),
		slog.Int("policies", len(set.Policies)), slog.Int("routes", len(set.Routes)), slog.String("policy_file", path))
	return nil
}

// watchPolicyFile reloads the policy file (when RL_POLICY_FILE is set) and
// the rate limit service's configuration directory (when it is served)
// whenever its stamp changes, checking every interval until ctx ends; the
// first check reads them whatever their stamps, so a change between the
// start's read and the first stamp is not missed. It closes done when it
// returns.
func (s *Server) watchPolicyFile(ctx context.Context, interval time.Duration, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.cfg.PolicyFile != "" {
			s.reloads.mu.Lock()
			changed := first || !stampOf(s.cfg.PolicyFile).same(s.reloads.stamp)
			s.reloads.mu.Unlock()
			if changed {
				// The error is in the log, the metrics and /status.
				_ = s.reload("file_changed")
			}
		}
		if first || s.rlsChanged() {
			_ = s.reloadRLS("file_changed") // as above; nothing without RL_GRPC_ADDR
		}
		first = false
	}
}

// policyStatus fills the policy part of /status.
func (s *Server) policyStatus() PolicyStatus {
	cur := s.policy.Load()
	out := PolicyStatus{
		PolicyVersion:  cur.set.Version,
		PolicyFile:     s.cfg.PolicyFile,
		PolicyLoadedAt: cur.loadedAt.UTC(),
		PolicyReloads:  s.reloads.attempts.Load(),
		RLSStatus:      s.rlsStatus(),
	}
	if e := s.reloads.lastErr.Load(); e != nil {
		at := e.at.UTC()
		out.PolicyReloadError, out.PolicyReloadErrorAt = e.msg, &at
	}
	return out
}

var (
	policyInfoDesc = prometheus.NewDesc("ratelimit_policy_info",
		"1, labelled with the version (hash) of the policy file in force: instances with different versions have not converged.", []string{"version"}, nil)
	policyReloadErrorsDesc = prometheus.NewDesc("ratelimit_policy_reload_errors_total",
		"Policy reloads (SIGHUP, a change of RL_POLICY_FILE) that found the file unusable and kept the policies in force.", nil, nil)
	policyReloadSuccessDesc = prometheus.NewDesc("ratelimit_policy_last_reload_success",
		"1 if the last policy reload succeeded (or none was tried), 0 if it was rejected: the file on disk is not what runs.", nil, nil)
	policyLoadedDesc = prometheus.NewDesc("ratelimit_policy_loaded_timestamp_seconds",
		"When the policies in force were loaded (Unix seconds).", nil, nil)
)

// policyCollector exports the policy state at scrape time, so a scrape
// never sees two versions or none.
type policyCollector struct{ s *Server }

func (c policyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- policyInfoDesc
	ch <- policyReloadErrorsDesc
	ch <- policyReloadSuccessDesc
	ch <- policyLoadedDesc
}

func (c policyCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.s.policy.Load()
	ok := 1.0
	if c.s.reloads.lastErr.Load() != nil {
		ok = 0
	}
	ch <- prometheus.MustNewConstMetric(policyInfoDesc, prometheus.GaugeValue, 1, cur.set.Version)
	ch <- prometheus.MustNewConstMetric(policyReloadErrorsDesc, prometheus.CounterValue, float64(c.s.reloads.failures.Load()))
	ch <- prometheus.MustNewConstMetric(policyReloadSuccessDesc, prometheus.GaugeValue, ok)
	ch <- prometheus.MustNewConstMetric(policyLoadedDesc, prometheus.GaugeValue, float64(cur.loadedAt.UnixNano())/1e9)
}
