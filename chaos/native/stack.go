package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Stack starts, checks and stops the native stack of one checkout with
// one set of settings. Its methods print what they do to the log, one line
// at a time. A Stack is not safe for concurrent use.
type Stack struct {
	// OnStart, when set, is called with each process the stack starts, as
	// soon as it runs (the chaos suite gives it its priority).
	OnStart func(service string, pid int)

	root  string
	s     Settings
	log   io.Writer
	tools tools
	// spawned are the services this Stack started, for the failure report.
	spawned []string
	now     func() time.Time
}

// New returns the stack of the checkout at root with settings s, its
// progress written to log.
func New(root string, s Settings, log io.Writer) *Stack {
	return &Stack{root: root, s: s, log: log, now: time.Now}
}

// Settings returns the stack's settings.
func (st *Stack) Settings() Settings { return st.s }

func (st *Stack) logf(format string, args ...any) { fmt.Fprintf(st.log, format+"\n", args...) }

// ErrAlreadyUp is Up's when the whole stack already runs: it is left as it
// is (its stack.json describes it).
var ErrAlreadyUp = errors.New("the native stack is already up")

// ErrLogged wraps an error whose message the stack has already printed
// (with the report that followed it).
var ErrLogged = errors.New("reported")

type loggedError struct{ error }

func (e loggedError) Is(target error) bool { return target == ErrLogged }
func (e loggedError) Unwrap() error        { return e.error }

// display is how messages name a path: relative to the checkout when it is
// inside it.
func display(root, path string) string {
	if rel, err := filepath.Rel(root, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}

// tools are the system programs the stack runs.
type tools struct {
	redisServer, redisCLI, nginx, prometheus string
}

// findTools finds them, or says which to install.
func (st *Stack) findTools() error {
	var missing, pkgs []string
	find := func(name, pkg string) string {
		p, ok := FindBin(name)
		if !ok {
			missing = append(missing, name)
			if !slices.Contains(pkgs, pkg) {
				pkgs = append(pkgs, pkg)
			}
		}
		return p
	}
	st.tools.redisServer = find("redis-server", "redis-server")
	st.tools.redisCLI = find("redis-cli", "redis-server")
	st.tools.nginx = find("nginx", "nginx-light")
	if len(missing) > 0 {
		return fmt.Errorf("missing: %s (install them with: apt-get install %s; or run: make deps)",
			strings.Join(missing, " "), strings.Join(pkgs, " "))
	}
	if st.s.Prometheus {
		p, ok := FindBin("prometheus")
		if !ok {
			return errors.New("LOCAL_PROMETHEUS=1 but prometheus is not installed (apt-get install prometheus; or LOCAL_PROMETHEUS=0)")
		}
		st.tools.prometheus = p
	}
	return nil
}

// build builds bin/ratelimiter and bin/toxiproxy-server (unless
// LOCAL_SKIP_BUILD), and checks that both are there.
func (st *Stack) build(ctx context.Context) error {
	if st.s.SkipBuild {
		st.logf("LOCAL_SKIP_BUILD=1: using bin/ratelimiter and bin/toxiproxy-server as they are")
	} else {
		gobin, ok := FindBin("go")
		if !ok {
			return errors.New("go not found in PATH (needed to build bin/ratelimiter)")
		}
		for _, b := range []struct{ dir, out, pkg string }{
			{st.root, "bin/ratelimiter", "./app/cmd/ratelimiter"},
			// toxiproxy is a tool of the chaos module (its go.mod).
			{filepath.Join(st.root, "chaos"), "../bin/toxiproxy-server", "github.com/Shopify/toxiproxy/v2/cmd/server"},
		} {
			st.logf("building %s", strings.TrimPrefix(b.out, "../"))
			cmd := exec.CommandContext(ctx, gobin, "build", "-o", b.out, b.pkg)
			cmd.Dir, cmd.Stdout, cmd.Stderr = b.dir, st.log, st.log
			if err := cmd.Run(); err != nil {
				where := ""
				if b.dir != st.root {
					where = " (in chaos/)"
				}
				return fmt.Errorf("go build %s%s failed", b.pkg, where)
			}
		}
	}
	for _, b := range []string{"ratelimiter", "toxiproxy-server"} {
		if fi, err := os.Stat(filepath.Join(st.root, "bin", b)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("bin/%s missing", b)
		}
	}
	return nil
}

// portBusy reports whether something accepts connections on port.
func (st *Stack) portBusy(port int) bool {
	c, err := net.DialTimeout("tcp", st.s.hostPort(port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// checkPorts fails when two listeners share a port or one is taken, and
// then shows who holds them (ss -ltnp).
func (st *Stack) checkPorts() error {
	if dup := st.s.duplicatePorts(); len(dup) > 0 {
		return fmt.Errorf("the LOCAL_*_PORT settings give two listeners the same port: %s", strings.Join(dup, "; "))
	}
	var busy []string
	for _, l := range st.s.listeners() {
		if st.portBusy(l.port) {
			busy = append(busy, strconv.Itoa(l.port))
		}
	}
	if len(busy) == 0 {
		return nil
	}
	st.logf("error: ports already in use on %s: %s", st.s.Host, strings.Join(busy, " "))
	st.logf("(another stack or program holds them; the LOCAL_*_PORT settings (bin/localstack help) move ours)")
	if ss, ok := FindBin("ss"); ok {
		out, _ := exec.Command(ss, "-ltnp").Output()
		re := regexp.MustCompile(`:(` + strings.Join(busy, "|") + `)\b`)
		for line := range strings.SplitSeq(string(out), "\n") {
			if re.MatchString(line) {
				st.logf("%s", line)
			}
		}
	}
	return loggedError{fmt.Errorf("ports already in use on %s: %s", st.s.Host, strings.Join(busy, " "))}
}

// printLogTails prints the last lines each name's log got since its latest
// start (the "====" line spawn writes), so that the output of earlier runs
// does not confuse the picture; for nginx also its error.log's.
func (st *Stack) printLogTails(names ...string) {
	for _, name := range names {
		path := filepath.Join(st.s.RunDir, name+".log")
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.HasPrefix(lines[i], "==== ") {
				lines = lines[i:]
				break
			}
		}
		st.logf("")
		st.logf("---- last lines of %s ----", display(st.root, path))
		st.logf("%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	errLog := filepath.Join(st.s.RunDir, "nginx", "error.log")
	if b, err := os.ReadFile(errLog); err == nil && len(b) > 0 && slices.Contains(names, "nginx") {
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		st.logf("")
		st.logf("---- last lines of %s ----", display(st.root, errLog))
		st.logf("%s", strings.Join(lines[max(0, len(lines)-20):], "\n"))
	}
}
