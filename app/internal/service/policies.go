package service

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/app/internal/authrequest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

//go:embed default_policies.json
var defaultPolicies []byte

// PolicySet is a loaded policy file: the policies, and the routes that
// apply them.
type PolicySet struct {
	Policies []ratelimit.Policy
	Routes   []Route
	// Checks apply policies to the requests a proxy asks about at the
	// check endpoint (nginx auth_request; authrequest.Path), matched on the
	// original URI: the doors to upstreams that are not this service.
	Checks []Route
	// PerAddress names the policies that count per client address
	// ("per": "address"), a ceiling over every key one address uses.
	PerAddress []string
	// Version identifies the file the set was loaded from: the first 16
	// hex digits of the SHA-256 of its bytes (LoadPolicies; "" from
	// ParsePolicies). Instances that loaded the same file report the same
	// version in /status and ratelimit_policy_info.
	Version string
}

// Route applies policies to a chi pattern ("/api/gcra", "/api/*").
type Route struct {
	Pattern  string
	Policies []ratelimit.Policy
}

// Policy returns the policy named name.
func (s PolicySet) Policy(name string) (ratelimit.Policy, bool) {
	for _, p := range s.Policies {
		if p.Name == name {
			return p, true
		}
	}
	return ratelimit.Policy{}, false
}

// The JSON shapes of the policy file (docs/OPERATIONS.md, "Policies").
type policyFile struct {
	Policies []policyJSON `json:"policies"`
	Routes   []routeJSON  `json:"routes"`
	// Checks are optional; the same shape as routes.
	Checks []routeJSON `json:"checks"`
}

type policyJSON struct {
	Name           string  `json:"name"`
	Algorithm      string  `json:"algorithm"`
	Limit          int64   `json:"limit"`
	Window         string  `json:"window"`
	Burst          int64   `json:"burst"`
	FailureMode    string  `json:"failure_mode"`
	FallbackFactor float64 `json:"fallback_factor"`
	Shadow         bool    `json:"shadow"`
	// Lease opts a gcra policy into lease mode: the longest a lease is
	// held, a duration such as "500ms" ("" or absent: off).
	Lease string `json:"lease"`
	// Per is what the policy counts per: "key" (the default: the API key
	// when one is sent, else the client address) or "address" (always the
	// client address).
	Per string `json:"per"`
}

type routeJSON struct {
	Pattern string `json:"pattern"`
	// Policies lists the policies the route applies; [] serves the route
	// without limits (a missing list is an error).
	Policies []string `json:"policies"`
}

// LoadPolicies reads and validates a policy file; path "" loads the embedded
// default (the demo policies). The set's Version is the hash of the bytes
// read.
func LoadPolicies(path string) (PolicySet, error) {
	data := defaultPolicies
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return PolicySet{}, err
		}
	}
	set, err := ParsePolicies(data)
	if err != nil {
		return PolicySet{}, err
	}
	set.Version = policyVersion(data)
	return set, nil
}

// policyVersion is the version of a policy file's bytes.
func policyVersion(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// ParsePolicies parses and validates a policy file. Unknown fields are
// errors (a misspelt "limt" must not silently mean no limit); windows are
// Go durations ("10s", "1m30s"). Errors name the policy or route at fault.
func ParsePolicies(data []byte) (PolicySet, error) {
	var f policyFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return PolicySet{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return PolicySet{}, errors.New("invalid JSON: data after the top-level object")
	}
	if len(f.Policies) == 0 {
		return PolicySet{}, errors.New("no policies")
	}
	var set PolicySet
	for i, pj := range f.Policies {
		p, err := pj.policy()
		if err != nil {
			if pj.Name == "" {
				return PolicySet{}, fmt.Errorf("policies[%d]: %w", i, err)
			}
			return PolicySet{}, fmt.Errorf("policy %q: %w", pj.Name, err)
		}
		if _, dup := set.Policy(p.Name); dup {
			return PolicySet{}, fmt.Errorf("policy %q: defined twice", p.Name)
		}
		set.Policies = append(set.Policies, p)
		switch pj.Per {
		case "", "key":
		case "address":
			set.PerAddress = append(set.PerAddress, p.Name)
		default:
			return PolicySet{}, fmt.Errorf("policy %q: per must be \"key\" or \"address\", got %q", p.Name, pj.Per)
		}
	}
	if len(f.Routes) == 0 {
		return PolicySet{}, errors.New("no routes")
	}
	var err error
	if set.Routes, err = set.routes("route", f.Routes); err != nil {
		return PolicySet{}, err
	}
	if set.Checks, err = set.routes("check", f.Checks); err != nil {
		return PolicySet{}, err
	}
	return set, nil
}

// routes validates a list of routes (or checks: what names them in errors)
// against the policies.
func (s PolicySet) routes(what string, list []routeJSON) ([]Route, error) {
	var out []Route
	for _, rj := range list {
		if err := validPattern(rj.Pattern); err != nil {
			return nil, fmt.Errorf("%s %q: %w", what, rj.Pattern, err)
		}
		if rj.Pattern == authrequest.Path {
			return nil, fmt.Errorf("%s %q: the path of the check endpoint", what, rj.Pattern)
		}
		for _, r := range out {
			if r.Pattern == rj.Pattern {
				return nil, fmt.Errorf("%s %q: defined twice", what, rj.Pattern)
			}
		}
		if rj.Policies == nil {
			// An empty list is a deliberate choice; a missing one is
			// more likely a mistake.
			return nil, fmt.Errorf("%s %q: no policies (write \"policies\": [] for a %s served without limits)", what, rj.Pattern, what)
		}
		route := Route{Pattern: rj.Pattern}
		for _, name := range rj.Policies {
			p, ok := s.Policy(name)
			if !ok {
				return nil, fmt.Errorf("%s %q: unknown policy %q", what, rj.Pattern, name)
			}
			for _, q := range route.Policies {
				if q.Name == name {
					return nil, fmt.Errorf("%s %q: policy %q listed twice", what, rj.Pattern, name)
				}
			}
			route.Policies = append(route.Policies, p)
		}
		out = append(out, route)
	}
	return out, nil
}

// failureModes are the policy file's failure modes ("" is the default,
// fallback) and the decision mode each stands for while Redis is out.
var failureModes = map[string]ratelimit.Mode{"": "", "fallback": ratelimit.ModeLocal, "open": ratelimit.ModeOpen, "closed": ratelimit.ModeClosed}

// policy converts and validates one policy entry.
func (pj policyJSON) policy() (ratelimit.Policy, error) {
	alg, err := ratelimit.ParseAlgorithm(pj.Algorithm)
	if err != nil {
		return ratelimit.Policy{}, fmt.Errorf("algorithm must be token_bucket, sliding_window_log, sliding_window_counter or gcra, got %q", pj.Algorithm)
	}
	if pj.Window == "" {
		return ratelimit.Policy{}, errors.New(`window must be a duration such as "10s", got none`)
	}
	window, err := time.ParseDuration(pj.Window)
	if err != nil {
		return ratelimit.Policy{}, fmt.Errorf(`window must be a duration such as "10s": %w`, err)
	}
	failureMode, ok := failureModes[pj.FailureMode]
	if !ok {
		return ratelimit.Policy{}, fmt.Errorf("failure_mode must be fallback, open or closed, got %q", pj.FailureMode)
	}
	var lease time.Duration
	if pj.Lease != "" {
		if lease, err = time.ParseDuration(pj.Lease); err != nil {
			return ratelimit.Policy{}, fmt.Errorf(`lease must be a duration such as "500ms": %w`, err)
		}
	}
	p := ratelimit.Policy{
		Name:           pj.Name,
		Algorithm:      alg,
		Limit:          pj.Limit,
		Window:         window,
		Burst:          pj.Burst,
		FailureMode:    failureMode,
		FallbackFactor: pj.FallbackFactor,
		Shadow:         pj.Shadow,
		Lease:          lease,
	}
	if err := p.Validate(); err != nil {
		var fe *ratelimit.FieldError
		if errors.As(err, &fe) {
			return ratelimit.Policy{}, fmt.Errorf("%s %s", fe.Field, fe.Reason)
		}
		return ratelimit.Policy{}, err
	}
	return p, nil
}

// validPattern accepts the route patterns the service mounts on chi: a path
// starting with "/", optionally ending in "/*" (a prefix). Parameters
// ("{id}") are not needed by a rate-limit route table and are refused, so
// a policy file cannot make chi panic at start.
func validPattern(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return errors.New(`pattern must start with "/"`)
	case strings.ContainsAny(p, "{}"):
		return errors.New("pattern parameters ({...}) are not supported")
	case strings.Contains(strings.TrimSuffix(p, "*"), "*"):
		return errors.New(`"*" may only end a pattern`)
	case strings.ContainsAny(p, " \t\r\n?#"):
		return errors.New("pattern holds a space, '?' or '#'")
	}
	return nil
}
