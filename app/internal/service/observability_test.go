package service

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
)

// The repository's Prometheus rules and Grafana dashboard, from this
// package's directory.
var (
	rulesFile     = filepath.Join("..", "..", "..", "prometheus", "rules.yml")
	dashboardFile = filepath.Join("..", "..", "..", "grafana", "fleetlimit.json")
)

// syntheticSeries are series Prometheus makes itself, not the service.
var syntheticSeries = map[string]bool{"up": true, "ALERTS": true}

// pendingSeries are named by the rules before the service exports them. The
// test fails once one of them is exported, so that it leaves this list.
var pendingSeries = map[string]bool{}

// exportedSeries are the series names the service can export: every metric
// family its registries describe, in memory mode and in Redis mode (the
// resilient limiter's families) and with the rate limit service (its
// configuration's families), with a histogram's or summary's _bucket, _sum
// and _count.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{}
	rls := map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": filepath.Join("..", "..", "..", "envoy", "ratelimit")}
	for _, env := range []map[string]string{nil, {"RL_REDIS_URL": "redis://" + deadAddr(t) + "/0"}, rls} {
		s, _ := startServer(t, env)
		ch := make(chan *prometheus.Desc)
		go func() {
			s.metrics.reg.Describe(ch)
			close(ch)
		}()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				out[m[1]+suffix] = true
			}
		}
	}
	return out
}

// The PromQL that selectorNames reads: string literals, label matchers,
// ranges, label lists (by, on, group_left, ...) and numbers (durations
// included) are dropped first; then an identifier is a series name unless a
// '(' follows it (a function or an aggregation), a '$' precedes it (a
// Grafana variable), or it is a keyword.
var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\[\]]*\]`)
	promqlLabels   = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promqlNumber   = regexp.MustCompile(`\b[0-9][a-zA-Z0-9_.]*`)
	promqlIdent    = regexp.MustCompile(`\$?[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	promqlKeywords = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
	}
)

// selectorNames returns the series names a PromQL expression selects.
func selectorNames(expr string) []string {
	e := promqlString.ReplaceAllString(expr, `""`)
	e = promqlMatchers.ReplaceAllString(e, "")
	e = promqlRange.ReplaceAllString(e, "")
	e = promqlLabels.ReplaceAllString(e, "")
	e = promqlNumber.ReplaceAllString(e, "0")
	var names []string
	for _, m := range promqlIdent.FindAllString(e, -1) {
		name := strings.TrimSpace(m)
		if strings.HasPrefix(name, "$") || strings.HasSuffix(name, "(") || promqlKeywords[strings.ToLower(name)] {
			continue
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

func TestSelectorNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`up{job="fleetlimit"} == 0`, []string{"up"}},
		{`sum by (job, instance) (rate(ratelimit_decisions_total{mode=~"local|open"}[5m])) / sum by (job, instance) (rate(ratelimit_decisions_total[5m]))`,
			[]string{"ratelimit_decisions_total"}},
		{`increase(a_total[5m]) > 0 and on (job, instance) max_over_time(b{state=~"open|recovering"}[5m]) == 1`, []string{"a_total", "b"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket{instance=~"$instance"}[$__rate_interval])))`, []string{"x_bucket"}},
		{`fleetlimit:policy_versions:count > 1`, []string{"fleetlimit:policy_versions:count"}},
		{`x * on (i) group_left (version) y offset 5m unless z{a="sum(q)"}`, []string{"x", "y", "z"}},
		{`count by (job) (count by (job, version) (info))`, []string{"info"}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			if got := selectorNames(tt.expr); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// ruleFile is the part of a Prometheus rule file the test reads.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// namedExpr is an expression and where it comes from.
type namedExpr struct{ where, expr string }

func readRules(t *testing.T) (exprs []namedExpr, recorded map[string]bool) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	recorded = map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
			exprs = append(exprs, namedExpr{rulesFile + ": " + r.Record + r.Alert, r.Expr})
		}
	}
	if len(exprs) == 0 {
		t.Fatalf("%s: no rules", rulesFile)
	}
	return exprs, recorded
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Panels     []dashboardPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type dashboardPanel struct {
	Title      string           `json:"title"`
	Type       string           `json:"type"`
	Panels     []dashboardPanel `json:"panels"` // a collapsed row's
	Datasource struct {
		Type string `json:"type"`
	} `json:"datasource"`
	Targets []struct {
		Expr       string `json:"expr"`
		URL        string `json:"url"`
		Datasource struct {
			Type string `json:"type"`
		} `json:"datasource"`
		Columns []struct {
			Selector string `json:"selector"`
		} `json:"columns"`
	} `json:"targets"`
	Transformations []struct {
		ID      string `json:"id"`
		Options struct {
			Fields map[string]json.RawMessage `json:"fields"`
		} `json:"options"`
	} `json:"transformations"`
}

// infinity is the JSON data source plugin the table of GET /admin/top
// reads through.
const infinity = "yesoreyeram-infinity-datasource"

// labelValues is a Grafana variable's query: label_values(<selector>, <label>).
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

func readDashboard(t *testing.T) []namedExpr {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var exprs []namedExpr
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
			}
			for _, q := range p.Targets {
				if q.Datasource.Type == infinity {
					continue // not PromQL: TestDashboardTopTable
				}
				exprs = append(exprs, namedExpr{dashboardFile + ": panel " + p.Title, q.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("%s: variable %s: query %q is not label_values(selector, label)", dashboardFile, v.Name, v.Definition)
			continue
		}
		exprs = append(exprs, namedExpr{dashboardFile + ": variable " + v.Name, m[1]})
	}
	if len(exprs) == 0 {
		t.Fatalf("%s: no queries", dashboardFile)
	}
	return exprs
}

// TestRulesAndDashboardNameExportedSeries: every series that an alerting or
// recording rule of prometheus/rules.yml or a panel of
// grafana/fleetlimit.json selects is one the service exports, one a
// recording rule makes, or one Prometheus makes itself.
func TestRulesAndDashboardNameExportedSeries(t *testing.T) {
	exported := exportedSeries(t)
	ruleExprs, recorded := readRules(t)
	for name := range pendingSeries {
		if exported[name] {
			t.Errorf("%s is exported now: remove it from pendingSeries", name)
		}
	}
	used := map[string]bool{}
	for _, e := range append(ruleExprs, readDashboard(t)...) {
		names := selectorNames(e.expr)
		if len(names) == 0 {
			t.Errorf("%s: %q selects no series", e.where, e.expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] && !recorded[n] && !syntheticSeries[n] && !pendingSeries[n] {
				t.Errorf("%s: %q names %s, which the service does not export", e.where, e.expr, n)
			}
		}
	}
	for name := range recorded {
		if !used[name] {
			t.Errorf("recording rule %s is used by no alert and no panel", name)
		}
	}
}

// TestDashboardTopTable: the dashboard's table of the identities refused
// most reads GET /admin/top?format=rows of each of the four instances
// through the JSON data source, and every field it selects, groups or sums
// is a key of that answer's rows (topRow), so that a renamed field breaks
// this test rather than the panel.
func TestDashboardTopTable(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for f := range reflect.TypeFor[topRow]().Fields() {
		keys[strings.Split(f.Tag.Get("json"), ",")[0]] = true
	}
	found := 0
	for _, p := range d.Panels {
		if p.Datasource.Type != infinity {
			continue
		}
		found++
		if p.Type != "table" || len(p.Targets) != 4 {
			t.Fatalf("panel %q: a %s of %d queries, want a table of one per instance", p.Title, p.Type, len(p.Targets))
		}
		for i, q := range p.Targets {
			if want := fmt.Sprintf("http://app%d:9090/admin/top?format=rows", i+1); q.Datasource.Type != infinity || q.URL != want {
				t.Errorf("panel %q query %d: %s %q, want %s %q", p.Title, i, q.Datasource.Type, q.URL, infinity, want)
			}
			for _, c := range q.Columns {
				if !keys[c.Selector] {
					t.Errorf("panel %q query %d selects %q, not a field of GET /admin/top?format=rows (%v)", p.Title, i, c.Selector, keys)
				}
			}
		}
		grouped := 0
		for _, tr := range p.Transformations {
			for f := range tr.Options.Fields {
				grouped++
				if !keys[f] {
					t.Errorf("panel %q: transformation %s names %q, not a field of the rows", p.Title, tr.ID, f)
				}
			}
		}
		if grouped == 0 {
			t.Errorf("panel %q: nothing groups the four instances' rows", p.Title)
		}
	}
	if found != 1 {
		t.Fatalf("%d panels read GET /admin/top, want 1", found)
	}
}

// TestRecoveryCollectorReadsTheStatus: the restores, raises and lost
// writes come from the resilient limiter's status at scrape time; without
// one (memory mode), none is exported.
func TestRecoveryCollectorReadsTheStatus(t *testing.T) {
	collect := func(st Status) map[string]float64 {
		c := &recoveryCollector{status: func() Status { return st }}
		ch := make(chan prometheus.Metric, 8)
		c.Collect(ch)
		close(ch)
		out := map[string]float64{}
		for m := range ch {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				t.Fatal(err)
			}
			name := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(m.Desc().String())[1]
			out[name] = pb.GetCounter().GetValue()
		}
		return out
	}
	got := collect(Status{Limiter: &resilient.Status{Restores: 1, Raises: 2, LostWrites: 3}})
	want := map[string]float64{"ratelimit_restores_total": 1, "ratelimit_raises_total": 2, "ratelimit_lost_writes_total": 3}
	if !maps.Equal(got, want) {
		t.Errorf("with a resilient limiter: %v, want %v", got, want)
	}
	if got := collect(Status{}); len(got) != 0 {
		t.Errorf("without one: %v, want nothing", got)
	}
}
