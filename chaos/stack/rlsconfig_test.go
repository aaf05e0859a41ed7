package stack

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestSwapConfigMap: a ConfigMap-like directory (as package native lays it
// out) takes another directory's files as kubelet updates a volume: a new
// ..<timestamp>/, ..data renamed to it, links made for new names and
// removed for names gone, the old directory removed; what the app reads
// through the names is the new content.
func TestSwapConfigMap(t *testing.T) {
	dir, src := t.TempDir(), t.TempDir()
	const first = "..2026_01_01_00_00_00.000000000"
	if err := os.Mkdir(filepath.Join(dir, first), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, first, "a.yaml"), "old a")
	write(filepath.Join(dir, first, "gone.yaml"), "old gone")
	for _, n := range []string{"a.yaml", "gone.yaml"} {
		if err := os.Symlink(filepath.Join(configMapData, n), filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(first, filepath.Join(dir, configMapData)); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(src, "a.yaml"), "new a")
	write(filepath.Join(src, "b.yml"), "new b")
	write(filepath.Join(src, ".hidden.yaml"), "not copied")
	write(filepath.Join(src, "notes.txt"), "not copied")

	if err := swapConfigMap(dir, src, time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)); err != nil {
		t.Fatal(err)
	}
	const second = "..2026_01_02_03_04_05.000000006"
	if got, err := os.Readlink(filepath.Join(dir, configMapData)); err != nil || got != second {
		t.Errorf("..data -> %q, %v; want %s", got, err, second)
	}
	for n, want := range map[string]string{"a.yaml": "new a", "b.yml": "new b"} {
		if b, err := os.ReadFile(filepath.Join(dir, n)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", n, b, err, want)
		}
		if target, err := os.Readlink(filepath.Join(dir, n)); err != nil || target != filepath.Join(configMapData, n) {
			t.Errorf("%s -> %q, %v: want a link through ..data", n, target, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	if want := []string{second, configMapData, "a.yaml", "b.yml"}; !slices.Equal(names, want) {
		t.Errorf("entries %v, want %v (the old directory, the link of a name gone and the hidden file removed)", names, want)
	}
	if err := swapConfigMap(dir, t.TempDir(), time.Now()); err == nil {
		t.Error("a directory without configuration files was swapped in")
	}
	if err := swapConfigMap(t.TempDir(), src, time.Now()); err == nil {
		t.Error("a directory without ..data was taken for a ConfigMap")
	}
}

// TestSetRLSConfigNeedsItsOwnDirs: only a native stack started with
// NeedsReload gives each app a configuration directory of its own.
func TestSetRLSConfigNeedsItsOwnDirs(t *testing.T) {
	var u *UnsupportedError
	if _, err := NewLocal(t.TempDir(), io.Discard).SetRLSConfig(context.Background(), "app1", "chaos/reload/rls"); !errors.As(err, &u) || u.Fault != NeedsReload {
		t.Errorf("SetRLSConfig before Up(reload): %v", err)
	}
	if _, err := NewCompose(t.TempDir(), io.Discard).SetRLSConfig(context.Background(), "app1", "chaos/reload/rls"); !errors.As(err, &u) {
		t.Errorf("compose SetRLSConfig: %v", err)
	}
}
