package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/chaos/invariant"
)

// TestWriteDoc: a run rewrites its own stack's rows and keeps the rest:
// the other stack's section, and its own stack's rows of scenarios it did
// not run.
func TestWriteDoc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "CHAOS.md")
	rep := func(name string, over float64, pass bool) *Report {
		return &Report{Scenario: name, Pass: pass, Invariants: []invariant.Row{
			{Name: invariant.OverAdmission, Route: "/api/gcra", Phase: invariant.Fault, Measured: over, Pass: pass},
			{Name: invariant.OverAdmission, Route: "/api/token-bucket", Phase: invariant.Fault, Measured: 0.5, Pass: true},
		}}
	}
	order := []string{"redis-kill", "redis-pause"}
	if err := WriteDoc(path, "local", []*Report{rep("redis-kill", 1.01, true), rep("redis-pause", 1.2, false)}, order); err != nil {
		t.Fatal(err)
	}
	if err := WriteDoc(path, "compose", []*Report{rep("redis-kill", 1.0, true)}, order); err != nil {
		t.Fatal(err)
	}
	if err := WriteDoc(path, "local", []*Report{rep("redis-pause", 1.02, true)}, order); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	local := doc[strings.Index(doc, "<!-- chaos:local -->"):strings.Index(doc, "<!-- /chaos:local -->")]
	for _, want := range []string{"| redis-kill | pass | 1.01 / - / - |", "| redis-pause | pass | 1.02 / - / - |"} {
		if !strings.Contains(local, want) {
			t.Errorf("local section lacks %q:\n%s", want, local)
		}
	}
	if strings.Contains(doc, "1.2 ") || strings.Index(local, "redis-kill") > strings.Index(local, "redis-pause") {
		t.Errorf("stale or misordered rows:\n%s", doc)
	}
	if !strings.Contains(doc, "<!-- chaos:compose -->") || strings.Count(doc, "# Chaos suite results") != 1 {
		t.Errorf("the compose section or the head is not kept once:\n%s", doc)
	}
}
