package native

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Up starts the whole stack and returns once every service is ready, with
// stack.json written: the data nodes (and, per topology, the replica's
// sync, the Sentinels, the cluster), toxiproxy and its proxies, the apps,
// the static site, nginx, prometheus. It builds the binaries first (unless
// LOCAL_SKIP_BUILD). When the whole stack already runs, it returns
// ErrAlreadyUp; a part of one that runs is stopped first. When a service
// does not come up, Up prints the logs' last lines, stops what it started
// and returns an error that wraps ErrLogged.
func (st *Stack) Up(ctx context.Context) error {
	s := st.s
	if err := s.Validate(); err != nil {
		return err
	}
	if err := st.findTools(); err != nil {
		return err
	}
	run := s.RunDir

	// Already up? Every service any topology has, to find what runs.
	all := s.Services()
	for _, n := range slices.Concat(allRedisNodes, allSentinels) {
		if !slices.Contains(all, n) {
			all = append(all, n)
		}
	}
	var running []string
	for _, n := range all {
		if ServicePID(run, n) > 0 {
			running = append(running, n)
		}
	}
	_, jsonErr := os.Stat(filepath.Join(run, stackJSON))
	haveJSON := jsonErr == nil
	if saved := savedTopology(run); len(running) > 0 && haveJSON && saved != string(s.Topology) {
		return fmt.Errorf("a native stack with LOCAL_TOPOLOGY=%s is up; stop it first with: make local-down", saved)
	}
	up := 0
	for _, n := range s.Services() {
		if slices.Contains(running, n) {
			up++
		}
	}
	if up == len(s.Services()) && up == len(running) && haveJSON {
		st.logf("the native stack is already up (%s); stop it first with: make local-down", display(st.root, filepath.Join(run, stackJSON)))
		return ErrAlreadyUp
	}
	if len(running) > 0 {
		st.logf("a partial native stack is running (%s): stopping it to start cleanly", strings.Join(running, " "))
		stopAll(run, s.StopTimeout, st.log)
	}
	pids, _ := filepath.Glob(filepath.Join(run, pidDir, "*.pid"))
	for _, f := range append(pids, filepath.Join(run, stackJSON), filepath.Join(run, stackEnv)) {
		if err := removeIfAny(f); err != nil {
			return err
		}
	}

	if err := st.checkPorts(); err != nil {
		return err
	}
	if err := st.build(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(run, pidDir), 0o755); err != nil {
		return err
	}
	if err := s.saveSettings(); err != nil {
		return err
	}
	st.spawned = nil
	if err := st.up(ctx); err != nil {
		st.logf("error: %v", err)
		st.logf("")
		st.logf("the native stack did not come up; stopping what was started")
		st.printLogTails(st.spawned...)
		stopAll(run, s.StopTimeout, st.log)
		_ = removeIfAny(filepath.Join(run, stackEnv))
		_ = removeIfAny(filepath.Join(run, stackJSON))
		return loggedError{err}
	}
	st.logf("")
	st.logf("native stack up: %s/api/  (logs in %s/*.log, details in %s)", s.url(s.NginxPort),
		display(st.root, run), display(st.root, filepath.Join(run, stackJSON)))
	if s.Prometheus {
		st.logf("prometheus: %s/alerts  (rules: prometheus/rules.yml)", s.url(s.PrometheusPort))
	}
	st.logf("stop it with: make local-down")
	return nil
}

// up starts the services in order, and writes stack.json.
func (st *Stack) up(ctx context.Context) error {
	s := st.s
	deadline := st.now().Add(s.ReadyTimeout)
	nodes := s.RedisNodes()
	if s.Topology == Single {
		st.logf("starting redis on %s", s.hostPort(s.RedisPort))
	} else {
		st.logf("starting %s (%s topology) on %s-%d", strings.Join(nodes, " "), s.Topology,
			s.hostPort(s.RedisPort), s.redisPort(nodes[len(nodes)-1]))
		if err := st.writeConfigs(); err != nil {
			return err
		}
	}
	if err := st.startAll(ctx, deadline, nodes...); err != nil {
		return err
	}

	st.logf("starting toxiproxy (API %s)", s.hostPort(s.ProxyAPIPort))
	if err := st.startAll(ctx, deadline, "toxiproxy"); err != nil {
		return err
	}
	if err := st.populateProxies(ctx); err != nil {
		return fmt.Errorf("creating the toxiproxy proxies failed: %w", err)
	}
	for _, p := range s.proxies() {
		st.logf("  proxy %s: %s -> %s", p.Name, p.Listen, p.Upstream)
	}

	switch s.Topology {
	case Sentinel:
		if err := st.waitUntil(ctx, deadline, fmt.Sprintf("%s replicates from %s", nodes[1], nodes[0]), st.checkReplication); err != nil {
			return err
		}
		sentinels := s.Sentinels()
		st.logf("starting %s on %s-%d (master name %s)", strings.Join(sentinels, " "),
			s.hostPort(s.SentinelPortBase), s.sentinelPort(sentinels[len(sentinels)-1]), MasterName)
		if err := st.startAll(ctx, deadline, sentinels...); err != nil {
			return err
		}
		if err := st.waitUntil(ctx, deadline, fmt.Sprintf("every Sentinel knows %s and the other Sentinels", nodes[1]), st.checkSentinels); err != nil {
			return err
		}
	case Cluster:
		state, err := st.clusterState(ctx)
		if err != nil {
			return err
		}
		switch state {
		case clusterNew:
			st.logf("creating the cluster (3 masters, a replica each; output in %s)", display(st.root, filepath.Join(s.RunDir, "cluster-create.log")))
			if err := st.createCluster(ctx, deadline); err != nil {
				st.printLogTails("cluster-create")
				return fmt.Errorf("redis-cli --cluster create failed: %w", err)
			}
		case clusterMixed:
			return fmt.Errorf("the cluster in %s is half new (some nodes know no other node): delete that directory to create a new one (its data goes with it)",
				filepath.Join(s.RunDir, string(Cluster)))
		}
		if err := st.waitUntil(ctx, deadline, "cluster_state:ok on every node, every master's replica in sync", st.checkCluster); err != nil {
			return err
		}
	}

	st.logf("starting %s", strings.Join(Apps, " "))
	if err := st.startAll(ctx, deadline, Apps...); err != nil {
		return err
	}
	st.logf("starting the static site on %s", s.hostPort(s.StaticPort))
	if err := st.startAll(ctx, deadline, "static"); err != nil {
		return err
	}
	st.logf("starting nginx on %s (Envoy's rate limit service on %s)", s.hostPort(s.NginxPort), s.hostPort(s.RLSPort))
	if err := st.startAll(ctx, deadline, "nginx"); err != nil {
		return err
	}
	if s.Prometheus {
		st.logf("starting prometheus on %s (scrapes the apps' admin ports; LOCAL_PROMETHEUS=0: none)", s.hostPort(s.PrometheusPort))
		if err := st.startAll(ctx, deadline, "prometheus"); err != nil {
			return err
		}
	}
	return s.writeStackJSON()
}

// startAll starts names and waits until they are ready.
func (st *Stack) startAll(ctx context.Context, deadline time.Time, names ...string) error {
	for _, n := range names {
		if err := st.start(n, false); err != nil {
			return err
		}
	}
	return st.waitReady(ctx, deadline, names...)
}

// checkService fails unless name is one of the stack's services and wipe
// is asked of a data node only.
func (st *Stack) checkService(name string, wipe bool) error {
	if !slices.Contains(st.s.Services(), name) {
		return fmt.Errorf("unknown service: %s (one of: %s)", name, strings.Join(st.s.Services(), " "))
	}
	if wipe && !slices.Contains(st.s.RedisNodes(), name) {
		return fmt.Errorf("--wipe: %s is not a data node (%s)", name, strings.Join(st.s.RedisNodes(), " "))
	}
	return nil
}

// Start starts one service of the running stack and waits until it is
// ready (a data node or Sentinel: answers PING, not yet back in its
// cluster or replicating); wipe starts a data node without its data (in
// the sentinel and cluster topologies it keeps the node's own config: its
// role as Sentinel last rewrote it, its cluster node id and slots). After a
// toxiproxy start the proxies are created again. stack.json is rewritten.
// When the service does not come up, Start prints its log's last lines and
// returns an error that wraps ErrLogged.
func (st *Stack) Start(ctx context.Context, name string, wipe bool) error {
	if err := st.checkService(name, wipe); err != nil {
		return err
	}
	if err := st.s.Validate(); err != nil {
		return err
	}
	if err := st.findTools(); err != nil {
		return err
	}
	// A process killed a moment ago (the chaos suite kills, then starts at
	// once) is given a second to be gone, its ports with it (a
	// multi-threaded process's main thread is a zombie before the last
	// thread has closed its sockets).
	for wait := 50; ; wait-- {
		var why error
		if pid := ServicePID(st.s.RunDir, name); pid > 0 {
			why = fmt.Errorf("%s is already running (pid %d)", name, pid)
		}
		for _, l := range st.s.listeners(name) {
			if why == nil && st.portBusy(l.port) {
				why = fmt.Errorf("%s: port %d is still in use", name, l.port)
			}
		}
		if why == nil {
			break
		}
		if wait == 0 {
			return why
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	if err := st.start(name, wipe); err != nil {
		return err
	}
	if err := st.waitReady(ctx, st.now().Add(st.s.ReadyTimeout), name); err != nil {
		st.logf("error: %v", err)
		st.printLogTails(name)
		return loggedError{err}
	}
	if name == "toxiproxy" {
		if err := st.populateProxies(ctx); err != nil {
			return fmt.Errorf("creating the toxiproxy proxies failed: %w", err)
		}
	}
	return st.s.writeStackJSON()
}

// Stop stops one service of the running stack (TERM, up to
// LOCAL_STOP_TIMEOUT, KILL) and rewrites stack.json.
func (st *Stack) Stop(name string) error {
	if err := st.checkService(name, false); err != nil {
		return err
	}
	stop(st.s.RunDir, st.s.StopTimeout, st.log, name)
	return st.s.writeStackJSON()
}

// Restart is Stop, then Start.
func (st *Stack) Restart(ctx context.Context, name string, wipe bool) error {
	if err := st.checkService(name, wipe); err != nil {
		return err
	}
	if err := st.s.Validate(); err != nil {
		return err
	}
	if err := st.Stop(name); err != nil {
		return err
	}
	return st.Start(ctx, name, wipe)
}

// ServiceState is one service's state (Status).
type ServiceState struct {
	Name  string
	PID   int  // 0: down
	Ready bool // answers its probe
}

// Status returns the state of every service of the stack, in start order.
func (st *Stack) Status(ctx context.Context) []ServiceState {
	var out []ServiceState
	for _, n := range st.s.Services() {
		ss := ServiceState{Name: n, PID: ServicePID(st.s.RunDir, n)}
		if ss.PID > 0 {
			ss.Ready = st.probe(ctx, n) == nil
		}
		out = append(out, ss)
	}
	return out
}

// String is the line `localstack status` prints.
func (ss ServiceState) String() string {
	switch {
	case ss.PID == 0:
		return fmt.Sprintf("%-10s %s", ss.Name, "down")
	case ss.Ready:
		return fmt.Sprintf("%-10s pid %-8d %s", ss.Name, ss.PID, "ready")
	}
	return fmt.Sprintf("%-10s pid %-8d %s", ss.Name, ss.PID, "running, not ready")
}
