package stack

// Policy changes that reach the native stack's instances one at a time:
// with NeedsReload each app reads a policy file of its own
// (LOCAL_POLICY_DIR/<app>.json, a copy of LOCAL_POLICY_FILE made when the
// app starts), which SetPolicies replaces before it signals the app, and a
// rate limit service configuration of its own
// (LOCAL_RLS_CONFIG_PER_APP_DIR/<app>/, a ConfigMap-like copy of
// LOCAL_RLS_CONFIG_DIR), which SetRLSConfig swaps for the app to notice.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// reloadWait bounds how long SetPolicies waits for the app to report the
// reload.
const reloadWait = 10 * time.Second

// newRunDir empties <run>/<name>, the directory of the apps' own policy
// files or rate limit service configurations (an earlier run's changed
// files must not be the next stack's start), for Up with NeedsReload.
func (l *Local) newRunDir(name string) (string, error) {
	dir := filepath.Join(l.runDir, name)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// reloadState is what an app's /status says of one configuration it
// reloads: the version in force, the reloads tried, the last one's error.
type reloadState struct {
	Version string
	Reloads uint64
	Error   string
}

// policyStatus reads the policy part of an app's /status.
func (l *Local) policyStatus(ctx context.Context, app string) (reloadState, error) {
	var st struct {
		Version string `json:"policy_version"`
		Reloads uint64 `json:"policy_reloads"`
		Error   string `json:"policy_reload_error"`
	}
	err := l.statusInto(ctx, app, &st)
	return reloadState(st), err
}

// rlsStatus reads the rate limit service's configuration part of an app's
// /status.
func (l *Local) rlsStatus(ctx context.Context, app string) (reloadState, error) {
	var st struct {
		Version string `json:"rls_config_version"`
		Reloads uint64 `json:"rls_config_reloads"`
		Error   string `json:"rls_config_reload_error"`
	}
	err := l.statusInto(ctx, app, &st)
	return reloadState(st), err
}

func (l *Local) statusInto(ctx context.Context, app string, v any) error {
	b, err := l.Status(ctx, app)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s /status: %w", app, err)
	}
	return nil
}

// SetPolicies implements Stack: the app's own policy file is replaced (a
// rename, as an editor or a ConfigMap update does), the app gets SIGHUP,
// and its /status is polled until it reports another policy version, or a
// reload error.
func (l *Local) SetPolicies(ctx context.Context, app, path string) (string, error) {
	if l.policyDir == "" {
		return "", &UnsupportedError{Fault: NeedsReload, Reason: "the apps share one policy file (Up without needs \"reload\")"}
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(l.r.root, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	before, err := l.policyStatus(ctx, app)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(l.policyDir, app+".json")
	if err := os.WriteFile(dst+".tmp", b, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(dst+".tmp", dst); err != nil {
		return "", err
	}
	pid, err := l.pidOf(app)
	if err != nil {
		return "", err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return "", fmt.Errorf("kill -HUP %s (pid %d): %w", app, pid, err)
	}
	return awaitReload(ctx, app, path, "policy", before, l.policyStatus)
}

// awaitReload polls read until the app reports a version other than
// before's (returned), or a reload error after before's reloads, for at
// most reloadWait. what names the configuration in errors.
func awaitReload(ctx context.Context, app, path, what string, before reloadState,
	read func(context.Context, string) (reloadState, error)) (string, error) {
	deadline := time.Now().Add(reloadWait)
	for {
		st, err := read(ctx, app)
		switch {
		case err == nil && st.Reloads > before.Reloads && st.Error != "":
			return "", fmt.Errorf("%s rejected %s: %s", app, path, st.Error)
		case err == nil && st.Version != before.Version:
			return st.Version, nil
		case err == nil:
			err = fmt.Errorf("still at %s version %s", what, st.Version)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s did not reload %s within %v: %w", app, path, reloadWait, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
