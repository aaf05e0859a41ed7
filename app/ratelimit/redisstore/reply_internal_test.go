package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

// TestParseReply: each algorithm's reply carries the head and only its own
// state; any other length, a non-integer or an out-of-range head is
// ErrBadReply, never a panic.
func TestParseReply(t *testing.T) {
	ints := func(v ...int64) []any {
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = x
		}
		return out
	}
	head := []int64{1, 4, 2000, 0, 1_700_000_000_000_000}
	for _, c := range []struct {
		alg   ratelimit.Algorithm
		state []int64
		want  contract.State
	}{
		{ratelimit.TokenBucket, []int64{7}, contract.State{Tokens: 7}},
		{ratelimit.GCRA, []int64{8, 9}, contract.State{TAT: 8, TATRem: 9}},
		{ratelimit.SlidingWindowCounter, []int64{10, 11, 12}, contract.State{WindowStart: 10, Current: 11, Previous: 12}},
		{ratelimit.SlidingWindowLog, []int64{1, 2, 3, 4, 5, 6, 7, 8}, contract.State{Ages: [contract.AgeBuckets]int64{1, 2, 3, 4, 5, 6, 7, 8}}},
	} {
		t.Run(string(c.alg), func(t *testing.T) {
			d, err := parseReply(c.alg, ints(append(append([]int64{}, head...), c.state...)...))
			if err != nil {
				t.Fatal(err)
			}
			c.want.Now = head[4]
			if !d.Allowed || d.Remaining != 4 || d.ResetAfter != 2*time.Millisecond || d.State != c.want {
				t.Errorf("decision %+v, want allowed, 4 remaining, reset 2ms, state %+v", d, c.want)
			}
			for name, res := range map[string][]any{
				"short":          ints(head...),
				"long":           ints(append(append(append([]int64{}, head...), c.state...), 0)...),
				"old full reply": ints(make([]int64, 19)...),
				"a string":       append(append(ints(head[:4]...), "x"), ints(c.state...)...),
				"allowed 2":      ints(append([]int64{2, 4, 2000, 0, 1}, c.state...)...),
				"no time":        ints(append([]int64{1, 4, 2000, 0, 0}, c.state...)...),
				"empty":          nil,
			} {
				if _, err := parseReply(c.alg, res); !errors.Is(err, ratelimit.ErrBadReply) {
					t.Errorf("%s: error %v, want ErrBadReply", name, err)
				}
			}
			// A refusal may end with a resend hint: the last admission's
			// id and until when a request with it is a resend.
			refused := append([]int64{0, 0, 2000, 1000, head[4]}, c.state...)
			d, err = parseReply(c.alg, append(ints(refused...), "req-1", int64(head[4]+5)))
			if err != nil || d.Allowed || d.ResendID != "req-1" || d.ResendUntil != head[4]+5 || d.RetryAfter != time.Millisecond {
				t.Errorf("refusal with a hint: %+v %v", d, err)
			}
			for name, res := range map[string][]any{
				"hint on an admission": append(ints(append(append([]int64{}, head...), c.state...)...), "req-1", int64(5)),
				"hint of integers":     append(ints(refused...), int64(1), int64(5)),
				"empty id":             append(ints(refused...), "", int64(5)),
				"no time":              append(ints(refused...), "req-1", int64(0)),
			} {
				if _, err := parseReply(c.alg, res); !errors.Is(err, ratelimit.ErrBadReply) {
					t.Errorf("%s: error %v, want ErrBadReply", name, err)
				}
			}
		})
	}
	if _, err := parseReply("nope", ints(head...)); !errors.Is(err, ratelimit.ErrBadReply) {
		t.Errorf("unknown algorithm: error %v, want ErrBadReply", err)
	}
}

type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestUnavailableReplies: a write or client refusal is ErrUnavailable, also
// when a script error wraps it (Redis 6: "ERR Error running script ...:
// -OOM ..."); an error about the request or the key is ErrBadReply.
func TestUnavailableReplies(t *testing.T) {
	cases := []struct {
		reply       string
		unavailable bool
	}{
		{"OOM command not allowed when used memory > 'maxmemory'. script: 0a9f, on @user_script:1.", true},
		{"READONLY You can't write against a read only replica. script: 0a9f, on @user_script:1.", true},
		{"ERR Error running script (call to f_0a9f): @user_script:12: @user_script: 12: -OOM command not allowed when used memory > 'maxmemory'.", true},
		{"ERR Error running script (call to f_0a9f): @user_script:3: @user_script: 3: -READONLY You can't write against a read only replica.", true},
		{"NOAUTH Authentication required.", true},
		{"WRONGPASS invalid username-password pair or user is disabled.", true},
		{"NOPERM this user has no permissions to run the 'evalsha' command", true},
		{"ERR max number of clients reached", true},
		{"ERR Protocol error: unauthenticated multibulk length", true},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{"ERR user_script:5: fleetlimit: corrupt state (t) script: 0a9f, on @user_script:5.", false},
		{"ERR unknown command 'evalsha'", false},
	}
	for _, c := range cases {
		err := classify(t.Context(), replyError(c.reply))
		if got := errors.Is(err, ratelimit.ErrUnavailable); got != c.unavailable || errors.Is(err, ratelimit.ErrBadReply) == c.unavailable {
			t.Errorf("%q: %v, want unavailable %v", c.reply, err, c.unavailable)
		}
	}
}
