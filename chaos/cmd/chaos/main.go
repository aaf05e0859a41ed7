// Command chaos runs the chaos suite (README.md, "Running the chaos suite")
// against the native stack (-stack local: it starts and stops the stack
// itself, once per scenario) or the compose stack (-stack compose), and
// writes chaos-out/. It exits 1 when any invariant fails, 2 when the suite
// itself could not run.
//
//	go run ./chaos/cmd/chaos -stack local -scenarios redis-pause
//	go run ./chaos/cmd/chaos -reanalyze -out chaos-out   # recompute the reports from the logs
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/report"
	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/fleetlimit/fleetlimit/chaos/suite"
	"github.com/fleetlimit/fleetlimit/loadtest"
	"github.com/fleetlimit/fleetlimit/loadtest/progress"
)

// errFailed: the suite ran and an invariant failed.
var errFailed = errors.New("invariants failed")

func main() {
	quietGC(os.Getenv)
	oneProc(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, errFailed):
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
}

// quietGC keeps the load generator's own garbage collection out of the
// latencies it measures. Its heap grows by the request log, and each
// collection's mark phase takes a core from the stack under test and
// delays the requests sent meanwhile (GODEBUG=gctrace=1 puts the
// collections beside the latency bursts). So it collects only past a
// memory limit of 256 MiB (a few times per scenario) and once before each
// scenario's load, unless GOGC or GOMEMLIMIT say otherwise; a much higher
// limit lets its resident memory grow until it slows the stack's own
// restarts. The stack's own processes are not affected.
func quietGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(-1)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(256 << 20)
	}
}

// oneProc runs the suite on one P unless GOMAXPROCS says otherwise. Its load
// is the contract's fixed mix (about 900 requests a second) and its analysis
// is sequential; a P per core spends CPU on threads woken and parked against
// the stack's own processes, CPU the stack under test needs.
func oneProc(getenv func(string) string) {
	if getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		stackName = fs.String("stack", "local", "the stack: local (native processes) or compose")
		scenarios = fs.String("scenarios", "", "comma-separated scenarios (default: $SCENARIOS, else all: "+strings.Join(suite.Names(), ",")+")")
		out       = fs.String("out", "chaos-out", "output directory")
		root      = fs.String("root", "", "repository root (default: found upwards from the working directory)")
		warmup    = fs.Duration("warmup", 0, "warmup phase (default: one window)")
		healthy   = fs.Duration("healthy", 0, "healthy phase (default: one window)")
		fault     = fs.Duration("fault", 15*time.Second, "fault duration")
		flap      = fs.Duration("flap", 20*time.Second, "redis-flap: span of its four kill/restart cycles")
		recovery  = fs.Duration("recovery", 0, "recovery phase (default: two windows)")
		settle    = fs.Duration("settle", 0, "settle phase (default: one window)")
		prime     = fs.Duration("prime", 0, "load on keys of their own before the measured run, then wait until every instance decides in Redis (default 3s; negative: none)")
		quick     = fs.Bool("quick", false, "development only: fault 5 s, flap 8 s (not the contract's durations)")
		timeout   = fs.Duration("redis-timeout", 100*time.Millisecond, "the apps' Redis call timeout, for the latency bound of fault and recovery (used unless /status reports redis_timeout_ms)")
		seed      = fs.Uint64("seed", 1, "seed of the load's send schedule")
		reanalyze = fs.Bool("reanalyze", false, "recompute report.json, report.html and summary.json from the logs under -out (and the results page given by -doc); runs no stack")
		doc       = fs.String("doc", "", "the results page whose section for this stack the run rewrites (default: docs/CHAOS.md under -root; \"-\": none)")
		cpuprof   = fs.String("cpuprofile", "", "write the suite's own CPU profile (its load generator and analysis) to this file")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	stopProfile, err := loadtest.StartCPUProfile(*cpuprof)
	if err != nil {
		return err
	}
	defer stopProfile()
	list := *scenarios
	if list == "" {
		list = getenv("SCENARIOS")
	}
	selected, err := suite.Select(list)
	if err != nil {
		return err
	}
	if *root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if *root, err = stack.FindRoot(wd); err != nil {
			return err
		}
	}
	if *reanalyze {
		// The results page only when named: reports reanalyzed from
		// elsewhere are not the latest results.
		err := reanalyzeAll(*out, *stackName, selected, stdout)
		if *doc != "" && *doc != "-" {
			if derr := writeDoc(*doc, *stackName, *out, selected); derr != nil {
				fmt.Fprintln(stderr, "chaos: writing", *doc+":", derr)
			}
		}
		return err
	}
	if *doc == "" {
		*doc = filepath.Join(*root, "docs", "CHAOS.md")
	}
	// On a terminal, a status block (each scenario's phase, requests per
	// second, 2xx / 429 / errors, each instance's mode) below the log;
	// elsewhere, a line per phase. Everything the run logs goes through it.
	prog := progress.New(stderr)
	log := io.Writer(prog)
	outDir := *out
	if !filepath.IsAbs(outDir) {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		outDir = filepath.Join(wd, outDir)
	}
	var st stack.Stack
	switch *stackName {
	case "local":
		st = stack.NewLocal(*root, log)
	case "compose":
		c := stack.NewCompose(*root, log)
		c.LogFile = filepath.Join(outDir, "compose.log")
		st = c
	default:
		return fmt.Errorf("-stack %q: want local or compose", *stackName)
	}
	d := suite.Durations{Warmup: *warmup, Healthy: *healthy, Fault: *fault, Flap: *flap, Recovery: *recovery, Settle: *settle, Prime: *prime}
	if *quick {
		d.Fault, d.Flap = 5*time.Second, 8*time.Second
		fmt.Fprintln(stderr, "chaos: -quick: fault 5 s, flap 8 s (development durations, not the contract's)")
	}
	prog.Start()
	sum, err := suite.Run(ctx, suite.Config{
		Stack:        st,
		Scenarios:    selected,
		Out:          outDir,
		Durations:    d,
		RedisTimeout: *timeout,
		Seed:         *seed,
		// The stacks' apps and this suite read the same variable; both
		// default to the demo secret.
		APIKeySecret: os.Getenv("RL_API_KEY_SECRET"),
		Log:          log,
		Progress:     prog,
	})
	prog.Stop()
	printSummary(stdout, sum, outDir)
	if err != nil {
		return err
	}
	if *doc != "-" {
		if derr := writeDoc(*doc, sum.Stack, outDir, selected); derr != nil {
			fmt.Fprintln(stderr, "chaos: writing", *doc+":", derr)
		} else {
			fmt.Fprintln(stdout, "results table:", *doc)
		}
	}
	if !sum.Pass {
		return errFailed
	}
	return nil
}

func printSummary(w io.Writer, sum report.Summary, out string) {
	fmt.Fprintf(w, "\nchaos suite (%s stack), reports in %s:\n", sum.Stack, out)
	for _, s := range sum.Scenarios {
		verdict := "FAIL"
		switch {
		case s.Skipped:
			verdict = "SKIPPED (" + s.SkipReason + ")"
		case s.Pass:
			verdict = "PASS"
		case s.Error != "":
			verdict = "FAIL (error: " + s.Error + ")"
		case len(s.Failed) > 0:
			verdict = fmt.Sprintf("FAIL (%d invariants)", len(s.Failed))
		}
		fmt.Fprintf(w, "  %-14s %s\n", s.Name, verdict)
	}
	if sum.Pass {
		fmt.Fprintln(w, "overall: PASS")
	} else {
		fmt.Fprintln(w, "overall: FAIL")
	}
}

// writeDoc renders the reports of the selected scenarios under out into the
// results page at path.
func writeDoc(path, stackName, out string, selected []suite.Scenario) error {
	var reports []*report.Report
	for _, sc := range selected {
		rep, err := report.ReadReport(filepath.Join(out, sc.Name, "report.json"))
		if err != nil {
			continue // not run (the suite stopped early)
		}
		reports = append(reports, rep)
	}
	return report.WriteDoc(path, stackName, reports, suite.Names())
}

// reanalyzeAll recomputes the reports of the selected scenarios that have a
// directory under out.
func reanalyzeAll(out, stackName string, selected []suite.Scenario, stdout io.Writer) error {
	var reports []*report.Report
	for _, sc := range selected {
		dir := filepath.Join(out, sc.Name)
		if _, err := os.Stat(filepath.Join(dir, "report.json")); err != nil {
			continue
		}
		rep, err := suite.Reanalyze(dir)
		if err != nil {
			return err
		}
		stackName = rep.Stack
		reports = append(reports, rep)
	}
	if len(reports) == 0 {
		return fmt.Errorf("no scenario reports under %s", out)
	}
	sum := report.Summarize(stackName, reports)
	if err := report.WriteJSON(filepath.Join(out, "summary.json"), sum); err != nil {
		return err
	}
	printSummary(stdout, sum, out)
	if !sum.Pass {
		return errFailed
	}
	return nil
}
