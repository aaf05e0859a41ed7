package memstore_test

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// TestReadmeQuotesTheExample: "Using the library" in the README opens with
// Example_middleware (example_test.go) from its first line to the route,
// one tab less indented, so the snippet users copy compiles and runs.
// Outside the repository (the module alone) there is no README.
func TestReadmeQuotesTheExample(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no README.md three directories up: not in the repository")
	}
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "\nfunc Example_middleware() {\n")
	body, _, ok2 := strings.Cut(body, "\tsrv := httptest.NewServer")
	if !ok || !ok2 {
		t.Fatal("example_test.go: no func Example_middleware() { ... srv := httptest.NewServer")
	}
	var quote strings.Builder
	for line := range strings.Lines(strings.TrimRight(body, "\n") + "\n") {
		quote.WriteString(strings.TrimPrefix(line, "\t"))
	}
	if want := "```go\n" + quote.String() + "```\n"; !strings.Contains(string(readme), want) {
		t.Errorf("README.md does not quote Example_middleware as it is; its Go block should read:\n%s", want)
	}
}
