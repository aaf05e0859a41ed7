package stack

// Policy changes that reach the native stack's instances one at a time:
// with NeedsReload each app reads a policy file of its own
// (LOCAL_POLICY_DIR/<app>.json, a copy of LOCAL_POLICY_FILE made when the
// app starts), which SetPolicies replaces before it signals the app.

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

// newPolicyDir empties the directory of the apps' own policy files (an
// earlier run's changed files must not be the next stack's start), for Up
// with NeedsReload.
func (l *Local) newPolicyDir() (string, error) {
	dir := filepath.Join(l.r.root, ".run", "chaos-policies")
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// policyStatus is the policy part of an app's /status.
type policyStatus struct {
	Version string `json:"policy_version"`
	Reloads uint64 `json:"policy_reloads"`
	Error   string `json:"policy_reload_error"`
}

func (l *Local) policyStatus(ctx context.Context, app string) (policyStatus, error) {
	var st policyStatus
	b, err := l.Status(ctx, app)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s /status: %w", app, err)
	}
	return st, nil
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
	deadline := time.Now().Add(reloadWait)
	for {
		st, err := l.policyStatus(ctx, app)
		switch {
		case err == nil && st.Reloads > before.Reloads && st.Error != "":
			return "", fmt.Errorf("%s rejected %s: %s", app, path, st.Error)
		case err == nil && st.Version != before.Version:
			return st.Version, nil
		case err == nil:
			err = fmt.Errorf("still at policy version %s", st.Version)
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
