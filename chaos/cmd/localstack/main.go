// Command localstack runs the native stack (package native): what
// scripts/local-up.sh, scripts/local-down.sh and scripts/local-service.sh
// (make local-up, make local-down) run.
//
//	localstack up                      start the stack (the settings: localstack help)
//	localstack down                    stop what up started
//	localstack status                  every service: its pid, ready or not
//	localstack start NAME [--wipe]     one service of the running stack
//	localstack stop NAME
//	localstack restart NAME [--wipe]
//	localstack apps                    "NAME PID ADMIN_URL" per app of the running stack (pid 0: down)
//	localstack setting NAME            a setting the running stack's up saved
//	localstack help                    this, and the settings
//
// -root DIR is the checkout (default: the one whose bin/ holds the
// command, else the nearest above the working directory); -name NAME is
// the program name usage lines show (the scripts pass theirs). Exit status
// 0, 1 when something failed (said on stderr), 2 for a usage error, 130
// when interrupted.
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
	"slices"
	"strings"
	"syscall"

	"github.com/fleetlimit/fleetlimit/chaos/native"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		cancel(fmt.Errorf("interrupted (%v)", s))
		signal.Stop(sig) // a second one ends the process
	}()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const usage = `usage: %[1]s [-root DIR] [-name NAME] COMMAND
  up                      start the native stack (settings: the environment, see help)
  down                    stop what up started
  status                  every service: its pid, ready or not
  start NAME [--wipe]     start one service of the running stack (--wipe: a data node without its data)
  stop NAME               stop one
  restart NAME [--wipe]   stop, then start
  apps                    NAME PID ADMIN_URL of each app of the running stack (pid 0: down)
  setting NAME            a setting the running stack's up saved
  help                    this, and the settings
`

// errUsage is a usage error (exit 2), already printed.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("localstack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", "", "the checkout (default: the one of this command's bin/, else the nearest above the working directory)")
	name := fs.String("name", "localstack", "the program name usage lines show")
	fs.Usage = func() { fmt.Fprintf(stderr, usage, "localstack") }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *root == "" {
		r, err := findRoot()
		if err != nil {
			fmt.Fprintln(stderr, "error:", err)
			return 1
		}
		*root = r
	}
	err := command(ctx, *root, *name, fs.Args(), getenv, stdout, stderr)
	switch {
	case err == nil || errors.Is(err, native.ErrAlreadyUp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case context.Cause(ctx) != nil:
		if !errors.Is(err, native.ErrLogged) {
			fmt.Fprintln(stderr, "error:", err)
		}
		return 130
	case errors.Is(err, native.ErrLogged):
		return 1
	}
	for line := range strings.SplitSeq(err.Error(), "\n") {
		fmt.Fprintln(stderr, "error:", line)
	}
	return 1
}

func command(ctx context.Context, root, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintf(stderr, usage, prog)
		return errUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "up":
		if len(rest) > 0 {
			fmt.Fprintf(stderr, "usage: %s up (no arguments; the settings come from the environment: %s help)\n", prog, prog)
			return errUsage
		}
		s, err := native.Load(root, getenv)
		if err != nil {
			return err
		}
		err = native.New(root, s, stderr).Up(ctx)
		if errors.Is(err, native.ErrAlreadyUp) {
			b, rerr := os.ReadFile(filepath.Join(s.RunDir, "stack.json"))
			if rerr != nil {
				return rerr
			}
			_, _ = stdout.Write(b)
		}
		return err
	case "down":
		if len(rest) > 0 {
			fmt.Fprintf(stderr, "usage: %s down\n", prog)
			return errUsage
		}
		// Down needs no other setting: a bad one must not keep a stack up.
		s, err := native.Load(root, only(getenv, "LOCAL_RUN_DIR", "LOCAL_STOP_TIMEOUT"))
		if err != nil {
			return err
		}
		return native.Down(s.RunDir, s.StopTimeout, stderr)
	case "status", "start", "stop", "restart":
		return service(ctx, root, prog, args, getenv, stdout, stderr)
	case "apps":
		s, err := native.LoadSaved(root, getenv)
		if err != nil {
			return err
		}
		for _, a := range native.Apps {
			fmt.Fprintf(stdout, "%s %d %s\n", a, native.ServicePID(s.RunDir, a), s.AdminURL(a))
		}
		return nil
	case "setting":
		if len(rest) != 1 {
			fmt.Fprintf(stderr, "usage: %s setting NAME\n", prog)
			return errUsage
		}
		s, err := native.LoadSaved(root, getenv)
		if err != nil {
			return err
		}
		v, ok := s.Get(rest[0])
		if !ok {
			return fmt.Errorf("%s: not a saved setting (%s help lists them)", rest[0], prog)
		}
		fmt.Fprintln(stdout, v)
		return nil
	case "help", "-h", "--help":
		fmt.Fprintf(stdout, usage, prog)
		fmt.Fprintf(stdout, "\nSettings (environment variables; up saves them in the run directory's stack.env,\nwhich the other commands use):\n%s", native.Help())
		return nil
	}
	fmt.Fprintf(stderr, usage, prog)
	return errUsage
}

// service is status, start, stop and restart: one service of the running
// stack, with the settings its up saved.
func service(ctx context.Context, root, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	s, err := native.LoadSaved(root, getenv)
	if err != nil {
		return err
	}
	st := native.New(root, s, stderr)
	action := args[0]
	if action == "status" {
		for _, ss := range st.Status(ctx) {
			fmt.Fprintln(stdout, ss)
		}
		return nil
	}
	bad := func() error {
		fmt.Fprintf(stderr, "usage: %s status | start NAME [--wipe] | stop NAME | restart NAME [--wipe]\n", prog)
		fmt.Fprintf(stderr, "NAME: %s   (--wipe: %s only, start without its data)\n",
			strings.Join(s.Services(), " "), strings.Join(s.RedisNodes(), " "))
		return errUsage
	}
	if len(args) < 2 || len(args) > 3 || !slices.Contains(s.Services(), args[1]) {
		return bad()
	}
	name, wipe := args[1], len(args) == 3
	if wipe && (args[2] != "--wipe" || !slices.Contains(s.RedisNodes(), name)) {
		return bad()
	}
	switch action {
	case "start":
		return st.Start(ctx, name, wipe)
	case "stop":
		return st.Stop(name)
	}
	return st.Restart(ctx, name, wipe)
}

// only returns getenv limited to names ("" for every other variable).
func only(getenv func(string) string, names ...string) func(string) string {
	return func(k string) string {
		if slices.Contains(names, k) {
			return getenv(k)
		}
		return ""
	}
}

// findRoot returns the checkout: the one whose bin/ holds this command,
// else the nearest directory above the working directory that holds
// scripts/local-up.sh.
func findRoot() (string, error) {
	isRoot := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "scripts", "local-up.sh"))
		return err == nil
	}
	if exe, err := os.Executable(); err == nil {
		if d := filepath.Dir(filepath.Dir(exe)); isRoot(d) {
			return d, nil
		}
	}
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isRoot(d) {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", errors.New("no checkout (a directory with scripts/local-up.sh) above the working directory: pass -root")
		}
		d = up
	}
}
