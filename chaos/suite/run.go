// Package suite runs the chaos scenarios: for each, a clean stack, the
// contract's load through nginx, the phases warmup, healthy, fault,
// recovery and settle, the fault itself, then the invariants and the
// reports.
package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/chaos/invariant"
	"github.com/fleetlimit/fleetlimit/chaos/report"
	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/fleetlimit/fleetlimit/loadtest"
	"github.com/fleetlimit/fleetlimit/loadtest/progress"
)

// Run runs every scenario and writes summary.json. It returns the summary;
// the error is for failures of the suite itself (not of invariants).
func Run(ctx context.Context, cfg Config) (report.Summary, error) {
	cfg.setDefaults()
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return report.Summary{}, err
	}
	var reports []*report.Report
	for _, sc := range cfg.Scenarios {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(cfg.Log, "\n==> scenario %s: %s\n", sc.Name, sc.Fault)
		cfg.Progress.Reset(sc.Name)
		rep := RunScenario(ctx, cfg, sc)
		cfg.Progress.Phase("")
		reports = append(reports, rep)
		switch {
		case rep.Skipped:
			fmt.Fprintf(cfg.Log, "==> %s: SKIPPED: %s\n", sc.Name, rep.SkipReason)
		case rep.Pass:
			fmt.Fprintf(cfg.Log, "==> %s: PASS\n", sc.Name)
		default:
			fmt.Fprintf(cfg.Log, "==> %s: FAIL", sc.Name)
			if rep.Error != "" {
				fmt.Fprintf(cfg.Log, " (error: %s)", rep.Error)
			}
			fmt.Fprintln(cfg.Log)
			for _, row := range rep.Invariants {
				if !row.Pass {
					fmt.Fprintf(cfg.Log, "    %-15s %-28s %-9s measured %s, bound %v\n",
						row.Name, row.Route, row.Phase, report.FormatValue(row.Measured), report.FormatValue(row.Bound))
				}
			}
		}
		sum := report.Summarize(cfg.Stack.Name(), reports)
		if err := report.WriteJSON(filepath.Join(cfg.Out, "summary.json"), sum); err != nil {
			return sum, err
		}
	}
	sum := report.Summarize(cfg.Stack.Name(), reports)
	if ctx.Err() != nil {
		return sum, ctx.Err()
	}
	return sum, nil
}

// relearn learns the routes' policies again once the load has stopped: a
// route whose policy changed during the run gets the new one in
// rep.Policies, with the one it had before as its Earlier. A route that
// cannot be learned keeps what it had (the log says why).
func relearn(ctx context.Context, cfg Config, info stack.Info, client *http.Client, rep *report.Report) {
	var learned map[string]loadtest.Policy
	err := retry(ctx, 5*time.Second, func() error {
		var err error
		learned, err = loadtest.LearnRoutes(ctx, client, cfg.rls, info.NginxURL, cfg.Routes, rep.RunID+"-end", cfg.APIKeySecret)
		return err
	})
	if err != nil {
		fmt.Fprintf(cfg.Log, "chaos: learning the policies after the run: %v (the first ones stay)\n", err)
		return
	}
	for route, p := range learned {
		ip, err := judgedPolicy(route, p)
		old, ok := rep.Policies[route]
		if err != nil || !ok {
			continue
		}
		now := report.PolicyOf(ip)
		if reflect.DeepEqual(now, old) {
			continue
		}
		earlier := old
		now.Earlier = &earlier
		rep.Policies[route] = now
		fmt.Fprintf(cfg.Log, "    %s: policy changed during the run\n", route)
	}
}

// scenarioRun holds one scenario's streams.
type scenarioRun struct {
	dir    string
	start  time.Time
	mu     sync.Mutex
	events []invariant.Event
	evW    *bufio.Writer
	evF    *os.File
	phases []invariant.Phase
	cpuAt  loadtest.CPUTimes // at the start of the current phase
	cpuOK  bool
	log    io.Writer
	prog   *progress.Reporter
	// status reads every instance's uncounted_requests and lease counters
	// (nil: none).
	status func() (map[string]float64, map[string]invariant.LeaseCounters)
}

func (s *scenarioRun) event(name, detail string) {
	s.action(invariant.Event{Event: name, Detail: detail})
}

// action records e, at the time it is called.
func (s *scenarioRun) action(e invariant.Event) {
	e.TMS = loadtest.UnixMS(time.Now())
	name, detail := e.Event, e.Detail
	if e.Instance != "" {
		detail = e.Instance + ": " + detail
	}
	if e.Key != "" {
		detail = e.Key + " " + detail
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
	if s.evW != nil {
		b, _ := json.Marshal(e)
		_, _ = s.evW.Write(append(b, '\n'))
		_ = s.evW.Flush()
	}
	fmt.Fprintf(s.log, "    %7.1fs  %s %s\n", time.Since(s.start).Seconds(), name, detail)
}

// phase ends the current phase (if any) and starts the named one.
func (s *scenarioRun) phase(name string) {
	now := loadtest.UnixMS(time.Now())
	cpu, cpuOK := loadtest.ReadCPU()
	s.mu.Lock()
	if n := len(s.phases); n > 0 {
		s.phases[n-1].EndMS = now
		if cpuOK && s.cpuOK {
			if busy, steal := loadtest.CPUPercents(s.cpuAt, cpu); !math.IsNaN(busy) {
				s.phases[n-1].CPUBusyPct, s.phases[n-1].CPUStealPct = &busy, &steal
				fmt.Fprintf(s.log, "    %9s  %s: machine CPU busy %.1f%%, steal %.1f%%\n", "", s.phases[n-1].Name, busy, steal)
			}
		}
	}
	s.cpuAt, s.cpuOK = cpu, cpuOK
	s.mu.Unlock()
	var (
		counted map[string]float64
		leases  map[string]invariant.LeaseCounters
	)
	if name != "" && s.status != nil {
		counted, leases = s.status()
	}
	s.mu.Lock()
	if name != "" {
		s.phases = append(s.phases, invariant.Phase{Name: name, StartMS: now, Uncounted: counted, Leases: leases})
	}
	s.mu.Unlock()
	s.prog.Phase(name)
	if name != "" {
		s.event("phase_start", name)
	}
}

// logKeeper is a stack that can keep its processes' logs (the native one):
// RunScenario copies them into the scenario's directory, logs/.
type logKeeper interface {
	KeepLogs(dir string) error
}

// RunScenario runs one scenario and writes its outputs; the report says how
// it went (it is never nil).
func RunScenario(ctx context.Context, cfg Config, sc Scenario) *report.Report {
	cfg.setDefaults()
	runID := sc.Name + "-" + loadtest.NewRunID()
	rep := &report.Report{Scenario: sc.Name, Fault: sc.Fault, Stack: cfg.Stack.Name(), RunID: runID,
		Policies: map[string]report.Policy{}, Phases: []invariant.Phase{}, Events: []invariant.Event{}, Invariants: []invariant.Row{}}
	dir := filepath.Join(cfg.Out, sc.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		rep.Error = err.Error()
		return rep
	}
	run := &scenarioRun{dir: dir, start: time.Now(), log: cfg.Log, prog: cfg.Progress}
	var reqs []invariant.Request
	defer func() {
		if err := writeOutputs(dir, rep, reqs); err != nil {
			fmt.Fprintf(cfg.Log, "chaos: writing %s: %v\n", dir, err)
		}
	}()

	if why := cfg.Stack.Unsupported(sc.Needs); sc.Needs != "" && why != "" {
		rep.Skipped, rep.SkipReason = true, why
		_ = os.WriteFile(filepath.Join(dir, "requests.jsonl"), nil, 0o644)
		_ = os.WriteFile(filepath.Join(dir, "events.jsonl"), nil, 0o644)
		rep.Judge()
		return rep
	}

	evF, err := os.Create(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	defer evF.Close()
	run.evF, run.evW = evF, bufio.NewWriter(evF)

	fmt.Fprintf(cfg.Log, "    starting the %s stack\n", cfg.Stack.Name())
	info, err := cfg.Stack.Up(ctx, sc.Needs)
	stackDown := false
	down := func() {
		if stackDown {
			return
		}
		stackDown = true
		fmt.Fprintf(cfg.Log, "    stopping the %s stack\n", cfg.Stack.Name())
		if err := cfg.Stack.Down(ctx); err != nil {
			fmt.Fprintf(cfg.Log, "chaos: stopping the stack: %v\n", err)
			if rep.Error == "" {
				rep.Error = "stopping the stack: " + err.Error()
			}
		}
		if k, ok := cfg.Stack.(logKeeper); ok {
			if err := k.KeepLogs(filepath.Join(dir, "logs")); err != nil {
				fmt.Fprintf(cfg.Log, "chaos: keeping the stack's logs: %v\n", err)
			}
		}
	}
	defer down()
	if err != nil {
		rep.Error = "starting the stack: " + err.Error()
		return rep
	}
	// A clean store: earlier runs' keys would not disturb this one (its keys
	// are its own), but a large AOF makes every Redis restart slower.
	if err := cfg.Stack.Flush(ctx); err != nil {
		fmt.Fprintf(cfg.Log, "chaos: flushing Redis: %v (going on with its data)\n", err)
	}

	reqs, err = runPhases(ctx, cfg, sc, info, run, rep)
	if err != nil && rep.Error == "" {
		rep.Error = err.Error()
	}
	down()
	if len(reqs) > 0 && len(rep.Phases) > 0 {
		// Even after an error: what was measured is worth reading (the
		// report still fails).
		analyze(rep, reqs)
	}
	rep.Judge()
	return rep
}

// runPhases learns the policies, drives the load through the phases with
// the fault in the middle, and collects the /status documents. It fills
// rep's policies, phases, events, statuses and Redis check.
func runPhases(ctx context.Context, cfg Config, sc Scenario, info stack.Info, run *scenarioRun, rep *report.Report) ([]invariant.Request, error) {
	client := loadtest.NewClient()
	defer client.CloseIdleConnections()
	cfg, rls, err := withDoors(cfg, info)
	if err != nil {
		return nil, fmt.Errorf("the doors: %w", err)
	}
	if rls != nil {
		defer rls.Close()
	}
	env := &Env{Stack: cfg.Stack, Info: info, Event: run.event, Action: run.action, Client: client,
		RunID: rep.RunID, APIKeySecret: strings.Split(cfg.APIKeySecret, ",")[0]}
	if sc.Setup != nil {
		if err := sc.Setup(ctx, env); err != nil {
			return nil, fmt.Errorf("setting the scenario up: %w", err)
		}
	}
	var learned map[string]loadtest.Policy
	err = retry(ctx, 10*time.Second, func() error {
		var err error
		learned, err = loadtest.LearnRoutes(ctx, client, cfg.rls, info.NginxURL, cfg.Routes, rep.RunID, cfg.APIKeySecret)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("learning the policies: %w", err)
	}
	window := time.Duration(0)
	for route, p := range learned {
		ip, err := judgedPolicy(route, p)
		if err != nil {
			return nil, err
		}
		rep.Policies[route] = report.PolicyOf(ip)
		window = max(window, p.Window)
	}
	d := cfg.Durations.withDefaults(window)
	timeout := cfg.RedisTimeout
	if t, ok := statusTimeout(ctx, cfg.Stack, info); ok {
		timeout = t
	}
	rep.RedisTimeoutMS = float64(timeout) / float64(time.Millisecond)
	lp := map[string]loadtest.Policy{}
	for r, p := range learned {
		lp[r] = p
	}
	if err := primeStack(ctx, cfg, info, client, lp, d.Prime); err != nil {
		return nil, err
	}
	// Collect now, not during the load (see the chaos command's quietGC).
	runtime.GC()
	fmt.Fprintf(cfg.Log, "    window %v; phases warmup %v, healthy %v, fault %v, recovery %v, settle %v; run %s\n",
		window, d.Warmup, d.Healthy, d.Fault, d.Recovery, d.Settle, rep.RunID)

	reqF, err := os.Create(filepath.Join(run.dir, "requests.jsonl"))
	if err != nil {
		return nil, err
	}
	defer reqF.Close()
	reqW := bufio.NewWriterSize(reqF, 1<<16)
	var (
		recordMu sync.Mutex
		records  []loadtest.Record
		writeErr error
	)
	// record logs one request: the load's, from its collector goroutine,
	// and the scenario's own (Env.Record).
	record := func(r loadtest.Record) {
		cfg.Progress.Record(r)
		b, err := json.Marshal(r)
		recordMu.Lock()
		defer recordMu.Unlock()
		records = append(records, r)
		if err == nil {
			_, err = reqW.Write(append(b, '\n'))
		}
		if err != nil && writeErr == nil {
			writeErr = err
		}
	}
	total := d.Warmup + d.Healthy + max(d.Fault, d.Flap) + d.Recovery + d.Settle + 2*time.Minute
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadDone := make(chan error, 1)
	go func() {
		_, err := loadtest.Run(loadCtx, loadtest.Config{
			BaseURL:  info.NginxURL,
			Routes:   cfg.Routes,
			Mix:      cfg.Mix,
			RouteMix: cfg.routeMix,
			Policies: lp,
			RunID:    rep.RunID,
			Seed:     cfg.Seed,
			Duration: total,
			// The first of a comma-separated list signs, as in the service.
			APIKeySecret: strings.Split(cfg.APIKeySecret, ",")[0],
			Client:       client,
			RLS:          cfg.rls,
			AbortShare:   sc.AbortShare,
			OnRecord:     record,
		})
		loadDone <- err
	}()

	run.status = func() (map[string]float64, map[string]invariant.LeaseCounters) {
		return readPhaseStatus(ctx, cfg.Stack, info)
	}
	env.Fault, env.Flap, env.Window, env.Timeout = d.Fault, d.Flap, window, timeout
	env.Record, env.Policies = record, lp
	injectErr := func() error {
		run.phase(invariant.Warmup)
		if err := sleep(ctx, d.Warmup); err != nil {
			return err
		}
		run.phase(invariant.Healthy)
		if err := sleep(ctx, d.Healthy); err != nil {
			return err
		}
		run.phase(invariant.Fault)
		if err := sc.Inject(ctx, env); err != nil {
			return fmt.Errorf("injecting the fault: %w", err)
		}
		run.phase(invariant.Recovery)
		recovering := time.Now()
		if sc.Recover != nil {
			if err := sc.Recover(ctx, env); err != nil {
				return fmt.Errorf("after the fault: %w", err)
			}
		}
		if err := sleep(ctx, time.Until(recovering.Add(d.Recovery))); err != nil {
			return err
		}
		run.phase(invariant.Settle)
		return sleep(ctx, d.Settle)
	}()
	run.phase("")
	run.event("run_end", "")
	stopLoad()
	loadErr := <-loadDone
	recordMu.Lock()
	if err := reqW.Flush(); err != nil && writeErr == nil {
		writeErr = err
	}
	recordMu.Unlock()
	if injectErr == nil {
		relearn(ctx, cfg, info, client, rep)
	}

	// After settle: every instance's /status, once the journals have
	// drained, and what Redis holds.
	if injectErr == nil {
		drainJournals(context.WithoutCancel(ctx), cfg.Stack, info)
	}
	statuses := append([]invariant.InstanceStatus{}, env.Snapshots...)
	for _, a := range info.AppNames() {
		st := invariant.InstanceStatus{Instance: a, Final: true}
		b, err := cfg.Stack.Status(context.WithoutCancel(ctx), a)
		if err == nil {
			err = json.Unmarshal(b, &st.Body)
		}
		if err != nil {
			st.Err = err.Error()
		}
		statuses = append(statuses, st)
	}
	rep.Statuses = statuses
	if rc, ok := cfg.Stack.(interface{ RedisClient() *redis.Client }); ok && injectErr == nil {
		rep.RedisCheck = redisCheck(ctx, rc.RedisClient())
	}

	run.mu.Lock()
	rep.Phases = append(rep.Phases[:0], run.phases...)
	rep.Events = append(rep.Events[:0], run.events...)
	run.mu.Unlock()
	rep.Affected = sc.Affected(info)
	rep.NoFault = sc.NoFault

	recordMu.Lock()
	reqs := records // requests.jsonl's lines, as the invariants read them
	recordMu.Unlock()
	switch {
	case injectErr != nil:
		return reqs, injectErr
	case loadErr != nil && !errors.Is(loadErr, context.Canceled):
		return reqs, fmt.Errorf("load: %w", loadErr)
	case writeErr != nil:
		return reqs, fmt.Errorf("writing requests.jsonl: %w", writeErr)
	}
	return reqs, nil
}
