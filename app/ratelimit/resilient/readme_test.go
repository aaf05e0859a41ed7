package resilient_test

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// TestReadmeQuotesTheExample: the README's "Using the library" quotes
// Example (example_test.go) from its first line to the middleware's route,
// one tab less indented, so the snippet users copy is code that compiles and
// runs. Outside the repository (the module alone) there is no README.
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
	_, body, ok := strings.Cut(string(src), "\nfunc Example() {\n")
	body, _, ok2 := strings.Cut(body, "\tsrv := httptest.NewServer")
	if !ok || !ok2 {
		t.Fatal("example_test.go: no func Example() { ... srv := httptest.NewServer")
	}
	var quote strings.Builder
	for line := range strings.Lines(strings.TrimRight(body, "\n") + "\n") {
		quote.WriteString(strings.TrimPrefix(line, "\t"))
	}
	if want := "```go\n" + quote.String() + "```\n"; !strings.Contains(string(readme), want) {
		t.Errorf("README.md does not quote Example as it is; its Go block should read:\n%s", want)
	}
}
