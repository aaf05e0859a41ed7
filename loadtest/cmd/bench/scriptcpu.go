package main

// The script CPU rows: what one decision call costs Redis itself, ours
// beside redis_rate's, from INFO commandstats (usec_per_call: the call's
// execution, without the network or the client).

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// ScriptCPURow is one row of results.json's script_cpu: the Redis CPU of
// one decision call, in µs (INFO commandstats usec_per_call), each round
// from redis-benchmark over one connection, Depth calls a pipeline.
type ScriptCPURow struct {
	Name    string    `json:"name"`
	Command string    `json:"command"`
	Depth   int       `json:"depth"`
	Calls   int64     `json:"calls_per_round"`
	Rounds  []float64 `json:"usec_per_call"`
}

// Script CPU parameters: calls per round, distinct keys, rounds.
const (
	scriptCPUCalls  = 200_000
	scriptCPUKeys   = 100_000
	scriptCPURounds = 2
)

// scriptCPUCmd is one decision call as redis-benchmark sends it, its key
// with __rand_int__ (redis-benchmark's -r replaces it).
type scriptCPUCmd struct {
	name    string
	command string // the commandstats name: fcall, evalsha
	args    []string
}

// scriptCPURows measures our GCRA decision function and redis_rate's GCRA
// script, at pipeline depths 1 and 16, in turns, on the Redis at addr.
func scriptCPURows(ctx context.Context, addr string, client redis.UniversalClient) ([]ScriptCPURow, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return nil, errors.New("redis-benchmark not found (apt-get install redis-server)")
	}
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return nil, fmt.Errorf("-redis %q: want host:port", addr)
	}
	cmds, err := scriptCPUCommands(ctx, addr, client)
	if err != nil {
		return nil, err
	}
	var rows []ScriptCPURow
	for _, c := range cmds {
		for _, depth := range []int{1, 16} {
			rows = append(rows, ScriptCPURow{Name: fmt.Sprintf("script-cpu/%s-P%d", c.name, depth), Command: c.command, Depth: depth, Calls: scriptCPUCalls})
		}
	}
	for range scriptCPURounds {
		i := 0
		for _, c := range cmds {
			for _, depth := range []int{1, 16} {
				if err := client.ConfigResetStat(ctx).Err(); err != nil {
					return nil, err
				}
				args := append([]string{"-h", host, "-p", port, "-c", "1", "-P", strconv.Itoa(depth),
					"-n", strconv.Itoa(scriptCPUCalls), "-r", strconv.Itoa(scriptCPUKeys), "-q"}, c.args...)
				if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
					return nil, fmt.Errorf("redis-benchmark %s: %w: %s", c.name, err, out)
				}
				us, calls, err := commandUsec(ctx, client, c.command)
				if err != nil {
					return nil, err
				}
				if calls < scriptCPUCalls {
					return nil, fmt.Errorf("%s: Redis counted %d %s calls of %d: the calls failed (check with redis-cli)", c.name, calls, c.command, scriptCPUCalls)
				}
				rows[i].Rounds = append(rows[i].Rounds, us)
				i++
			}
		}
	}
	return rows, nil
}

// resendWindow is redisstore's default resend window
// (redisstore.Config.ResendWindow).
const resendWindow = 3 * time.Second

// scriptCPUCommands returns the two calls: our GCRA decision function,
// with the arguments redisstore sends for a request of cost 1 with an id
// (the short form Redis keeps), and redis_rate's script call, as its
// limiter sends it (caught by a hook on a client of its own).
func scriptCPUCommands(ctx context.Context, addr string, client redis.UniversalClient) ([]scriptCPUCmd, error) {
	code, fn := redisstore.Library(ratelimit.GCRA)
	if err := client.FunctionLoadReplace(ctx, code).Err(); err != nil {
		return nil, fmt.Errorf("FUNCTION LOAD: %w", err)
	}
	p := ratelimit.Policy{Name: "per-user", Algorithm: ratelimit.GCRA, Limit: limit, Window: time.Second}
	key := redisstore.New(nil, redisstore.Config{}).Key(p, "x")
	ours := scriptCPUCmd{name: "ours-gcra", command: "fcall", args: []string{"FCALL", fn, "1",
		key[:len(key)-12] + "__rand_int__", // 28 bytes, as every key
		"0", strconv.Itoa(limit), strconv.FormatInt(p.Window.Microseconds(), 10), strconv.FormatInt(p.Capacity(), 10), "1",
		// A fresh id per call (12 digits; Redis keeps 11 bytes of a longer
		// one): one id for every call would make the second call of a key
		// within the resend window a resend, answered without a write.
		"__rand_int__", "1", "1", strconv.FormatInt(resendWindow.Microseconds(), 10)}}

	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	h := &catchHook{}
	c.AddHook(h)
	if _, err := redis_rate.NewLimiter(c).Allow(ctx, "x", redis_rate.PerSecond(limit)); err != nil {
		return nil, fmt.Errorf("redis_rate: %w", err)
	}
	peer, ok := h.caught()
	if !ok || len(peer) < 4 {
		return nil, fmt.Errorf("redis_rate sent no EVALSHA: %q", peer)
	}
	peer[3] = "rate:__rand_int__" // EVALSHA sha 1 key args...
	return []scriptCPUCmd{ours, {name: "peer-redis_rate", command: "evalsha", args: peer}}, nil
}

// catchHook keeps the arguments of the last EVALSHA a client sent.
type catchHook struct {
	mu   sync.Mutex
	args []string
}

func (h *catchHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *catchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "evalsha") {
			args := make([]string, len(cmd.Args()))
			for i, a := range cmd.Args() {
				args[i] = fmt.Sprint(a)
			}
			h.mu.Lock()
			h.args = args
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *catchHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *catchHook) caught() ([]string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.args, h.args != nil
}

// commandUsec reads INFO commandstats' usec_per_call and calls of command.
func commandUsec(ctx context.Context, c redis.UniversalClient, command string) (float64, int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !ok {
			continue
		}
		var us float64
		var calls int64
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "usec_per_call":
				us, _ = strconv.ParseFloat(v, 64)
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		return us, calls, nil
	}
	return 0, 0, fmt.Errorf("INFO commandstats: no %s", command)
}

// scriptCPUText is the script CPU section of BENCHMARKS.md.
func scriptCPUText(rows []ScriptCPURow) string {
	if len(rows) == 0 {
		return ""
	}
	s := "\n## Redis CPU per decision call\n\n" +
		"What one GCRA decision call costs Redis itself: INFO commandstats `usec_per_call` (the call's execution, without the network), " +
		"after `redis-benchmark -c 1 -n " + strconv.Itoa(scriptCPUCalls) + " -r " + strconv.Itoa(scriptCPUKeys) + "` sent the call over one connection, " +
		"one call at a time (`-P 1`) or 16 a pipeline (`-P 16`), the rows taking turns for " + strconv.Itoa(scriptCPURounds) + " rounds. " +
		"`ours-gcra`: our library's GCRA function by `FCALL`, with the arguments redisstore sends (a fresh 12-digit request id per call: Redis keeps an 11-byte one); " +
		"`peer-redis_rate`: go-redis/redis_rate v10's script by `EVALSHA`, as its limiter sends it.\n\n" +
		"| row | command | µs per call, each round |\n| --- | --- | --- |\n"
	for _, r := range rows {
		vals := make([]string, len(r.Rounds))
		for i, v := range r.Rounds {
			vals[i] = strconv.FormatFloat(v, 'f', 2, 64)
		}
		s += fmt.Sprintf("| %s | %s | %s |\n", r.Name, strings.ToUpper(r.Command), strings.Join(vals, ", "))
	}
	return s
}
