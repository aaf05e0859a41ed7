// Reading the configuration: envoyproxy/ratelimit's YAML files, checked
// key by key, into a Config (config.go answers from it).

package envoyrls

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"gopkg.in/yaml.v3"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// maxFileBytes bounds one configuration file.
const maxFileBytes = 4 << 20

// Load reads every configuration file of dir (names ending in .yaml or
// .yml, not starting with '.', in name order; symbolic links are followed)
// and validates them together. A Kubernetes ConfigMap's volume is read once:
// its files are the top-level symbolic links (x.yaml -> ..data/x.yaml), and
// ..data and the timestamped directories behind it start with '.'. An error names the file and, where it can,
// the line; a directory without such a file is an error that names it.
func Load(dir string) (*Config, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	var data [][]byte
	for _, e := range entries {
		n := e.Name()
		if !configFile(n) {
			continue
		}
		path := filepath.Join(dir, n)
		st, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			continue
		}
		if st.Size() > maxFileBytes {
			return nil, fmt.Errorf("%s: larger than %d bytes", n, maxFileBytes)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		names, data = append(names, n), append(data, b)
	}
	if len(names) == 0 {
		// No domain would answer OK to every call: a mount gone wrong
		// must not turn the limits off.
		return nil, fmt.Errorf("%s: no configuration file (a .yaml or .yml file whose name does not start with '.')", dir)
	}
	return Parse(names, data)
}

// Parse validates configuration files given by name and content (in the
// order given) and builds the configuration. Two files may not configure
// the same domain.
func Parse(names []string, data [][]byte) (*Config, error) {
	if len(names) != len(data) {
		return nil, errors.New("envoyrls: names and contents differ in number")
	}
	c := &Config{domains: map[string]*node{}, files: slices.Clone(names), version: version(names, data)}
	seen := map[string]string{} // domain -> file
	policies := map[string]string{}
	for i, name := range names {
		domain, root, err := parseFile(name, data[i], policies)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[domain]; dup {
			return nil, fmt.Errorf("%s: duplicate domain '%s' (also in %s)", name, domain, other)
		}
		seen[domain], c.domains[domain] = name, root
	}
	return c, nil
}

// configFile reports whether Load reads the directory entry called name.
func configFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// version is Config.Version of the files given by name and content.
func version(names []string, data [][]byte) string {
	h := sha256.New()
	for i, n := range names {
		for _, b := range [][]byte{[]byte(n), data[i]} {
			_, _ = h.Write(strconv.AppendInt(nil, int64(len(b)), 10))
			_, _ = h.Write([]byte{':'})
			_, _ = h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// fileError is an error at a line of a file.
func fileError(file string, n *yaml.Node, format string, args ...any) error {
	if n == nil || n.Line == 0 {
		return fmt.Errorf("%s: %s", file, fmt.Sprintf(format, args...))
	}
	return fmt.Errorf("%s:%d: %s", file, n.Line, fmt.Sprintf(format, args...))
}

// Keys of envoyproxy/ratelimit that fleetlimit refuses rather than ignore:
// each changes what is decided or reported.
var unsupported = map[string]bool{
	"quota_mode": true, "share_threshold": true, "metadata": true,
	"detailed_metric": true, "value_to_metric": true,
}

// parseFile parses one file: its domain and descriptor tree. policies maps
// the policy names given so far to the file that gave them.
func parseFile(file string, data []byte, policies map[string]string) (string, *node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return "", nil, fmt.Errorf("%s: config file cannot have empty domain", file)
		}
		return "", nil, fmt.Errorf("%s: %w", file, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return "", nil, fileError(file, &extra, "more than one YAML document")
	}
	top := &doc
	if top.Kind == yaml.DocumentNode && len(top.Content) == 1 {
		top = top.Content[0]
	}
	if top.Kind != yaml.MappingNode {
		return "", nil, fileError(file, top, "the file must be a mapping with domain and descriptors")
	}
	fields, err := mapping(file, top, map[string]bool{"domain": true, "descriptors": true})
	if err != nil {
		return "", nil, err
	}
	var domain string
	if n := fields["domain"]; n != nil {
		if domain, err = scalar(file, n, "domain"); err != nil {
			return "", nil, err
		}
	}
	if domain == "" {
		return "", nil, fileError(file, top, "config file cannot have empty domain")
	}
	root := &node{children: map[entryKey]*node{}}
	p := &parser{file: file, domain: domain, policies: policies}
	if err := p.descriptors(root, fields["descriptors"], domain); err != nil {
		return "", nil, err
	}
	return domain, root, nil
}

// mapping returns the values of a mapping node by key, refusing keys not in
// known (and duplicates, and keys that are not strings).
func mapping(file string, n *yaml.Node, known map[string]bool) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, fileError(file, n, "expected a mapping, got %s", kindName(n))
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return nil, fileError(file, k, "config error, key is not of type string: %v", k.Value)
		}
		switch {
		case unsupported[k.Value]:
			return nil, fileError(file, k, "key '%s' of envoyproxy/ratelimit is not supported by fleetlimit (docs/DOORS.md)", k.Value)
		case !known[k.Value]:
			return nil, fileError(file, k, "config error, unknown key '%s'", k.Value)
		}
		if _, dup := out[k.Value]; dup {
			return nil, fileError(file, k, "key '%s' given twice", k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

// scalar returns a scalar's text ("" for null).
func scalar(file string, n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", fileError(file, n, "%s must be a string, got %s", what, kindName(n))
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

func boolean(file string, n *yaml.Node, what string) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		return false, fileError(file, n, "%s must be true or false, got %s", what, kindName(n))
	}
	return b, nil
}

func integer(file string, n *yaml.Node, what string, lo, hi uint64) (uint64, error) {
	v, err := strconv.ParseUint(n.Value, 10, 64)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil || v < lo || v > hi {
		return 0, fileError(file, n, "%s must be an integer from %d to %d, got %s", what, lo, hi, kindName(n))
	}
	return v, nil
}

// parser holds what the descriptors of one file share.
type parser struct {
	file, domain string
	policies     map[string]string // policy name -> file, across files
}

// Keys of a descriptor and of its rate_limit, ours included.
var (
	descriptorKeys = map[string]bool{"key": true, "value": true, "rate_limit": true, "descriptors": true, "shadow_mode": true}
	rateLimitKeys  = map[string]bool{
		"unit": true, "requests_per_unit": true, "unlimited": true, "name": true, "replaces": true,
		// fleetlimit's own
		"unit_multiplier": true, "algorithm": true, "burst": true, "failure_mode": true,
	}
)

// descriptors loads a list of descriptors below parent; path is the
// parent's path ("domain.key_value...").
func (p *parser) descriptors(parent *node, list *yaml.Node, path string) error {
	if list == nil || list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
		return nil
	}
	if list.Kind != yaml.SequenceNode {
		return fileError(p.file, list, "descriptors must be a list, got %s", kindName(list))
	}
	for _, d := range list.Content {
		if d.Kind != yaml.MappingNode {
			return fileError(p.file, d, "config error, yaml file contains list of type other than map: %v", d.Value)
		}
		fields, err := mapping(p.file, d, descriptorKeys)
		if err != nil {
			return err
		}
		var ek entryKey
		if n := fields["key"]; n != nil {
			if ek.key, err = scalar(p.file, n, "key"); err != nil {
				return err
			}
		}
		if ek.key == "" {
			return fileError(p.file, d, "descriptor has empty key")
		}
		if n := fields["value"]; n != nil {
			if ek.value, err = scalar(p.file, n, "value"); err != nil {
				return err
			}
		}
		ek.hasValue = ek.value != ""
		full := path + "." + ek.key
		if ek.hasValue {
			full += "_" + ek.value
		}
		if _, dup := parent.children[ek]; dup {
			return fileError(p.file, d, "duplicate descriptor composite key '%s'", full)
		}
		child := &node{children: map[entryKey]*node{}}
		shadow := false
		if n := fields["shadow_mode"]; n != nil {
			if shadow, err = boolean(p.file, n, "shadow_mode"); err != nil {
				return err
			}
		}
		if n := fields["rate_limit"]; n != nil {
			if child.limit, err = p.rateLimit(n, full); err != nil {
				return err
			}
			child.limit.Shadow = shadow
			child.limit.Descriptor = full[len(p.domain)+1:]
		}
		if err := p.descriptors(child, fields["descriptors"], full); err != nil {
			return err
		}
		parent.children[ek] = child
		if ek.hasValue && strings.Contains(ek.value, "*") {
			parent.wildcards = append(parent.wildcards, wildcard{key: ek.key, parts: strings.Split(ek.value, "*"), node: child})
		}
	}
	return nil
}

// Units of envoyproxy/ratelimit (a month is 30 days, a year 365).
var units = map[string]struct {
	unit   pb.RateLimitResponse_RateLimit_Unit
	length time.Duration
}{
	"second": {pb.RateLimitResponse_RateLimit_SECOND, time.Second},
	"minute": {pb.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	"hour":   {pb.RateLimitResponse_RateLimit_HOUR, time.Hour},
	"day":    {pb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	"week":   {pb.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	"month":  {pb.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	"year":   {pb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// failureModes are the failure modes a rate_limit names, and the decision
// mode each stands for while Redis is out (as in the service's policy file).
var failureModes = map[string]ratelimit.Mode{"fallback": ratelimit.ModeLocal, "open": ratelimit.ModeOpen, "closed": ratelimit.ModeClosed}

// rateLimit loads the rate_limit of the descriptor at path.
func (p *parser) rateLimit(n *yaml.Node, path string) (*Limit, error) {
	fields, err := mapping(p.file, n, rateLimitKeys)
	if err != nil {
		return nil, err
	}
	str := func(k string) (string, error) {
		if v := fields[k]; v != nil {
			return scalar(p.file, v, k)
		}
		return "", nil
	}
	l := &Limit{}
	if v := fields["unlimited"]; v != nil {
		if l.Unlimited, err = boolean(p.file, v, "unlimited"); err != nil {
			return nil, err
		}
	}
	if l.Name, err = str("name"); err != nil {
		return nil, err
	}
	if v := fields["replaces"]; v != nil && !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		if v.Kind != yaml.SequenceNode {
			return nil, fileError(p.file, v, "replaces must be a list, got %s", kindName(v))
		}
		for _, r := range v.Content {
			rf, err := mapping(p.file, r, map[string]bool{"name": true})
			if err != nil {
				return nil, err
			}
			name := ""
			if rn := rf["name"]; rn != nil {
				if name, err = scalar(p.file, rn, "name"); err != nil {
					return nil, err
				}
			}
			switch {
			case name == "":
				return nil, fileError(p.file, r, "should not have an empty replaces entry")
			case name == l.Name:
				return nil, fileError(p.file, r, "replaces should not contain name of same descriptor")
			}
			l.Replaces = append(l.Replaces, name)
		}
	}
	unitName, err := str("unit")
	if err != nil {
		return nil, err
	}
	u, validUnit := units[strings.ToLower(unitName)]
	if l.Unlimited {
		if validUnit {
			return nil, fileError(p.file, n, "should not specify rate limit unit when unlimited")
		}
		for _, k := range []string{"algorithm", "burst", "failure_mode", "unit_multiplier"} {
			if fields[k] != nil {
				return nil, fileError(p.file, fields[k], "%s has no meaning for an unlimited descriptor", k)
			}
		}
		return l, nil
	}
	if !validUnit {
		at := fields["unit"]
		if at == nil {
			at = n
		}
		return nil, fileError(p.file, at, "invalid rate limit unit '%s'", unitName)
	}
	var rpu uint64
	if v := fields["requests_per_unit"]; v != nil {
		if rpu, err = integer(p.file, v, "requests_per_unit", 0, math.MaxUint32); err != nil {
			return nil, err
		}
	}
	multiplier := uint64(1)
	if v := fields["unit_multiplier"]; v != nil {
		if multiplier, err = integer(p.file, v, "unit_multiplier", 1, 1_000_000); err != nil {
			return nil, err
		}
	}
	l.RateLimit = &pb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: uint32(rpu), Unit: u.unit}
	if multiplier > 1 {
		l.RateLimit.UnitMultiplier = wrapperspb.UInt32(uint32(multiplier))
	}
	pol := ratelimit.Policy{
		Name:      policyName(path),
		Algorithm: DefaultAlgorithm,
		Limit:     int64(rpu),
		Window:    u.length * time.Duration(multiplier),
	}
	if v := fields["algorithm"]; v != nil {
		s, err := scalar(p.file, v, "algorithm")
		if err != nil {
			return nil, err
		}
		if pol.Algorithm, err = ratelimit.ParseAlgorithm(s); err != nil {
			return nil, fileError(p.file, v, "algorithm must be token_bucket, sliding_window_log, sliding_window_counter or gcra, got %q", s)
		}
	}
	if v := fields["burst"]; v != nil {
		b, err := integer(p.file, v, "burst", 1, ratelimit.MaxLimit)
		if err != nil {
			return nil, err
		}
		pol.Burst = int64(b)
	}
	if v := fields["failure_mode"]; v != nil {
		s, err := scalar(p.file, v, "failure_mode")
		if err != nil {
			return nil, err
		}
		mode, ok := failureModes[s]
		if !ok {
			return nil, fileError(p.file, v, "failure_mode must be fallback, open or closed, got %q", s)
		}
		pol.FailureMode = mode
	}
	if rpu == 0 {
		// Every request is over the limit; nothing to count.
		l.Block, l.Policy = true, pol
		return l, nil
	}
	if err := pol.Validate(); err != nil {
		var fe *ratelimit.FieldError
		if errors.As(err, &fe) {
			return nil, fileError(p.file, n, "%s %s (window %v from unit %s × %d)", fe.Field, fe.Reason, pol.Window, unitName, multiplier)
		}
		return nil, fileError(p.file, n, "%v", err)
	}
	if other, dup := p.policies[pol.Name]; dup {
		return nil, fileError(p.file, n, "the policy name %s derived from %s is also used in %s", pol.Name, path, other)
	}
	p.policies[pol.Name] = p.file
	l.Policy = pol
	return l, nil
}

// policyName is the policy name of the descriptor at path
// ("domain.key_value.key"): the path itself when it is a valid policy name,
// else "rls-" and a hash of it.
func policyName(path string) string {
	if ratelimit.ValidateName(path) == nil {
		return path
	}
	h := sha256.Sum256([]byte(path))
	return "rls-" + hex.EncodeToString(h[:8])
}
