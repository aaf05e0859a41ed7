package envoyrls

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
)

// Stamp is a cheap fingerprint of what Load would read in dir, for a
// watcher to poll: the directory's own resolved path and, for each entry
// Load reads, its name, the path its symbolic links resolve to, its size
// and its modification time. No file is read. Two stamps differ when a file
// was written, renamed over, added or removed, and when a Kubernetes
// ConfigMap's update swapped its ..data symbolic link to a new timestamped
// directory (the links x.yaml -> ..data/x.yaml keep their own mtimes; what
// they resolve to changes). An unreadable directory has a stamp too, which
// changes when the error does.
func Stamp(dir string) string {
	h := sha256.New()
	field := func(s string) {
		_, _ = h.Write([]byte(strconv.Itoa(len(s)) + ":" + s))
	}
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		field("error " + err.Error())
	}
	field(resolved)
	entries, err := os.ReadDir(dir)
	if err != nil {
		field("error " + err.Error())
	}
	for _, e := range entries {
		n := e.Name()
		if !configFile(n) {
			continue
		}
		path := filepath.Join(dir, n)
		field(n)
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			field("error " + err.Error())
			continue
		}
		field(target)
		st, err := os.Stat(target)
		if err != nil {
			field("error " + err.Error())
			continue
		}
		field(strconv.FormatInt(st.Size(), 10) + " " + strconv.FormatInt(st.ModTime().UnixNano(), 10) + " " + st.Mode().String())
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
