// Package progress shows how a load run is going while it runs (loadtest,
// the chaos suite, make bench). On a terminal it keeps a status block at the
// bottom of the screen, redrawn in place a few times a second: the run, its
// current phase and how long both have lasted, requests per second, 2xx /
// 429 / errors, and the mode each instance answered with last (from the
// X-Served-By and X-RateLimit-Mode headers). Anywhere else (a CI log) it
// writes one line per phase when the phase ends, with the same figures over
// the phase. Other output of the run goes through the Reporter's Write, so
// that on a terminal it scrolls above the block instead of through it.
//
// Terminal detection and width come from golang.org/x/term; the redraw is
// two ANSI sequences (cursor up, erase line), which every terminal emulator
// in use understands. TERM=dumb counts as no terminal.
package progress

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/fleetlimit/fleetlimit/loadtest"
)

// Counts are answers by kind.
type Counts struct {
	OK      int64 // 2xx (or, for make bench, decisions without an error)
	Limited int64 // 429
	Errors  int64 // transport errors and 5xx
}

// Total is every answer counted.
func (c Counts) Total() int64 { return c.OK + c.Limited + c.Errors }

func (c Counts) minus(d Counts) Counts {
	return Counts{OK: c.OK - d.OK, Limited: c.Limited - d.Limited, Errors: c.Errors - d.Errors}
}

// maxInstances bounds the instances whose modes are tracked; answers from
// more (the header comes from the servers) are counted under "other".
const maxInstances = 32

// Reporter tracks a run and shows its progress. Make it with New; its
// methods are safe for concurrent use and do nothing on a nil *Reporter, so
// that code which reports progress can run without.
type Reporter struct {
	out      io.Writer
	terminal bool
	width    func() int
	every    time.Duration
	now      func() time.Time
	poll     func() Counts

	mu       sync.Mutex
	title    string
	phase    string
	detail   string
	start    time.Time
	phaseAt  time.Time
	counts   Counts            // pushed by Record and Add
	atPhase  Counts            // counts (pushed and polled) when the phase began
	modes    map[string]string // instance -> the mode of its last answer
	byMode   map[string]int64  // "instance mode" -> answers in this phase
	rateAt   time.Time         // the last rate sample
	rateN    int64             // the total then
	rate     float64           // answers per second between the last two samples
	drawn    int               // lines of the status block on screen
	running  bool
	stop     chan struct{}
	finished chan struct{}
}

// Option configures a Reporter.
type Option func(*Reporter)

// WithTerminal forces terminal mode on or off (default: whether the writer
// is a terminal, and TERM is not "dumb").
func WithTerminal(on bool) Option { return func(r *Reporter) { r.terminal = on } }

// WithInterval sets how often the status block is redrawn (250 ms).
func WithInterval(d time.Duration) Option { return func(r *Reporter) { r.every = d } }

// WithClock sets the clock (time.Now).
func WithClock(now func() time.Time) Option { return func(r *Reporter) { r.now = now } }

// WithCounter adds counts the Reporter reads itself at each redraw and
// phase end, for a run whose answers are too many to push one at a time
// (make bench): f returns the totals so far.
func WithCounter(f func() Counts) Option { return func(r *Reporter) { r.poll = f } }

// WithWidth sets how the terminal's width is read (the writer's, through
// golang.org/x/term; 100 when unknown). Lines are cut to it: a line that
// wrapped would break the redraw.
func WithWidth(f func() int) Option { return func(r *Reporter) { r.width = f } }

// New returns a Reporter writing to out.
func New(out io.Writer, opts ...Option) *Reporter {
	r := &Reporter{out: out, every: 250 * time.Millisecond, now: time.Now,
		modes: map[string]string{}, byMode: map[string]int64{}}
	f, isFile := out.(*os.File)
	r.terminal = isFile && term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb"
	r.width = func() int {
		if isFile {
			if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 0 {
				return w
			}
		}
		return 100
	}
	for _, o := range opts {
		o(r)
	}
	r.start, r.phaseAt, r.rateAt = r.now(), r.now(), r.now()
	return r
}

// Terminal reports whether the Reporter redraws a status block.
func (r *Reporter) Terminal() bool { return r != nil && r.terminal }

// Start starts redrawing the status block (on a terminal; elsewhere it
// does nothing) until Stop.
func (r *Reporter) Start() {
	if r == nil || !r.terminal {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return
	}
	r.running, r.stop, r.finished = true, make(chan struct{}), make(chan struct{})
	go r.loop(r.stop, r.finished)
}

func (r *Reporter) loop(stop <-chan struct{}, finished chan<- struct{}) {
	defer close(finished)
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			r.mu.Lock()
			r.redraw()
			r.mu.Unlock()
		}
	}
}

// Stop ends the current phase (its line, off a terminal), stops the
// redraws and removes the status block.
func (r *Reporter) Stop() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.endPhase()
	running, stop, finished := r.running, r.stop, r.finished
	r.running = false
	r.mu.Unlock()
	if running {
		close(stop)
		<-finished
	}
	r.mu.Lock()
	r.clear()
	r.mu.Unlock()
}

// Reset starts a new run named title (the chaos suite: one per scenario):
// the current phase ends, and the counts and clocks start again.
func (r *Reporter) Reset(title string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endPhase()
	now := r.now()
	r.title, r.phase, r.detail = title, "", ""
	r.start, r.phaseAt, r.rateAt = now, now, now
	r.counts, r.rate = Counts{}, 0
	r.atPhase = r.totals()
	r.rateN = r.atPhase.Total()
	clear(r.modes)
	clear(r.byMode)
	r.redraw()
}

// Phase ends the current phase (off a terminal: its line) and starts the
// named one.
func (r *Reporter) Phase(name string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endPhase()
	r.phase, r.detail, r.phaseAt = name, "", r.now()
	r.atPhase = r.totals()
	clear(r.byMode)
	r.redraw()
}

// Detail sets a note shown beside the phase on a terminal (make bench: the
// row being measured).
func (r *Reporter) Detail(s string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.detail = s
	r.redraw()
}

// Record counts one answer of a load run.
func (r *Reporter) Record(rec loadtest.Record) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case rec.Admitted():
		r.counts.OK++
	case rec.Limited():
		r.counts.Limited++
	default:
		r.counts.Errors++
	}
	if rec.Instance == "" {
		return
	}
	inst, mode := rec.Instance, rec.Mode
	if mode == "" {
		mode = "?"
	}
	if _, known := r.modes[inst]; !known && len(r.modes) >= maxInstances {
		inst = "other"
	}
	r.modes[inst] = mode
	if k := inst + " " + mode; r.byMode[k] > 0 || len(r.byMode) < 8*maxInstances {
		r.byMode[k]++
	}
}

// Add counts answers counted elsewhere.
func (r *Reporter) Add(c Counts) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts.OK += c.OK
	r.counts.Limited += c.Limited
	r.counts.Errors += c.Errors
}

// Write writes p to the output; on a terminal, above the status block.
// Give it to whatever else the run prints. (A nil *Reporter discards p.)
func (r *Reporter) Write(p []byte) (int, error) {
	if r == nil {
		return len(p), nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clear()
	n, err := r.out.Write(p)
	if r.terminal && len(p) > 0 && p[len(p)-1] != '\n' {
		_, _ = io.WriteString(r.out, "\n") // the block starts on a line of its own
	}
	r.redraw()
	return n, err
}

// totals are the pushed and polled counts. r.mu held.
func (r *Reporter) totals() Counts {
	c := r.counts
	if r.poll != nil {
		p := r.poll()
		c.OK, c.Limited, c.Errors = c.OK+p.OK, c.Limited+p.Limited, c.Errors+p.Errors
	}
	return c
}

// endPhase writes the line of the phase that ends, off a terminal. r.mu
// held.
func (r *Reporter) endPhase() {
	if r.terminal || r.phase == "" {
		return
	}
	now := r.now()
	d := now.Sub(r.phaseAt)
	c := r.totals().minus(r.atPhase)
	var b strings.Builder
	b.WriteString("progress: ")
	if r.title != "" {
		b.WriteString(r.title + ": ")
	}
	fmt.Fprintf(&b, "phase %s, %s: %d answers (%.0f/s), 2xx %d, 429 %d, errors %d",
		r.phase, d.Round(100*time.Millisecond), c.Total(), perSecond(c.Total(), d), c.OK, c.Limited, c.Errors)
	if len(r.byMode) > 0 {
		keys := make([]string, 0, len(r.byMode))
		for k := range r.byMode {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteString("; modes:")
		for _, k := range keys {
			fmt.Fprintf(&b, " %s %d", k, r.byMode[k])
		}
	}
	b.WriteByte('\n')
	_, _ = io.WriteString(r.out, b.String())
}

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// clear removes the status block: the cursor goes to the start of its first
// line, which is erased with everything below. r.mu held.
func (r *Reporter) clear() {
	if !r.terminal || r.drawn == 0 {
		return
	}
	seq := "\r"
	if r.drawn > 1 {
		seq += fmt.Sprintf("\x1b[%dA", r.drawn-1)
	}
	_, _ = io.WriteString(r.out, seq+"\x1b[J")
	r.drawn = 0
}

// redraw replaces the status block with the current figures, on a
// terminal. r.mu held.
func (r *Reporter) redraw() {
	if !r.terminal {
		return
	}
	now := r.now()
	c := r.totals()
	if d := now.Sub(r.rateAt); d >= r.every {
		r.rate = perSecond(c.Total()-r.rateN, d)
		r.rateAt, r.rateN = now, c.Total()
	}
	lines := r.status(now, c)
	width := max(r.width(), 20)
	for i, l := range lines {
		if len(l) >= width {
			lines[i] = l[:width-1]
		}
	}
	r.clear()
	_, _ = io.WriteString(r.out, strings.Join(lines, "\n"))
	r.drawn = len(lines)
}

// status is the text of the status block.
func (r *Reporter) status(now time.Time, c Counts) []string {
	var head strings.Builder
	if r.title != "" {
		head.WriteString(r.title + "  ")
	}
	fmt.Fprintf(&head, "%s", now.Sub(r.start).Round(100*time.Millisecond))
	if r.phase != "" {
		fmt.Fprintf(&head, "  phase %s (%s)", r.phase, now.Sub(r.phaseAt).Round(100*time.Millisecond))
	}
	if r.detail != "" {
		head.WriteString("  " + r.detail)
	}
	lines := []string{head.String(),
		fmt.Sprintf("%.0f/s  2xx %d  429 %d  errors %d", r.rate, c.OK, c.Limited, c.Errors)}
	if len(r.modes) > 0 {
		names := make([]string, 0, len(r.modes))
		for n := range r.modes {
			names = append(names, n)
		}
		slices.Sort(names)
		var b strings.Builder
		b.WriteString("modes:")
		for _, n := range names {
			fmt.Fprintf(&b, "  %s %s", n, r.modes[n])
		}
		lines = append(lines, b.String())
	}
	return lines
}
