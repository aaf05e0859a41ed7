package redisstore

// The Redis function library: every script of this package registered as
// a function of one library (FUNCTION LOAD), called with FCALL. Redis runs
// a library's top-level code once, at load, so the helpers are defined
// once per load instead of once per call as in a script, where making the
// closures was a fifth of a decision's Redis CPU.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

// libraryVersion names this release's function library: the first 8 hex
// digits of the SHA-256 of its code. It is in the library's name
// ("fleetlimit_<version>") and in each function's ("fl_<version>_..."):
// function names are global to a Redis, so instances of two releases
// sharing one Redis each call their own library's functions.
var libraryVersion string

// libraryName is the library's name in FUNCTION LIST.
var libraryName string

// librarySrc is the library's code, FUNCTION LOAD's argument.
var librarySrc string

// Function names, set with the library (fnName).
var (
	fnDecide     = map[ratelimit.Algorithm]string{}
	fnReplay     = map[ratelimit.Algorithm]string{}
	fnBatch      string
	fnRefund     string
	fnRaise      string
	fnFleet      string
	fnReset      string
	fnFence      string
	fnReadResets string
	fnLag        string
	fnShardGen   string
)

// fnBase names each function without the version.
var fnBase = map[ratelimit.Algorithm]string{
	ratelimit.TokenBucket: "token_bucket", ratelimit.GCRA: "gcra",
	ratelimit.SlidingWindowCounter: "sliding_window_counter", ratelimit.SlidingWindowLog: "sliding_window_log",
}

// libraryCode returns the library's code after its first line, with
// function names "fl_<v>_<name>" where v is the placeholder "@V@".
//
// Each group of functions is a do block with its own helpers and its own
// "local KEYS, ARGV": a function gets its keys and arguments as parameters
// and may not assign globals, so each registered function sets these
// upvalues before it runs the script's body, which the helpers (now_us
// reads ARGV[1]) and the bodies read as before. A group's state left by a
// call (the batch replaces now_us) is reset at the start of the next.
func libraryCode() string {
	var b strings.Builder
	reg := func(name, call string, flags ...string) {
		f := ""
		if len(flags) > 0 {
			f = ", flags = {'" + strings.Join(flags, "', '") + "'}"
		}
		fmt.Fprintf(&b, "redis.register_function{function_name = 'fl_@V@_%s', callback = function(k, a) %s end%s}\n", name, call, f)
	}
	// Decisions, single and batch.
	b.WriteString("do\nlocal KEYS, ARGV\n")
	b.WriteString(arithLua + fillLua + counterLua + stateLua + decideLua + onceLua)
	for _, a := range contract.Algorithms {
		fmt.Fprintf(&b, "local function decide_%d()\n%s\nend\n", batchCodes[a], algorithmLua[a])
	}
	b.WriteString("local now_redis = now_us\n")
	b.WriteString("local function begin(k, a) KEYS, ARGV, now_us = k, a, now_redis end\n")
	fmt.Fprintf(&b, "local function batch()\n%s\nend\n", batchLua)
	for _, a := range contract.Algorithms {
		reg("decide_"+fnBase[a], fmt.Sprintf("begin(k, a) args(k[1], a) return decide_%d()", batchCodes[a]))
	}
	reg("decide_batch", "begin(k, a) return batch()")
	b.WriteString("end\n")
	// Replays: each algorithm's fold is a function named fold.
	for _, a := range contract.Algorithms {
		b.WriteString("do\nlocal KEYS, ARGV\n" + helpersLua + replayFoldLua[a])
		fmt.Fprintf(&b, "local function body()\n%s\nend\n", replayLua)
		reg("replay_"+fnBase[a], "KEYS, ARGV = k, a return body()")
		b.WriteString("end\n")
	}
	// Repairs, on every helper.
	for _, s := range []struct{ name, src string }{{"refund", refundLua}, {"raise", raiseLua}} {
		b.WriteString("do\nlocal KEYS, ARGV\n" + helpersLua)
		fmt.Fprintf(&b, "local function body()\n%s\nend\n", s.src)
		reg(s.name, "KEYS, ARGV = k, a return body()")
		b.WriteString("end\n")
	}
	// The small scripts, each alone.
	for _, s := range []struct {
		name, src string
		flags     []string
	}{
		{"fleet", fleetLua, nil},
		{"reset", resetLua, nil},
		{"fence", fenceLua, nil},
		{"read_resets", readResetsLua, []string{"no-writes"}},
		{"lag", lagLua, nil},
		{"shard_generation", shardGenLua, nil},
	} {
		fmt.Fprintf(&b, "do\nlocal KEYS, ARGV\nlocal function body()\n%s\nend\n", s.src)
		reg(s.name, "KEYS, ARGV = k, a return body()", s.flags...)
		b.WriteString("end\n")
	}
	return b.String()
}

func init() {
	code := libraryCode()
	sum := sha256.Sum256([]byte(code))
	libraryVersion = hex.EncodeToString(sum[:4])
	libraryName = "fleetlimit_" + libraryVersion
	librarySrc = "#!lua name=" + libraryName + "\n" + strings.ReplaceAll(code, "@V@", libraryVersion)
	for _, a := range contract.Algorithms {
		fnDecide[a] = fnName("decide_" + fnBase[a])
		fnReplay[a] = fnName("replay_" + fnBase[a])
	}
	fnBatch, fnRefund, fnRaise = fnName("decide_batch"), fnName("refund"), fnName("raise")
	fnFleet, fnReset, fnFence = fnName("fleet"), fnName("reset"), fnName("fence")
	fnReadResets, fnLag, fnShardGen = fnName("read_resets"), fnName("lag"), fnName("shard_generation")
}

func fnName(base string) string { return "fl_" + libraryVersion + "_" + base }

// Library returns the function library's code (FUNCTION LOAD's argument)
// and the name of algorithm a's decision function (empty for an unknown
// one), for tools that drive Redis directly. The function's arguments are
// the decision script's (lua/decide.lua).
func Library(a ratelimit.Algorithm) (code, function string) { return librarySrc, fnDecide[a] }

// functionMissing reports whether err is Redis' answer to an FCALL of a
// function it does not have (after a restart without persistence, a
// FUNCTION FLUSH, a failover to a replica that never had the library): the
// call did not run.
func functionMissing(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "Function not found")
}

// loadLibrary loads the library into every node of client that takes
// writes, one command (one round trip) per node: every master of a
// Cluster (replicas get it through replication: FUNCTION LOAD is
// propagated and kept in the RDB and the AOF), every shard of a Ring,
// the single or Sentinel-managed master. It loads without REPLACE, and a
// node that has the library already answers so without compiling it: the
// version is a hash of the code, so a library of the same name is this
// code (TestLoadLibraryKeepsLoaded).
func loadLibrary(ctx context.Context, client redis.ScriptingFunctionsCmdable) error {
	load := func(ctx context.Context, c redis.ScriptingFunctionsCmdable) error {
		err := c.FunctionLoad(ctx, librarySrc).Err()
		if err != nil && redis.HasErrorPrefix(err, "Library '"+libraryName+"' already exists") {
			return nil
		}
		return err
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return load(ctx, m) })
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error { return load(ctx, s) })
	}
	return load(ctx, client)
}

// fcall calls function fn, loading the library and calling again once
// when the node does not have it (functionMissing: the first call did not
// run, so the second cannot count anything twice).
func fcall(ctx context.Context, client redis.ScriptingFunctionsCmdable, fn string, keys []string, args ...any) *redis.Cmd {
	cmd := client.FCall(ctx, fn, keys, args...)
	if functionMissing(cmd.Err()) {
		if err := loadLibrary(ctx, client); err != nil {
			return cmd
		}
		cmd = client.FCall(ctx, fn, keys, args...)
	}
	return cmd
}

// fcallRO is fcall for a function flagged no-writes (FCALL_RO).
func fcallRO(ctx context.Context, client redis.ScriptingFunctionsCmdable, fn string, keys []string, args ...any) *redis.Cmd {
	cmd := client.FCallRO(ctx, fn, keys, args...)
	if functionMissing(cmd.Err()) {
		if err := loadLibrary(ctx, client); err != nil {
			return cmd
		}
		cmd = client.FCallRO(ctx, fn, keys, args...)
	}
	return cmd
}
