// Configuration of a Limiter: every field, its default, and what it trades.

package resilient

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

// Config configures a Limiter. Zero fields take the defaults shown.
type Config struct {
	// Instance names this instance in heartbeats and logs. Required.
	Instance string
	// Timeout bounds each store call (50 ms), and so how long a decision
	// waits for the store (but see LateGrace).
	Timeout time.Duration
	// FailureThreshold is the number of consecutive failed calls that
	// opens the breaker (3): for failures the store or the network
	// answered (a refused connection, a refused write), at the threshold;
	// for timeouts, only when nothing has succeeded for SlowWindow as well.
	// A single refused call already sends the decisions after it to a
	// local share while one call at a time probes the store (not on a
	// sharded store, where one master refusing says nothing of the others).
	FailureThreshold int
	// SlowWindow tells a slow store from a dead one (250 ms): calls that
	// time out open the breaker only if no call or heartbeat has succeeded
	// for this long. Until then each timed-out call is decided locally and
	// the breaker stays closed. It adds to the time an unanswering store
	// takes to open the breaker, not to any request's latency.
	SlowWindow time.Duration
	// ProbeInterval is how often an open breaker pings the store (1 s)
	// while the pings time out. A ping refused at once (Redis' process
	// down, or loading) is repeated every HeartbeatInterval instead: it
	// costs the store nothing, and a restarted Redis is seen within 100 ms.
	// So is, once, a ping that timed out right after a refused one (a
	// Redis starting answers its first connection late).
	ProbeInterval time.Duration
	// HeartbeatInterval is how often a closed breaker heartbeats (100 ms).
	HeartbeatInterval time.Duration
	// HeartbeatTTL is how long after its last heartbeat an instance counts
	// as missing (300 ms). Until then, plus two intervals, the others do not
	// hold its share back, so a cut-off instance's fallback share does not
	// count capacity that frees up in that time: shorter is better for
	// goodput during an outage, as long as heartbeats are not missed.
	HeartbeatTTL time.Duration
	// LeaseGrace is how long a missing instance may keep granting its
	// fallback share, and so how long the others hold it back (30 s).
	LeaseGrace time.Duration
	// ExpectedInstances is the fleet size assumed until the first heartbeat
	// reply (1).
	ExpectedInstances int
	// KeyCapacity bounds the keys remembered locally (100 000). They are
	// held in up to 64 shards of equal capacity, each with its own lock;
	// a full shard evicts its least recently used key, which, if needed
	// again during an outage, starts from a fresh share.
	KeyCapacity int
	// Logger receives transitions and replays (slog.Default()); add the
	// instance name with Logger.With if the log is shared.
	Logger *slog.Logger
	// Now is the wall clock (time.Now), read once at New: from then on the
	// limiter measures time on the monotonic clock, so a step of the wall
	// clock does not move it. Decisions use the store's clock, estimated
	// from the local one and the offset seen in replies.
	Now func() time.Time
	// OnTransition, if set, is called on every breaker transition, with
	// the breaker's lock held: keep it short.
	OnTransition func(from, to BreakerState)
	// JournalDir holds the journal of local grants ("": memory only, lost
	// with the process).
	JournalDir string
	// JournalMax bounds the grants journaled (1 000 000); beyond it local
	// grants are counted as overflow and logged.
	JournalMax int
	// ReplayBatchKeys is how many keys one replay pipeline carries (1000).
	ReplayBatchKeys int
	// ReplayTimeout bounds one replay or restore pipeline (2 s), in place
	// of Timeout: a pipeline of ReplayBatchKeys takes Redis tens of ms.
	// Give the store a client whose own timeouts allow it
	// (redisstore.Config.ReplayClient), or the client's read timeout cuts it.
	ReplayTimeout time.Duration
	// LateWindow is how long the store goes on reading a call's reply
	// after the caller's deadline, so that a decision it made is not lost
	// (5 s): a request decided locally meanwhile is a doubt in the
	// journal until the store says whether it counted it (late.go). It
	// needs a store that reports late replies (redisstore with
	// coalescing, on a client whose read timeout allows the window:
	// redisstore.ClientConfig.LateReplies); with any other, a timed-out
	// call's local grant is replayed, and counted twice if the call ran.
	LateWindow time.Duration
	// LateGrace is how much longer than Timeout a request whose call timed
	// out may wait for the store's late answer before it is decided
	// locally (0: not at all). Behind a slow store that answer often
	// comes, and is exact, but every request it holds waits past Timeout,
	// which is the decision's latency bound that callers size for: the
	// default keeps it (a late answer still settles the local decision,
	// late.go).
	LateGrace time.Duration
	// RecoveryWait bounds how long a recovered instance keeps deciding
	// locally while other instances are still missing (2 × ProbeInterval).
	// Until every instance has replayed its journal, the store
	// undercounts; an instance that decided in the store then could spend
	// refill that the others already used.
	RecoveryWait time.Duration
}

func (c *Config) setDefaults() error {
	if err := contract.ValidateKey(c.Instance); err != nil {
		return fmt.Errorf("resilient: instance name: %w", err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Timeout, 50*time.Millisecond)
	def(&c.ProbeInterval, time.Second)
	def(&c.HeartbeatInterval, 100*time.Millisecond)
	def(&c.HeartbeatTTL, 300*time.Millisecond)
	def(&c.LeaseGrace, 30*time.Second)
	def(&c.SlowWindow, 250*time.Millisecond)
	def(&c.ReplayTimeout, 2*time.Second)
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = 3
	}
	if c.ExpectedInstances <= 0 {
		c.ExpectedInstances = 1
	}
	if c.KeyCapacity <= 0 {
		c.KeyCapacity = 100_000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ReplayBatchKeys <= 0 {
		c.ReplayBatchKeys = 1000
	}
	def(&c.RecoveryWait, 2*c.ProbeInterval)
	def(&c.LateWindow, 5*time.Second)
	c.LateGrace = max(c.LateGrace, 0)
	return nil
}
