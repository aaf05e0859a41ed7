package resilient_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestMain lets the test binary run as a child limiter process (for the
// crash test); otherwise it runs the tests and the examples, with the
// examples' redis-server up.
func TestMain(m *testing.M) {
	if os.Getenv("RESILIENT_CHILD") != "" {
		runChild()
		return
	}
	os.Exit(redistest.Main(m))
}

// runChild serves a resilient limiter over stdin/stdout: "decide KEY N"
// answers the number admitted, "status" the status JSON.
func runChild() {
	rs, _, err := shippedStore(os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	cfg := recoveryConfig("app1")
	cfg.JournalDir = os.Getenv("JOURNAL_DIR")
	l, err := resilient.New(rs, cfg)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	seq := 0
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 3 && f[0] == "decide":
			n, _ := strconv.Atoi(f[2])
			allowed := 0
			for range n {
				seq++
				d, err := l.Decide(context.Background(), ratelimit.Request{Policy: crashPolicy, Key: f[1], ID: fmt.Sprintf("%d-%d", os.Getpid(), seq)})
				if err == nil && d.Allowed {
					allowed++
				}
			}
			fmt.Println(allowed)
		case len(f) == 1 && f[0] == "status":
			b, _ := json.Marshal(l.Status())
			fmt.Println(string(b))
		}
	}
	_ = l.Close(context.Background())
}

// crashPolicy: 100 an hour, exact.
var crashPolicy = ratelimit.Policy{Name: "crash", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: time.Hour}

type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startChild(t *testing.T, redisAddr, journal string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RESILIENT_CHILD=1", "REDIS_ADDR="+redisAddr, "JOURNAL_DIR="+journal)
	cmd.Stderr = io.Discard
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
}

func (c *child) ask(t *testing.T, line string) string {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		t.Fatal(err)
	}
	if !c.out.Scan() {
		t.Fatalf("child: no answer to %q: %v", line, c.out.Err())
	}
	return c.out.Text()
}

func (c *child) decide(t *testing.T, key string, n int) int {
	t.Helper()
	a, err := strconv.Atoi(c.ask(t, fmt.Sprintf("decide %s %d", key, n)))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (c *child) status(t *testing.T) resilient.Status {
	t.Helper()
	var s resilient.Status
	if err := json.Unmarshal([]byte(c.ask(t, "status")), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCrashDuringOutage: a limiter process SIGKILLed during an outage is
// restarted, does not grant again the share it had granted, and replays
// its journal once Redis is back.
func TestCrashDuringOutage(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	journal := t.TempDir()
	first := startChild(t, srv.Addr(), journal)
	if n := first.decide(t, "client", 5); n != 5 {
		t.Fatalf("healthy: %d of 5 admitted", n)
	}
	srv.Kill()
	waitFor(t, "the first process's breaker to open", 5*time.Second, func() bool { return first.status(t).Breaker == "open" })
	// 95 left, and the heartbeats said this is the only live instance:
	// a share of 95, of which it spends 40.
	spent := first.decide(t, "client", 40)
	if spent != 40 {
		t.Fatalf("first process: %d local grants, want 40", spent)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()

	second := startChild(t, srv.Addr(), journal)
	st := second.status(t)
	if st.Breaker != "open" || st.Journal.Reloaded != uint64(spent) {
		t.Fatalf("restarted: breaker %s, journal %+v: want open with the %d grants reloaded", st.Breaker, st.Journal, spent)
	}
	// The journal kept what the share started from (95 left, one
	// instance): the restarted process grants the 55 the first one had not,
	// and not the 40 it had.
	if n := second.decide(t, "client", 100); n != 55 {
		t.Fatalf("restarted: %d more local grants, want 55: the spent share is not granted again", n)
	}
	srv.Restart(t)
	waitFor(t, "the restarted process to replay and close", 10*time.Second, func() bool {
		s := second.status(t)
		return s.Breaker == "closed" && s.Journal.Pending == 0
	})
	members, err := srv.Client().ZCard(context.Background(), redisstore.New(srv.Client(), redisstore.Config{}).Key(crashPolicy, "client")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if members != 5+40+55 {
		t.Fatalf("Redis holds %d grants, want 100 (5 in Redis, 40 before the crash, 55 after)", members)
	}
	if j := second.status(t).Journal; j.Replayed != 95 || j.Reloaded != 40 || j.Granted != 55 || j.Duplicates != 0 {
		t.Fatalf("journal %+v, want 40 reloaded and 55 granted, all 95 replayed, no duplicates", j)
	}
	if err := second.in.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Fatal(err)
	}
}

// TestRestartDuringOutage: an instance stopped during an outage (its journal
// left as a kill leaves it) comes back, does not hand out the share it had
// already spent, and replays its grants before trusting the store. Also when
// its journal ends in a torn record and a 2 MiB tail of zeros with no
// newline (what a crash mid-write can leave): it starts, serves, and replays
// the grants journaled before the damage. A torn record must not panic
// the start, nor a long tail fail it (a line scanner's "token too long").
func TestRestartDuringOutage(t *testing.T) {
	damage := map[string]func(t *testing.T, dir string){
		"clean journal": func(*testing.T, string) {},
		"torn record and a 2 MiB zero tail": func(t *testing.T, dir string) {
			jf, err := os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = jf.WriteString("A\t5\tj\n") // a torn acknowledgement: 3 of its fields
			_, _ = jf.Write(make([]byte, 2<<20))
			if err := jf.Close(); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, damage := range damage {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				f := newFakeStore()
				p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 100, Window: time.Hour}
				cfg := resilient.Config{Instance: "app1", JournalDir: dir, ExpectedInstances: 4}
				first, err := resilient.New(f, cfg)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				f.down.Store(true)
				if got := admit(t, first, p, "k", 40, ratelimit.ModeLocal); got != 25 {
					t.Fatalf("first process: %d local grants, want a quarter of 100", got)
				}
				_ = first.Close(context.Background()) // the store is down: nothing replayed, nothing acknowledged
				damage(t, dir)

				second := newLimiter(t, f, cfg)
				if second.Breaker() != resilient.BreakerOpen {
					t.Fatalf("restarted with a journal: %s, want open until replayed", second.Breaker())
				}
				if got := admit(t, second, p, "other", 10, ratelimit.ModeLocal); got != 10 {
					t.Fatalf("restarted: %d of 10 requests of a fresh key admitted locally, want it to serve", got)
				}
				if got := admit(t, second, p, "k", 40, ratelimit.ModeLocal); got != 0 {
					t.Fatalf("restarted: %d more local grants, want 0: the share was spent", got)
				}
				f.down.Store(false)
				settle(2 * time.Second)
				if second.Breaker() != resilient.BreakerClosed {
					t.Fatalf("%s, want closed after replay", second.Breaker())
				}
				d, err := second.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
				if err != nil || d.Mode != ratelimit.ModeRedis || d.Remaining != 74 {
					t.Fatalf("after replay: %+v %v, want the store to hold the 25 grants (74 left)", d, err)
				}
			})
		})
	}
}

// TestRestartDuringOutageChargesTheWholeShare: the grants of a process
// killed during an outage and those of the process that took over from its
// journal are one share: replayed, they leave the store no more tokens than
// a bucket fed every grant in time order. Charged batch by batch, each
// batch's share counted again the refill the other's grants took, and the
// store ended with its bucket nearly full (99 where the ideal held 85).
func TestRestartDuringOutageChargesTheWholeShare(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				f := newFakeStore()
				f.live.Store(1)
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
				cfg := resilient.Config{Instance: "app1", JournalDir: dir, ExpectedInstances: 1}
				var now int64
				ideal := memstore.New(memstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
				decide := func(l *resilient.Limiter, mode ratelimit.Mode) bool {
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
					if err != nil || d.Mode != mode {
						t.Fatalf("%+v %v, want a %s decision", d, err, mode)
					}
					if d.Allowed {
						now = time.Now().UnixMicro()
						_, _ = ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
					}
					return d.Allowed
				}
				first, err := resilient.New(f, cfg)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				for range 100 {
					decide(first, ratelimit.ModeRedis) // the bucket drained
				}
				f.down.Store(true)
				for range 100 { // 20/s for 5 s against 10/s
					decide(first, ratelimit.ModeLocal)
					time.Sleep(50 * time.Millisecond)
				}
				_ = first.Close(context.Background()) // the store is down: nothing replayed, as a kill leaves it

				second := newLimiter(t, f, cfg)
				for range 100 {
					decide(second, ratelimit.ModeLocal)
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(6 * time.Second)
				f.down.Store(false)
				settle(2 * time.Second)
				if second.Breaker() != resilient.BreakerClosed {
					t.Fatalf("%s, want closed after replay", second.Breaker())
				}
				d, err := second.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
				if err != nil || d.Mode != ratelimit.ModeRedis {
					t.Fatalf("after replay: %+v %v", d, err)
				}
				now = time.Now().UnixMicro()
				want, _ := ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
				t.Logf("after replay %d left, an ideal bucket fed every grant %d", d.Remaining, want.Remaining)
				if d.Remaining > want.Remaining {
					t.Errorf("after replay the store holds %d, more than the %d of a bucket fed every grant", d.Remaining, want.Remaining)
				}
			})
		})
	}
}
