package doccheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeQuotesTheExamples: "Using the library" in the README quotes
// each example from its first line to the route's server, one tab less
// indented, so the snippets users copy are code that compiles and runs.
func TestReadmeQuotesTheExamples(t *testing.T) {
	top := root(t)
	readme, err := os.ReadFile(filepath.Join(top, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []struct{ file, fn string }{
		{"app/ratelimit/memstore/example_test.go", "Example_middleware"},
		{"app/ratelimit/resilient/example_test.go", "Example"},
	} {
		src, err := os.ReadFile(filepath.Join(top, ex.file))
		if err != nil {
			t.Fatal(err)
		}
		_, body, ok := strings.Cut(string(src), "\nfunc "+ex.fn+"() {\n")
		body, _, ok2 := strings.Cut(body, "\tsrv := httptest.NewServer")
		if !ok || !ok2 {
			t.Fatalf("%s: no func %s() { ... srv := httptest.NewServer", ex.file, ex.fn)
		}
		var quote strings.Builder
		for line := range strings.Lines(strings.TrimRight(body, "\n") + "\n") {
			quote.WriteString(strings.TrimPrefix(line, "\t"))
		}
		if want := "```go\n" + quote.String() + "```\n"; !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not quote %s of %s as it is; its Go block should read:\n%s", ex.fn, ex.file, want)
		}
	}
}
