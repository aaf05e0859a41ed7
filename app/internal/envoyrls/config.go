package envoyrls

import (
	"slices"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// Config is a loaded and validated set of envoyproxy/ratelimit
// configuration files: domains, each a tree of descriptors. Build it with
// Load or Parse; it is immutable and safe for concurrent use. The zero
// value knows no domain (every request is answered OK with no limit).
type Config struct {
	domains map[string]*node
	files   []string
	version string
}

// Files lists the files the configuration was loaded from.
func (c *Config) Files() []string { return slices.Clone(c.files) }

// Version identifies the configuration: the first 16 hex digits of a
// SHA-256 of every file's name and content, in load order ("" for the zero
// value). Instances that report different versions do not run the same
// files.
func (c *Config) Version() string { return c.version }

// Domains lists the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// node is one level of a domain's descriptor tree: the descriptors below
// it, by key and value, and the limit of the descriptor it stands for.
type node struct {
	children  map[entryKey]*node
	wildcards []wildcard // values with a '*', in file order
	limit     *Limit
}

// entryKey is a descriptor's key with its value ("" and !hasValue: any
// value of the key).
type entryKey struct {
	key, value string
	hasValue   bool
}

// wildcard is a configured value holding '*', split at the stars.
type wildcard struct {
	key   string
	parts []string
	node  *node
}

// Limit is the rate limit of one configured descriptor.
type Limit struct {
	// Policy decides the descriptor's requests; its Name is derived from
	// the descriptor's path (see policyName), unique in the configuration.
	// Unset (Limit 0) when Block or Unlimited.
	Policy ratelimit.Policy
	// RateLimit is what DescriptorStatus.current_limit reports.
	RateLimit *pb.RateLimitResponse_RateLimit
	// Descriptor is the configured descriptor's path below its domain, as
	// envoyproxy/ratelimit builds its stat key: each level's key, with
	// "_" and the value where the configuration names one, joined by "."
	// ("api_search.user_id"). It names the descriptor in the metrics
	// (Hits), so it never holds a value that only a client sent.
	Descriptor string
	// Name is the rate_limit's name, which replaces refers to.
	Name     string
	Replaces []string
	// Unlimited: the descriptor is never limited (unlimited: true).
	Unlimited bool
	// Block: requests_per_unit 0, every request is over the limit.
	Block bool
	// Shadow: decided and counted, but always answered OK (shadow_mode).
	Shadow bool
}

// DefaultAlgorithm decides a descriptor that names no algorithm: the
// sliding window counter, the closest of the four to envoyproxy/ratelimit's
// fixed window, without the burst of twice the limit across a window's
// boundary.
const DefaultAlgorithm = ratelimit.SlidingWindowCounter

// lookup returns the limit of a descriptor's entries in domain, as
// envoyproxy/ratelimit finds it: level by level, an entry matches its key
// with its value, else a value with '*' that matches, else its key alone;
// the limit is that of the descriptor the last entry matched. nil: no limit
// (an unknown domain, a descriptor no configured one matches, or one
// matched with fewer entries than configured or more).
func (c *Config) lookup(domain string, entries []entry) (*Limit, bool) {
	root := c.domains[domain]
	if root == nil {
		return nil, false
	}
	level := root
	for i, e := range entries {
		next := level.children[entryKey{key: e.key, value: e.value, hasValue: e.value != ""}]
		if next == nil {
			for _, w := range level.wildcards {
				if w.key == e.key && wildcardMatch(w.parts, e.value) {
					next = w.node
					break
				}
			}
		}
		if next == nil {
			next = level.children[entryKey{key: e.key}]
		}
		if next == nil {
			return nil, true
		}
		if i == len(entries)-1 {
			return next.limit, true
		}
		if len(next.children) == 0 {
			return nil, true
		}
		level = next
	}
	return nil, true
}

// entry is one key and value of a request's descriptor.
type entry struct{ key, value string }

// wildcardMatch reports whether value matches a pattern split at its '*'s:
// it starts with the first part, ends with the last, and holds the others
// in order between them; each '*' stands for any run of bytes.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}
