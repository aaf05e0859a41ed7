// The HTML report: one page rendered from one template, and the data it
// needs (charts, tables), computed here.

package report

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetlimit/fleetlimit/chaos/invariant"
)

// The page is one self-contained file: inline CSS, inline SVG, no script.

const (
	chartW     = 960 // plot width, px
	chartH     = 150 // plot height, px
	marginL    = 48
	marginR    = 12
	marginT    = 18
	marginB    = 22
	bandH      = 16 // one instance's mode band
	bandLabelW = 48
)

// modeColors are the band colours per X-RateLimit-Mode.
var modeColors = map[string]string{
	"redis":  "#2e7d32",
	"local":  "#f9a825",
	"open":   "#c62828",
	"closed": "#6a1b9a",
	"memory": "#1565c0",
	"":       "#9e9e9e", // no mode header (errors)
}

type rect struct {
	X, Y, W, H float64
	Fill       string
	Title      string
}

type line struct {
	X1, Y1, X2, Y2 float64
	Label          string
}

type chart struct {
	Title             string
	W, H              int
	Admitted, Limited string // polyline points
	Errors            string
	Shades            []rect
	Overlays          []rect // drawn over the bands
	Marks             []line
	YTicks            []line
	XTicks            []line
	Bands             []rect
}

type tableRow struct {
	Name, Route, Phase, Measured, Bound string
	Pass                                bool
}

type page struct {
	R          *Report
	Title      string
	Charts     []chart
	Modes      chart
	Rows       []tableRow
	Legend     []rect
	Failed     int
	PolicyText []string
}

// RenderHTML writes the scenario's page: admitted and limited requests per
// second per route, each instance's mode as a band, the fault windows
// shaded, and the invariant table.
func RenderHTML(w io.Writer, r *Report, reqs []invariant.Request) error {
	p := page{R: r, Title: "chaos: " + r.Scenario}
	start, end := timeRange(r, reqs)
	secs := int(math.Ceil((end - start) / 1000))
	if secs < 1 {
		secs = 1
	}
	xOf := func(ms float64) float64 {
		return marginL + (ms-start)/(end-start)*chartW
	}
	shades, marks := faultShades(r, xOf), phaseMarks(r, xOf)

	for _, route := range r.Routes() {
		adm := make([]int, secs)
		lim := make([]int, secs)
		errs := make([]int, secs)
		for _, q := range reqs {
			if q.Route != route {
				continue
			}
			i := int((q.TRecvMS - start) / 1000)
			if i < 0 || i >= secs {
				continue
			}
			switch {
			case q.Admitted():
				adm[i]++
			case q.Limited():
				lim[i]++
			case q.Failed():
				errs[i]++
			}
		}
		ymax := 1
		for i := range secs {
			ymax = max(ymax, adm[i], lim[i], errs[i])
		}
		ymax = niceCeil(ymax)
		yOf := func(v int) float64 { return marginT + chartH - float64(v)/float64(ymax)*chartH }
		points := func(v []int) string {
			var sb strings.Builder
			for i, n := range v {
				x := xOf(start + (float64(i)+0.5)*1000)
				fmt.Fprintf(&sb, "%.1f,%.1f ", x, yOf(n))
			}
			return strings.TrimSpace(sb.String())
		}
		c := chart{
			Title: route + policyText(r.Policies[route]), W: marginL + chartW + marginR, H: marginT + chartH + marginB,
			Admitted: points(adm), Limited: points(lim), Errors: points(errs),
			Shades: withHeight(shades, marginT, chartH), Marks: withHeight(marks, marginT, chartH),
		}
		for _, v := range []int{0, ymax / 2, ymax} {
			c.YTicks = append(c.YTicks, line{X1: marginL, X2: marginL + chartW, Y1: yOf(v), Y2: yOf(v), Label: strconv.Itoa(v)})
		}
		c.XTicks = xTicks(start, end, xOf, marginT+chartH)
		p.Charts = append(p.Charts, c)
	}

	// Mode bands: per instance, per second, the mode of most answers.
	instances := map[string]map[int]map[string]int{}
	for _, q := range reqs {
		if q.Instance == "" {
			continue
		}
		i := int((q.TRecvMS - start) / 1000)
		if i < 0 || i >= secs {
			continue
		}
		if instances[q.Instance] == nil {
			instances[q.Instance] = map[int]map[string]int{}
		}
		if instances[q.Instance][i] == nil {
			instances[q.Instance][i] = map[string]int{}
		}
		instances[q.Instance][i][q.Mode]++
	}
	names := make([]string, 0, len(instances))
	for n := range instances {
		names = append(names, n)
	}
	sort.Strings(names)
	bandsH := float64(len(names)) * (bandH + 4)
	p.Modes = chart{Title: "mode per instance (the mode of most answers in each second)", W: marginL + chartW + marginR, H: int(marginT + bandsH + marginB)}
	p.Modes.Overlays = withHeight(shades, marginT-2, bandsH+2)
	p.Modes.Marks = withHeight(marks, marginT, bandsH)
	p.Modes.XTicks = xTicks(start, end, xOf, marginT+bandsH)
	secW := chartW / float64(secs)
	for bi, n := range names {
		y := marginT + float64(bi)*(bandH+4)
		p.Modes.YTicks = append(p.Modes.YTicks, line{X1: marginL - 4, Y1: y + bandH - 3, Label: n})
		for s := range secs {
			counts := instances[n][s]
			if len(counts) == 0 {
				continue
			}
			mode, total := dominant(counts)
			fill, ok := modeColors[mode]
			if !ok {
				fill = "#000000"
			}
			p.Modes.Bands = append(p.Modes.Bands, rect{
				X: marginL + float64(s)*secW, Y: y, W: secW + 0.3, H: bandH, Fill: fill,
				Title: fmt.Sprintf("%s at +%ds: %s (%d of %d answers)", n, s, orNone(mode), counts[mode], total),
			})
		}
	}
	for _, m := range []string{"redis", "local", "open", "closed", "memory", ""} {
		p.Legend = append(p.Legend, rect{Fill: modeColors[m], Title: orNone(m)})
	}

	for _, row := range r.Invariants {
		p.Rows = append(p.Rows, tableRow{
			Name: row.Name, Route: row.Route, Phase: row.Phase,
			Measured: FormatValue(row.Measured), Bound: boundText(row), Pass: row.Pass,
		})
		if !row.Pass {
			p.Failed++
		}
	}
	for _, route := range r.Routes() {
		p.PolicyText = append(p.PolicyText, route+policyText(r.Policies[route]))
	}
	return pageTmpl.Execute(w, p)
}

func orNone(mode string) string {
	if mode == "" {
		return "no mode (error)"
	}
	return mode
}

func dominant(counts map[string]int) (string, int) {
	best, bestN, total := "", -1, 0
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		total += counts[k]
		if counts[k] > bestN {
			best, bestN = k, counts[k]
		}
	}
	return best, total
}

func timeRange(r *Report, reqs []invariant.Request) (float64, float64) {
	start, end := math.Inf(1), math.Inf(-1)
	for _, p := range r.Phases {
		start, end = math.Min(start, p.StartMS), math.Max(end, p.EndMS)
	}
	if math.IsInf(start, 1) {
		for _, q := range reqs {
			start, end = math.Min(start, q.TSendMS), math.Max(end, q.TRecvMS)
		}
	}
	if math.IsInf(start, 1) || end <= start {
		return 0, 1000
	}
	return start, end
}

// faultShades are the fault phase and the spans between paired fault
// events (down/up, start/end), as x ranges.
func faultShades(r *Report, xOf func(float64) float64) []rect {
	var out []rect
	for _, p := range r.Phases {
		if p.Name == invariant.Fault {
			out = append(out, rect{X: xOf(p.StartMS), W: xOf(p.EndMS) - xOf(p.StartMS), Fill: "#ffcdd2", Title: "fault phase"})
		}
	}
	open := map[string]float64{}
	for _, e := range r.Events {
		kind, edge, ok := strings.Cut(e.Event, "_")
		if !ok {
			continue
		}
		switch edge {
		case "down", "start":
			if kind != "phase" {
				open[kind] = e.TMS
			}
		case "up", "end":
			if t, ok := open[kind]; ok {
				out = append(out, rect{X: xOf(t), W: xOf(e.TMS) - xOf(t), Fill: "#ef9a9a", Title: strings.TrimSpace(kind + " fault " + e.Detail)})
				delete(open, kind)
			}
		}
	}
	return out
}

func phaseMarks(r *Report, xOf func(float64) float64) []line {
	var out []line
	for _, p := range r.Phases {
		x := xOf(p.StartMS)
		out = append(out, line{X1: x, X2: x, Label: p.Name})
	}
	return out
}

func withHeight[T rect | line](in []T, y, h float64) []T {
	out := make([]T, len(in))
	for i, v := range in {
		switch x := any(&v).(type) {
		case *rect:
			x.Y, x.H = y, h
		case *line:
			x.Y1, x.Y2 = y, y+h
		}
		out[i] = v
	}
	return out
}

func xTicks(start, end float64, xOf func(float64) float64, y float64) []line {
	var out []line
	span := (end - start) / 1000
	step := 10.0
	if span > 200 {
		step = 30
	}
	for s := 0.0; s <= span; s += step {
		x := xOf(start + s*1000)
		out = append(out, line{X1: x, X2: x, Y1: y, Y2: y + 4, Label: strconv.Itoa(int(s)) + "s"})
	}
	return out
}

// niceCeil is the smallest of 2, 5, 10, 20, 50, 100, ... at least v.
func niceCeil(v int) int {
	for p := 1; ; p *= 10 {
		for _, m := range []int{2, 5, 10} {
			if m*p >= v {
				return m * p
			}
		}
	}
}

func policyText(p Policy) string {
	switch {
	case p.Capacity != nil && p.RefillPerS != nil:
		return fmt.Sprintf(" (%s, capacity %d, refill %g/s)", p.Algorithm, *p.Capacity, *p.RefillPerS)
	case p.Limit != nil && p.WindowMS != nil:
		return fmt.Sprintf(" (%s, limit %d per %d ms)", p.Algorithm, *p.Limit, *p.WindowMS)
	}
	return ""
}

// FormatValue renders a measured value or bound for people.
func FormatValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "—"
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case int:
		return strconv.Itoa(x)
	case string:
		return x
	case invariant.Reconciliation:
		return fmt.Sprintf("local_grants %d + inherited %d - handed_over %d = replayed %d (present %d) + dropped_expired %d + duplicates_refused %d + journaled %d; imbalance %d",
			x.GrantedLocally, x.Inherited, x.HandedOver, x.Replayed, x.Present, x.DroppedExpired, x.DuplicatesRefused, x.Journaled, x.Imbalance)
	}
	return fmt.Sprint(v)
}

func boundText(row invariant.Row) string {
	if s, ok := row.Bound.(string); ok {
		return s
	}
	op := "≤ "
	if row.Name == invariant.Goodput {
		op = "≥ "
	}
	return op + FormatValue(row.Bound)
}

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"dur": func(start, end float64) float64 { return (end - start) / 1000 },
	"t0": func(r *Report) float64 {
		if len(r.Phases) > 0 {
			return r.Phases[0].StartMS
		}
		if len(r.Events) > 0 {
			return r.Events[0].TMS
		}
		return 0
	},
	"rel": func(t0, t float64) float64 { return (t - t0) / 1000 },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #212121; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 24px 0 6px; }
.verdict { font-weight: bold; padding: 2px 8px; border-radius: 3px; color: #fff; }
.pass { background: #2e7d32; } .fail { background: #c62828; } .skip { background: #757575; }
table { border-collapse: collapse; margin-top: 8px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
tr.bad td { background: #ffebee; }
td.ok { color: #2e7d32; font-weight: bold; } td.no { color: #c62828; font-weight: bold; }
svg { display: block; margin: 4px 0 12px; }
svg text { font: 11px system-ui, sans-serif; fill: #424242; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
code { background: #f5f5f5; padding: 0 3px; }
</style>
</head>
<body>
<h1>{{.R.Scenario}} <span class="verdict {{if .R.Skipped}}skip{{else if .R.Pass}}pass{{else}}fail{{end}}">{{if .R.Skipped}}SKIPPED{{else if .R.Pass}}PASS{{else}}FAIL{{end}}</span></h1>
<div>{{.R.Fault}} — stack <code>{{.R.Stack}}</code>, run <code>{{.R.RunID}}</code>{{if not .R.Skipped}}, {{.Failed}} of {{len .Rows}} invariants failing{{end}}</div>
{{if .R.Skipped}}<p><b>Skipped:</b> {{.R.SkipReason}}</p>{{end}}
{{if .R.Error}}<p><b>Error:</b> {{.R.Error}}</p>{{end}}
<div>{{range .PolicyText}}<div><code>{{.}}</code></div>{{end}}</div>
<div>phases: {{range .R.Phases}}<code>{{.Name}}</code> {{printf "%.1f" (dur .StartMS .EndMS)}} s; {{end}}</div>

<h2>Requests per second by t_recv</h2>
<div class="legend"><span><i style="background: #2e7d32"></i>admitted (2xx)</span><span><i style="background: #ef6c00"></i>limited (429)</span><span><i style="background: #c62828"></i>errors (5xx, transport)</span><span><i style="background: #ffcdd2"></i>fault phase</span><span><i style="background: #ef9a9a"></i>fault events (down to up)</span></div>
{{range .Charts}}{{template "chart" .}}{{end}}

<h2>Mode per instance</h2>
<div class="legend">{{range .Legend}}<span><i style="background: {{.Fill}}"></i>{{.Title}}</span>{{end}}<span><i style="background: #ffcdd2"></i>fault phase</span></div>
{{template "chart" .Modes}}

<h2>Invariants</h2>
<table>
<tr><th>invariant</th><th>route</th><th>phase</th><th>measured</th><th>bound</th><th>pass</th></tr>
{{range .Rows}}<tr{{if not .Pass}} class="bad"{{end}}><td>{{.Name}}</td><td>{{.Route}}</td><td>{{.Phase}}</td><td>{{.Measured}}</td><td>{{.Bound}}</td>{{if .Pass}}<td class="ok">pass</td>{{else}}<td class="no">FAIL</td>{{end}}</tr>
{{end}}</table>

{{if .R.Failover}}<h2>Failover and recovery per instance</h2>
<table><tr><th>instance</th><th>failover ms</th><th>recovery ms</th></tr>
{{range .R.Failover}}<tr><td>{{.Instance}}</td><td>{{.FailoverMS}}</td><td>{{.RecoveryMS}}</td></tr>{{end}}
</table><p>-1: no such answer.</p>{{end}}

<h2>Events</h2>
<table><tr><th>t (s)</th><th>event</th><th>detail</th></tr>
{{$t0 := t0 .R}}{{range .R.Events}}<tr><td>{{printf "%.3f" (rel $t0 .TMS)}}</td><td>{{.Event}}</td><td>{{with .Instance}}{{.}}: {{end}}{{with .Key}}{{.}} {{end}}{{.Detail}}</td></tr>
{{end}}</table>
</body>
</html>
{{define "chart"}}<div><b>{{.Title}}</b></div>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.W}}" height="{{.H}}" viewBox="0 0 {{.W}} {{.H}}">
{{range .Shades}}<rect x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Fill}}" fill-opacity="0.6"><title>{{.Title}}</title></rect>
{{end}}{{range .YTicks}}{{if .X2}}<line x1="{{.X1}}" y1="{{.Y1}}" x2="{{.X2}}" y2="{{.Y2}}" stroke="#e0e0e0"/>{{end}}<text x="{{.X1}}" y="{{.Y1}}" dx="-4" dy="3" text-anchor="end">{{.Label}}</text>
{{end}}{{range .Bands}}<rect x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Fill}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Overlays}}<rect x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="#ffffff" fill-opacity="0.25" stroke="#b71c1c" stroke-dasharray="4,2"><title>{{.Title}}</title></rect>
{{end}}{{range .Marks}}<line x1="{{.X1}}" y1="{{.Y1}}" x2="{{.X2}}" y2="{{.Y2}}" stroke="#616161" stroke-dasharray="3,3"/><text x="{{.X1}}" y="{{.Y1}}" dx="3" dy="-4">{{.Label}}</text>
{{end}}{{range .XTicks}}<line x1="{{.X1}}" y1="{{.Y1}}" x2="{{.X2}}" y2="{{.Y2}}" stroke="#616161"/><text x="{{.X1}}" y="{{.Y2}}" dy="11" text-anchor="middle">{{.Label}}</text>
{{end}}{{if .Admitted}}<polyline fill="none" stroke="#2e7d32" stroke-width="1.5" points="{{.Admitted}}"/>
<polyline fill="none" stroke="#ef6c00" stroke-width="1.5" points="{{.Limited}}"/>
<polyline fill="none" stroke="#c62828" stroke-width="1.5" points="{{.Errors}}"/>{{end}}
</svg>{{end}}
`))
