package main

import (
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/term"

	"github.com/fleetlimit/fleetlimit/loadtest/progress"
)

// display receives the command's lines (the rows as they are measured, the
// files written): stdout, or, when stdout and stderr are the same
// terminal, the progress display, which then keeps its status block below
// them (newLive).
var display io.Writer = os.Stdout

// live shows the run's progress on stderr (package progress): on a
// terminal, the row being measured and its decisions per second as they
// happen; elsewhere a line per round. The decisions are counted per
// goroutine, each counter on a cache line of its own, so that counting
// adds no contention to the loop being measured.
type live struct {
	prog    *progress.Reporter
	current atomic.Pointer[[]counter] // the slice being measured
	endedOK atomic.Int64              // decisions of the slices that ended
	endedKO atomic.Int64              // and their errors
}

type counter struct {
	ok, errs atomic.Int64
	_        [48]byte
}

func newLive() *live {
	l := &live{}
	l.prog = progress.New(os.Stderr, progress.WithCounter(l.counts))
	if l.prog.Terminal() && term.IsTerminal(int(os.Stdout.Fd())) {
		display = l.prog
	}
	l.prog.Reset("bench")
	return l
}

// begin starts a slice of row name at g goroutines: counter i is goroutine
// i's.
func (l *live) begin(name string, g int) []counter {
	cs := make([]counter, g)
	l.current.Store(&cs)
	l.prog.Detail(fmt.Sprintf("%s at %d goroutines", name, g))
	return cs
}

// end adds a finished slice's counts to the run's.
func (l *live) end(cs []counter) {
	var ok, errs int64
	for i := range cs {
		ok += cs[i].ok.Load()
		errs += cs[i].errs.Load()
	}
	l.endedOK.Add(ok)
	l.endedKO.Add(errs)
	l.current.Store(nil)
}

// counts is the run's decisions so far (progress.WithCounter).
func (l *live) counts() progress.Counts {
	c := progress.Counts{OK: l.endedOK.Load(), Errors: l.endedKO.Load()}
	if cs := l.current.Load(); cs != nil {
		for i := range *cs {
			c.OK += (*cs)[i].ok.Load()
			c.Errors += (*cs)[i].errs.Load()
		}
	}
	return c
}
