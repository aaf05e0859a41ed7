// One redis-server process: the options, the launch and readiness check,
// and every fault a test inflicts on it (kill, SIGSTOP/SIGCONT, restart
// with or without its data).

package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// logName is the file, in a server's directory, that receives its stdout and
// stderr.
const logName = "redis.log"

// ServerOptions configures StartServer. The zero value starts a server with
// no password and no persistence.
type ServerOptions struct {
	// Password, when set, is required from clients (--requirepass); Client and
	// Options use it.
	Password string
	// AOF turns the append-only file on, with appendfsync always so that every
	// acknowledged write survives Kill followed by Restart.
	AOF bool
	// Args are extra redis-server arguments, appended after the defaults, for
	// example {"--maxmemory", "10mb"}. For a repeated directive the last one
	// wins, so Args can override a default, except --port (--tls-port with
	// TLS), --bind and --dir, which the helper relies on.
	Args []string
	// TLS, when set, makes the server speak TLS only (see TLSOptions):
	// Addr is then its TLS port, and Options, Client and the helper's own
	// probes connect over TLS with Certs' client certificate.
	TLS *TLSOptions
}

// serverSpec is what startServer needs beyond ServerOptions to start the
// plain, cluster and sentinel flavours of redis-server.
type serverSpec struct {
	opts ServerOptions
	// clusterBus asks for a port p with p+10000 free as well.
	clusterBus bool
	// confFile, when set, names a config file in the server's directory,
	// written with conf and passed before the other arguments. CONFIG REWRITE
	// (which Sentinel sends after changing a node's role) then persists
	// changes there, so that Restart keeps them.
	confFile, conf string
	// sentinel runs the process as a Sentinel (redis-server <confFile>
	// --sentinel); it needs confFile.
	sentinel bool
}

// Server is one redis-server process started by StartServer (or as part of
// a Cluster or Sentinel); the zero value is not usable. Its address, directory
// and options never change; Kill, Stop, Cont and Restart act on the current
// process. Methods are safe for concurrent use; Restart, RestartEmpty and
// WaitReady must be called from the test's goroutine.
type Server struct {
	bin      string
	dir      string
	prefix   []string // arguments before the flags (sentinel.conf --sentinel)
	args     []string // arguments after the flags (ServerOptions.Args, ...)
	aof      bool
	sentinel bool
	password string
	port     int // set once, before StartServer returns
	tls      *TLSOptions
	cluster  bool // a Cluster node (--tls-cluster yes with TLS)
	keep     map[string]bool

	mu   sync.Mutex
	proc *process

	clientOnce sync.Once
	client     *redis.Client
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
}

// running reports whether the process has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL (which also ends a stopped process) and waits until the
// process has exited.
func (p *process) kill() {
	// An error means the process has already exited.
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// errExited reports that redis-server exited while we waited for it.
var errExited = errors.New("redis-server exited")

// StartServer starts a redis-server on a free loopback port with its own
// t.TempDir and returns once it answers PING (and has loaded its data). The
// process runs with --bind 127.0.0.1 --save "" --appendonly yes|no
// --daemonize no --protected-mode no --repl-diskless-sync-delay 0 (so that a
// replica started with --replicaof in Args syncs at once), and logs to
// redis.log in its directory. If it is not ready within 10 s the test fails
// with the tail of the log. The process is killed, and the client closed, in
// t.Cleanup.
func StartServer(t testing.TB, opts ServerOptions) *Server {
	t.Helper()
	return startServer(t, serverSpec{opts: opts})
}

// startServer starts the flavour of redis-server that spec describes.
func startServer(t testing.TB, spec serverSpec) *Server {
	t.Helper()
	if spec.opts.TLS != nil && spec.opts.TLS.Certs == nil {
		t.Fatal("redistest: TLSOptions without Certs")
	}
	s := &Server{
		bin:      Require(t, "redis-server"),
		dir:      t.TempDir(),
		args:     append([]string(nil), spec.opts.Args...),
		aof:      spec.opts.AOF,
		password: spec.opts.Password,
		cluster:  spec.clusterBus,
		keep:     map[string]bool{logName: true, "nodes.conf": true},
	}
	if spec.opts.TLS != nil {
		o := *spec.opts.TLS
		s.tls = &o
	}
	if spec.confFile != "" {
		conf := filepath.Join(s.dir, spec.confFile)
		if err := os.WriteFile(conf, []byte(spec.conf), 0o644); err != nil {
			t.Fatalf("redistest: write config: %v", err)
		}
		s.prefix = []string{conf}
		s.keep[spec.confFile] = true
	}
	if spec.sentinel {
		s.prefix = append(s.prefix, "--sentinel")
		s.sentinel = true
	}
	t.Cleanup(func() {
		s.clientOnce.Do(func() {}) // no client can be created from now on
		if s.client != nil {
			s.client.Close()
		}
		s.Kill()
	})

	const attempts = 5
	for attempt := 1; ; attempt++ {
		port, err := freePort(spec.clusterBus)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.port = port
		err = s.launch()
		if err == nil {
			return s
		}
		if errors.Is(err, errPortInUse) && attempt < attempts {
			t.Logf("redistest: port %d taken before redis-server could bind it, retrying on another port", port)
			continue
		}
		t.Fatalf("redistest: start %s: %v\n--- last lines of %s ---\n%s", s.Addr(), err, s.LogPath(), tail(s.LogPath(), logTailLines))
	}
}

// errPortInUse reports that redis-server exited because its port (or cluster
// bus port) was taken.
var errPortInUse = errors.New("address already in use")

// launch starts a process on s.port and waits until it is ready; on failure
// the process is killed.
func (s *Server) launch() error {
	before := fileSize(s.LogPath())
	p, err := s.spawn()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	err = s.waitReady(p, readyTimeout)
	if err == nil {
		return nil
	}
	p.kill()
	if errors.Is(err, errExited) && logMentions(s.LogPath(), before, "Address already in use") {
		return fmt.Errorf("%w: %w", errPortInUse, err)
	}
	return err
}

// spawn starts redis-server without waiting for it.
func (s *Server) spawn() (*process, error) {
	log, err := os.OpenFile(s.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer log.Close() // the child has its own copy of the descriptor
	argv := s.argv()
	fmt.Fprintf(log, "=== redistest: %s %s\n", s.bin, strings.Join(argv, " "))
	cmd := exec.Command(s.bin, argv...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status of a killed server is of no interest
		close(p.done)
	}()
	return p, nil
}

// argv is the redis-server command line for s.
func (s *Server) argv() []string {
	argv := append([]string(nil), s.prefix...)
	if s.tls != nil {
		argv = append(argv, s.tls.args(s.port, s.cluster)...)
	} else {
		argv = append(argv, "--port", strconv.Itoa(s.port))
	}
	argv = append(argv,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
	)
	if !s.sentinel {
		appendonly := "no"
		if s.aof {
			appendonly = "yes"
		}
		argv = append(argv, "--save", "", "--appendonly", appendonly, "--appendfsync", "always",
			// Start a replica's full sync at once instead of after 5 s.
			"--repl-diskless-sync-delay", "0")
	}
	if s.password != "" {
		argv = append(argv, "--requirepass", s.password)
	}
	return append(argv, s.args...)
}

// waitReady polls p until it answers PING and has finished loading its data,
// until it exits, or until timeout.
func (s *Server) waitReady(p *process, timeout time.Duration) error {
	c := redis.NewClient(s.probeOptions())
	defer c.Close()
	err := pollFor(timeout, func(ctx context.Context) error {
		if !p.running() {
			return permanent(errExited)
		}
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("ping: %w", err)
		}
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return fmt.Errorf("info: %w", err)
		}
		if infoField(info, "loading") == "1" {
			return errors.New("still loading data")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s: %w", s.Addr(), err)
	}
	return nil
}

// probeOptions are client options for short health checks: small timeouts, no
// retries, one connection.
func (s *Server) probeOptions() *redis.Options {
	o := s.Options()
	o.DialTimeout = time.Second
	o.ReadTimeout = 2 * time.Second
	o.WriteTimeout = 2 * time.Second
	o.MaxRetries = -1
	o.PoolSize = 1
	return o
}

// Addr returns the server's address, "127.0.0.1:<port>" (the TLS port
// with ServerOptions.TLS). It does not change across Restart.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory, which holds its data files and
// its log.
func (s *Server) Dir() string { return s.dir }

// LogPath returns the path of the file that receives the server's output,
// across all its runs.
func (s *Server) LogPath() string { return filepath.Join(s.dir, logName) }

// Options returns fresh go-redis options for the server (address,
// password and, with ServerOptions.TLS, a TLS config that presents the
// client certificate), for tests that need a client with their own
// timeouts. The caller closes the clients it makes.
func (s *Server) Options() *redis.Options {
	return &redis.Options{
		Addr:            s.Addr(),
		Password:        s.password,
		TLSConfig:       s.ClientTLS(),
		DisableIdentity: true, // CLIENT SETINFO needs Redis 7.2
	}
}

// ClientTLS returns a fresh copy of the TLS config that Options carries,
// or nil for a plaintext server.
func (s *Server) ClientTLS() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.clientTLS()
}

// Client returns a go-redis client for the server with default options. It is
// the same client on every call, stays usable across Restart (its pool
// reconnects), and is closed in t.Cleanup.
func (s *Server) Client() *redis.Client {
	s.clientOnce.Do(func() { s.client = redis.NewClient(s.Options()) })
	return s.client
}

// Pid returns the process id of the running server, or 0 once it has exited.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || !s.proc.running() {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Kill ends the server with SIGKILL, like a crash: nothing is flushed beyond
// what the server had already written. It returns once the process has
// exited, and does nothing if it had already. It also ends a stopped server.
func (s *Server) Kill() {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.kill()
	}
}

// Stop freezes the server with SIGSTOP: connections are still accepted by the
// kernel but nothing is answered, like a hung server, until Cont.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a server frozen by Stop (SIGCONT). Requests sent meanwhile are
// then processed.
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

// signal sends sig to the running process, if any.
func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		// An error means the process has already exited: nothing to stop or resume.
		_ = p.cmd.Process.Signal(sig)
	}
}

// Restart kills the server if it is still running (or stopped), starts it
// again on the same port with the same directory, hence the same data when AOF
// is on, and returns once it answers PING and has loaded its data. The test
// fails if that takes more than 10 s.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	// The port is normally free again at once (redis-server binds with
	// SO_REUSEADDR), but a client socket may have picked it as its local port
	// meanwhile, so a bind failure is retried for a while.
	err := pollFor(readyTimeout, func(context.Context) error {
		err := s.launch()
		if err != nil && !errors.Is(err, errPortInUse) {
			return permanent(err)
		}
		return err
	})
	if err != nil {
		t.Fatalf("redistest: restart %s: %v\n--- last lines of %s ---\n%s", s.Addr(), err, s.LogPath(), tail(s.LogPath(), logTailLines))
	}
}

// RestartEmpty is Restart with the data wiped first: everything in the
// directory but the log and the config files (a cluster node's nodes.conf,
// the redis.conf or sentinel.conf of a Sentinel setup) is removed, so the
// server comes back empty (a cluster node keeps its identity and slots).
func (s *Server) RestartEmpty(t testing.TB) {
	t.Helper()
	s.Kill()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatalf("redistest: wipe %s: %v", s.dir, err)
	}
	for _, e := range entries {
		if s.keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			t.Fatalf("redistest: wipe %s: %v", s.dir, err)
		}
	}
	s.Restart(t)
}

// WaitReady polls the server until it answers PING and has loaded its data,
// and fails the test after timeout. Use it after Cont, for example.
func (s *Server) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if err := s.waitReady(p, timeout); err != nil {
		t.Fatalf("redistest: %v\n--- last lines of %s ---\n%s", err, s.LogPath(), tail(s.LogPath(), logTailLines))
	}
}

// fileSize returns the size of the file at path, 0 if it does not exist.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logMentions reports whether the file at path contains text after offset.
func logMentions(path string, offset int64, text string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<20))
	return err == nil && strings.Contains(string(b), text)
}
