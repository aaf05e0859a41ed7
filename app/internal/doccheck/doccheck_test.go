package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository's top directory: the first parent that holds
// go.work.
func root(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.work above the test's directory")
		}
		dir = up
	}
}

// skipped are the directories that hold no prose of the repository's:
// its history, run outputs and tools' caches.
var skipped = map[string]bool{".git": true, ".run": true, "chaos-out": true, "bench-out": true, "bin": true, "node_modules": true}

// prose are the files whose text may name a test.
func prose(name string) bool {
	switch filepath.Ext(name) {
	case ".go", ".md", ".lua", ".sh", ".yml", ".yaml", ".json", ".conf", ".txt":
		return true
	}
	return name == "Makefile" || name == "Dockerfile"
}

var (
	testDecl = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)
	testName = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z]\w*`)
	// generated is Go's marker of a generated file.
	generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)
)

// TestNamedTestsExist: every Test..., Benchmark... or Fuzz... that a doc, a
// comment, a script or a config names is a function of some _test.go file
// of the repository. A renamed or deleted test leaves no reader looking
// for it.
func TestNamedTestsExist(t *testing.T) {
	top := root(t)
	defined := map[string]bool{}
	named := map[string][]string{} // name -> files
	err := filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != top && (skipped[d.Name()] || strings.HasPrefix(d.Name(), ".") && d.Name() != ".ci") {
				return filepath.SkipDir
			}
			return nil
		}
		if !prose(d.Name()) && filepath.Dir(path) != filepath.Join(top, ".ci") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if generated.Match(b) {
			return nil // a tool's text (mockery's usage comment names a test to write)
		}
		rel, _ := filepath.Rel(top, path)
		if strings.HasSuffix(path, "_test.go") {
			for _, m := range testDecl.FindAllSubmatch(b, -1) {
				defined[string(m[1])] = true
			}
		}
		for _, m := range testName.FindAll(b, -1) {
			if n := string(m); !slices.Contains(named[n], rel) {
				named[n] = append(named[n], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 100 {
		t.Fatalf("found %d tests under %s: the walk missed the repository", len(defined), top)
	}
	for n, files := range named {
		if !defined[n] && n != "TestMain" {
			t.Errorf("%s is named in %s but is no test of the repository", n, strings.Join(files, ", "))
		}
	}
}
