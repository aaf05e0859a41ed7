// The rate limit service's configuration (RL_RLS_CONFIG_DIR) replaced while
// the service runs, by the rules of the policy file (reload.go): on SIGHUP
// (Server.Reload reloads both), and when the directory changes
// (envoyrls.Stamp polled every RL_HEARTBEAT_INTERVAL, which sees a
// Kubernetes ConfigMap's ..data swap). The files are parsed and validated
// together first; a bad one keeps the configuration in force and says why in
// the log, /status (rls_config_*) and ratelimit_rls_config_*.
//
// A reload swaps the configuration of the envoyrls.Service with one atomic
// store: a call is decided entirely by the old files or entirely by the new
// ones. A descriptor's policy is named after its path in the files, so one
// left alone keeps its counts, and so does one whose rate changed but not
// its unit, unit_multiplier or algorithm (the store keys state by the
// policy's name, algorithm and window; its usage is judged against the
// new rate),
// as a policy of the policy file does. TestRLSReloadCarriesCounts guards both.

package service

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
)

// rlsReloads is the reload bookkeeping of the rate limit service's
// configuration: reloads are serialised by mu; the rest is read by
// /status and the metrics without it.
type rlsReloads struct {
	mu    sync.Mutex
	stamp string // envoyrls.Stamp of the directory when last read

	loadedAt  atomic.Int64 // Unix ns of the configuration in force
	attempts  atomic.Uint64
	applied   atomic.Uint64
	unchanged atomic.Uint64
	failures  atomic.Uint64
	lastErr   atomic.Pointer[reloadError] // nil: the last reload succeeded
}

// RLSStatus is the rate limit service's part of /status, present when
// RL_GRPC_ADDR is set.
type RLSStatus struct {
	// RLSConfigVersion identifies the configuration in force
	// (envoyrls.Config.Version): instances that report different versions
	// do not run the same files.
	RLSConfigVersion  string    `json:"rls_config_version"`
	RLSConfigDir      string    `json:"rls_config_dir"`
	RLSConfigFiles    []string  `json:"rls_config_files"`
	RLSConfigLoadedAt time.Time `json:"rls_config_loaded_at"`
	// RLSConfigReloads counts the reloads tried since the start (SIGHUP or
	// a change of the directory), whether they succeeded or not.
	RLSConfigReloads uint64 `json:"rls_config_reloads"`
	// RLSConfigReloadError says why the last reload failed ("": it did
	// not); the configuration of RLSConfigVersion stayed in force.
	RLSConfigReloadError   string     `json:"rls_config_reload_error"`
	RLSConfigReloadErrorAt *time.Time `json:"rls_config_reload_error_at,omitempty"`
}

// reloadRLS re-reads RL_RLS_CONFIG_DIR and, when it is valid and differs
// from the configuration in force, applies it to the calls that follow. A
// bad directory changes nothing: the error is returned, logged, counted and
// shown in /status until a reload succeeds. Nothing to do when the rate
// limit service is not served. trigger says what asked, for the log.
func (s *Server) reloadRLS(trigger string) error {
	d := s.rls
	if d == nil {
		return nil
	}
	rl := &d.reloads
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.attempts.Add(1)
	dir := s.cfg.RLSConfigDir
	cur := d.svc.Config()
	rl.stamp = envoyrls.Stamp(dir)
	cfg, err := envoyrls.Load(dir)
	if err != nil {
		err = &ConfigError{Var: "RL_RLS_CONFIG_DIR", Err: err}
		rl.failures.Add(1)
		rl.lastErr.Store(&reloadError{msg: err.Error(), at: time.Now()})
		s.log.Error("rate limit service configuration rejected; the configuration in force stays",
			slog.String("trigger", trigger), slog.String("rls_config_version", cur.Version()), slog.String("error", err.Error()))
		return err
	}
	rl.lastErr.Store(nil)
	if cfg.Version() == cur.Version() {
		rl.unchanged.Add(1)
		level := slog.LevelInfo
		if trigger == "file_changed" {
			level = slog.LevelDebug // touched, not changed
		}
		s.log.Log(context.Background(), level, "rate limit service configuration unchanged",
			slog.String("trigger", trigger), slog.String("rls_config_version", cfg.Version()))
		return nil
	}
	d.svc.SetConfig(cfg)
	rl.loadedAt.Store(time.Now().UnixNano())
	rl.applied.Add(1)
	s.log.Info("rate limit service configuration reloaded",
		slog.String("trigger", trigger), slog.String("from_version", cur.Version()), slog.String("rls_config_version", cfg.Version()),
		slog.Any("domains", cfg.Domains()), slog.Any("files", cfg.Files()), slog.String("rls_config_dir", dir))
	return nil
}

// rlsChanged reports whether RL_RLS_CONFIG_DIR's stamp differs from the
// one of the last reload (false when the service is not served).
func (s *Server) rlsChanged() bool {
	d := s.rls
	if d == nil {
		return false
	}
	d.reloads.mu.Lock()
	defer d.reloads.mu.Unlock()
	return envoyrls.Stamp(s.cfg.RLSConfigDir) != d.reloads.stamp
}

// rlsStatus fills the rate limit service's part of /status (nil when it is
// not served).
func (s *Server) rlsStatus() *RLSStatus {
	d := s.rls
	if d == nil {
		return nil
	}
	cfg := d.svc.Config()
	out := &RLSStatus{
		RLSConfigVersion:  cfg.Version(),
		RLSConfigDir:      s.cfg.RLSConfigDir,
		RLSConfigFiles:    cfg.Files(),
		RLSConfigLoadedAt: time.Unix(0, d.reloads.loadedAt.Load()).UTC(),
		RLSConfigReloads:  d.reloads.attempts.Load(),
	}
	if e := d.reloads.lastErr.Load(); e != nil {
		at := e.at.UTC()
		out.RLSConfigReloadError, out.RLSConfigReloadErrorAt = e.msg, &at
	}
	return out
}

var (
	rlsInfoDesc = prometheus.NewDesc("ratelimit_rls_config_info",
		"1, labelled with the version (hash) of the rate limit service's configuration in force: instances with different versions do not run the same files.",
		[]string{"version"}, nil)
	rlsReloadsDesc = prometheus.NewDesc("ratelimit_rls_config_reloads_total",
		"Reloads of the rate limit service's configuration (SIGHUP, a change of RL_RLS_CONFIG_DIR) by result: applied, unchanged, or rejected (the configuration in force stayed).",
		[]string{"result"}, nil)
	rlsReloadSuccessDesc = prometheus.NewDesc("ratelimit_rls_config_last_reload_success",
		"1 if the last reload of the rate limit service's configuration succeeded (or none was tried), 0 if it was rejected: the files on disk are not what runs.",
		nil, nil)
	rlsLoadedDesc = prometheus.NewDesc("ratelimit_rls_config_loaded_timestamp_seconds",
		"When the rate limit service's configuration in force was loaded (Unix seconds).", nil, nil)
)

// rlsCollector exports the rate limit service's configuration state at
// scrape time, as policyCollector does for the policies.
type rlsCollector struct{ d *rlsDoor }

func (c rlsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rlsInfoDesc
	ch <- rlsReloadsDesc
	ch <- rlsReloadSuccessDesc
	ch <- rlsLoadedDesc
}

func (c rlsCollector) Collect(ch chan<- prometheus.Metric) {
	rl := &c.d.reloads
	ok := 1.0
	if rl.lastErr.Load() != nil {
		ok = 0
	}
	ch <- prometheus.MustNewConstMetric(rlsInfoDesc, prometheus.GaugeValue, 1, c.d.svc.Config().Version())
	ch <- prometheus.MustNewConstMetric(rlsReloadsDesc, prometheus.CounterValue, float64(rl.applied.Load()), "applied")
	ch <- prometheus.MustNewConstMetric(rlsReloadsDesc, prometheus.CounterValue, float64(rl.unchanged.Load()), "unchanged")
	ch <- prometheus.MustNewConstMetric(rlsReloadsDesc, prometheus.CounterValue, float64(rl.failures.Load()), "rejected")
	ch <- prometheus.MustNewConstMetric(rlsReloadSuccessDesc, prometheus.GaugeValue, ok)
	ch <- prometheus.MustNewConstMetric(rlsLoadedDesc, prometheus.GaugeValue, float64(rl.loadedAt.Load())/1e9)
}
