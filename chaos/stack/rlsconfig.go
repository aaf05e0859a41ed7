package stack

// The rate limit service's configuration changed on one native app at a
// time, the way Kubernetes updates a ConfigMap volume, and picked up by the
// app's own watch of RL_RLS_CONFIG_DIR: no signal.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// configMapData is the symlink of a ConfigMap volume that names the
// directory holding the current files; each file is a symlink through it.
const configMapData = "..data"

// SetRLSConfig implements Stack: the YAML files of srcDir become the app's
// own RL_RLS_CONFIG_DIR (LOCAL_RLS_CONFIG_PER_APP_DIR/<app>/) as kubelet
// updates a ConfigMap volume (swapConfigMap), the app is not signalled, and
// its /status is polled until it reports another rls_config_version, or a
// reload error.
func (l *Local) SetRLSConfig(ctx context.Context, app, srcDir string) (string, error) {
	if l.rlsDir == "" {
		return "", &UnsupportedError{Fault: NeedsReload, Reason: "the apps share one RLS configuration directory (Up without needs \"reload\")"}
	}
	if !filepath.IsAbs(srcDir) {
		srcDir = filepath.Join(l.r.root, srcDir)
	}
	before, err := l.rlsStatus(ctx, app)
	if err != nil {
		return "", err
	}
	if before.Version == "" {
		return "", fmt.Errorf("%s /status: no rls_config_version (no rate limit service?)", app)
	}
	if err := swapConfigMap(filepath.Join(l.rlsDir, app), srcDir, time.Now()); err != nil {
		return "", err
	}
	return awaitReload(ctx, app, srcDir, "RLS configuration", before, l.rlsStatus)
}

// swapConfigMap replaces the files of dir, a directory laid out as a
// ConfigMap volume (package native makes it), with srcDir's
// configuration files (.yaml, .yml, not hidden) as kubelet's atomic writer
// does: they are copied into a new ..<timestamp>/, a new ..data symlink to
// it is renamed over the old one (the one atomic step), a symlink through
// ..data is made for each new name and removed for each name gone, and the
// old timestamped directory is removed.
func swapConfigMap(dir, srcDir string, now time.Time) error {
	entries, err := os.ReadDir(srcDir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if !strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) && e.Type().IsRegular() {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: no configuration file", srcDir)
	}
	old, err := os.Readlink(filepath.Join(dir, configMapData))
	if err != nil {
		return fmt.Errorf("%s: not a ConfigMap-like directory: %w", dir, err)
	}
	ts := ".." + now.UTC().Format("2006_01_02_15_04_05.000000000")
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		return err
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(srcDir, n))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, ts, n), b, 0o644); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, configMapData+"_tmp")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, configMapData)); err != nil {
		return err
	}
	// The names: new ones linked, those gone unlinked (both after the
	// swap, as kubelet does; a link to a name not yet in ..data would
	// dangle).
	for _, n := range names {
		link := filepath.Join(dir, n)
		if _, err := os.Lstat(link); errors.Is(err, fs.ErrNotExist) {
			if err := os.Symlink(filepath.Join(configMapData, n), link); err != nil {
				return err
			}
		}
	}
	top, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range top {
		link := filepath.Join(dir, e.Name())
		target, err := os.Readlink(link)
		if err != nil || !strings.HasPrefix(target, configMapData+string(filepath.Separator)) {
			continue
		}
		if _, err := os.Stat(link); errors.Is(err, fs.ErrNotExist) {
			if err := os.Remove(link); err != nil {
				return err
			}
		}
	}
	if old != ts && !strings.Contains(old, string(filepath.Separator)) && strings.HasPrefix(old, "..") {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
