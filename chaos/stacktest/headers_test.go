//go:build linux

package stacktest

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// sfItem is one member of an RFC 9651 structured-field List whose bare item
// is a String and whose parameters are Integers, the shape of the draft-11
// headers: "name";q=100;w=10.
type sfItem struct {
	name   string
	params map[string]int64
}

// parseSFList parses such a List. It refuses what these headers never hold
// (tokens, decimals, booleans, inner lists), so a malformed value cannot
// pass as a well-formed one.
func parseSFList(v string) ([]sfItem, error) {
	var items []sfItem
	s := strings.TrimLeft(v, " \t")
	for {
		it, rest, err := parseSFItem(s)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return items, nil
		}
		if rest[0] != ',' {
			return nil, fmt.Errorf("sf list %q: want ',' or the end at %q", v, rest)
		}
		s = strings.TrimLeft(rest[1:], " \t")
		if s == "" {
			return nil, fmt.Errorf("sf list %q: trailing comma", v)
		}
	}
}

func parseSFItem(s string) (sfItem, string, error) {
	it := sfItem{params: map[string]int64{}}
	if s == "" || s[0] != '"' {
		return it, "", fmt.Errorf("sf item %q: want a String", s)
	}
	var name strings.Builder
	i := 1
	for ; ; i++ {
		if i >= len(s) {
			return it, "", fmt.Errorf("sf item %q: unterminated String", s)
		}
		c := s[i]
		if c == '\\' {
			i++
			if i >= len(s) || (s[i] != '"' && s[i] != '\\') {
				return it, "", fmt.Errorf("sf item %q: bad escape", s)
			}
			name.WriteByte(s[i])
			continue
		}
		if c == '"' {
			break
		}
		if c < 0x20 || c > 0x7e {
			return it, "", fmt.Errorf("sf item %q: byte %#x in a String", s, c)
		}
		name.WriteByte(c)
	}
	it.name = name.String()
	rest := s[i+1:]
	for len(rest) > 0 && rest[0] == ';' {
		rest = strings.TrimLeft(rest[1:], " ")
		j := 0
		for j < len(rest) && (rest[j] >= 'a' && rest[j] <= 'z' || j > 0 && (rest[j] >= '0' && rest[j] <= '9' || strings.IndexByte("_-.*", rest[j]) >= 0) || j == 0 && rest[j] == '*') {
			j++
		}
		if j == 0 {
			return it, "", fmt.Errorf("sf item %q: bad parameter key", s)
		}
		key := rest[:j]
		rest = rest[j:]
		if rest == "" || rest[0] != '=' {
			return it, "", fmt.Errorf("sf item %q: parameter %s has no Integer value", s, key)
		}
		rest = rest[1:]
		k := 0
		if k < len(rest) && rest[k] == '-' {
			k++
		}
		digits := k
		for k < len(rest) && rest[k] >= '0' && rest[k] <= '9' {
			k++
		}
		if k == digits || k-digits > 15 {
			return it, "", fmt.Errorf("sf item %q: parameter %s is not an Integer", s, key)
		}
		n, _ := strconv.ParseInt(rest[:k], 10, 64)
		if _, dup := it.params[key]; dup {
			return it, "", fmt.Errorf("sf item %q: parameter %s twice", s, key)
		}
		it.params[key] = n
		rest = rest[k:]
	}
	return it, rest, nil
}

// rateHeaders are the parsed rate-limit headers of one answer.
type rateHeaders struct {
	policy string // the policy name, from RateLimit-Policy
	q, w   int64  // quota, window (s)
	r, t   int64  // remaining, seconds until the quota is fully available
	// others are the further policies the headers list (the per-address
	// ceiling), in order.
	others []rateHeaders
}

// single returns the one value of header name, or an error if it is
// missing or repeated.
func single(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	if len(vs) != 1 {
		return "", fmt.Errorf("%s: want exactly one, got %q", name, vs)
	}
	return vs[0], nil
}

func singleInt(h http.Header, name string) (int64, error) {
	v, err := single(h, name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != v {
		return 0, fmt.Errorf("%s: %q is not a non-negative integer", name, v)
	}
	return n, nil
}

// parseRateHeaders reads and cross-checks RateLimit-Policy, RateLimit and
// the X-RateLimit trio. The draft headers list the same policies in the
// same order (draft-11 allows several): the route's own first, then the
// per-address ceiling. Each has q > 0, w > 0, 0 <= r <= q, t >= 0. The trio
// describes one of them (the most restrictive): Limit = q, Remaining = r,
// Reset = t. The first policy is returned, the rest in others.
func parseRateHeaders(h http.Header) (rateHeaders, error) {
	list := func(name string, keys ...string) ([]sfItem, error) {
		v, err := single(h, name)
		if err != nil {
			return nil, err
		}
		items, err := parseSFList(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if len(items) == 0 {
			return nil, fmt.Errorf("%s: no policy in %q", name, v)
		}
		for _, it := range items {
			for _, k := range keys {
				if _, ok := it.params[k]; !ok {
					return nil, fmt.Errorf("%s: %q lacks %s=", name, v, k)
				}
			}
		}
		return items, nil
	}
	pols, err := list("RateLimit-Policy", "q", "w")
	if err != nil {
		return rateHeaders{}, err
	}
	rls, err := list("RateLimit", "r", "t")
	if err != nil {
		return rateHeaders{}, err
	}
	if len(pols) != len(rls) {
		return rateHeaders{}, fmt.Errorf("RateLimit-Policy lists %d policies, RateLimit %d", len(pols), len(rls))
	}
	all := make([]rateHeaders, len(pols))
	for i, pol := range pols {
		rl := rls[i]
		rh := rateHeaders{policy: pol.name, q: pol.params["q"], w: pol.params["w"], r: rl.params["r"], t: rl.params["t"]}
		switch {
		case rh.policy == "":
			return rh, errors.New("RateLimit-Policy: empty policy name")
		case rl.name != rh.policy:
			return rh, fmt.Errorf("RateLimit names %q, RateLimit-Policy %q (item %d)", rl.name, rh.policy, i)
		case rh.q <= 0 || rh.w <= 0:
			return rh, fmt.Errorf("RateLimit-Policy %q: q=%d w=%d, want both > 0", rh.policy, rh.q, rh.w)
		case rh.r < 0 || rh.r > rh.q:
			return rh, fmt.Errorf("RateLimit %q: r=%d outside [0, q=%d]", rh.policy, rh.r, rh.q)
		case rh.t < 0:
			return rh, fmt.Errorf("RateLimit %q: t=%d < 0", rh.policy, rh.t)
		}
		all[i] = rh
	}
	var x [3]int64
	for i, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if x[i], err = singleInt(h, name); err != nil {
			return all[0], err
		}
	}
	described := false
	for _, rh := range all {
		described = described || (x == [3]int64{rh.q, rh.r, rh.t})
	}
	if !described {
		return all[0], fmt.Errorf("X-RateLimit-Limit/Remaining/Reset %v describe none of the policies %+v", x, all)
	}
	rh := all[0]
	rh.others = all[1:]
	return rh, nil
}

// problem is an RFC 9457 body.
type problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	RetryAfter *int64 `json:"retry_after"`
	Policy     string `json:"policy"`
}

// isProblem reports whether h declares an application/problem+json body.
func isProblem(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "application/problem+json"
}

// parseProblem checks that an answer is an RFC 9457 problem with the given
// status: the media type, and type, title, status, detail in the body.
func parseProblem(status int, h http.Header, body []byte) (problem, error) {
	var p problem
	if !isProblem(h) {
		return p, fmt.Errorf("Content-Type %q, want application/problem+json (body %.200q)", h.Get("Content-Type"), body)
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return p, fmt.Errorf("problem body: %w: %.200q", err, body)
	}
	switch {
	case p.Type == "" || p.Type != "about:blank" && !strings.Contains(p.Type, "://"):
		return p, fmt.Errorf("problem type %q: want a URI", p.Type)
	case p.Title == "":
		return p, errors.New("problem without a title")
	case p.Detail == "":
		return p, errors.New("problem without a detail")
	case p.Status != status:
		return p, fmt.Errorf("problem status %d in a %d answer", p.Status, status)
	}
	return p, nil
}

func TestParseSFList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []sfItem
		bad  bool
	}{
		{in: `"default";q=100;w=10`, want: []sfItem{{"default", map[string]int64{"q": 100, "w": 10}}}},
		{in: `"a";r=0;t=17, "b\"c";r=5;t=1`, want: []sfItem{{"a", map[string]int64{"r": 0, "t": 17}}, {`b"c`, map[string]int64{"r": 5, "t": 1}}}},
		{in: `"x"; q=1`, want: []sfItem{{"x", map[string]int64{"q": 1}}}},
		{in: `default;q=100`, bad: true},          // a token, not a String (the pre-09 syntax)
		{in: `"default";q=100.5`, bad: true},      // a Decimal
		{in: `"default";q`, bad: true},            // a Boolean
		{in: `"default";Q=1`, bad: true},          // keys are lowercase
		{in: `"default";q=1;q=2`, bad: true},      // duplicate
		{in: `"default",`, bad: true},             // trailing comma
		{in: `"default" "x"`, bad: true},          // no separator
		{in: `"unterminated;q=1`, bad: true},      //
		{in: "\"tab\there\";q=1", bad: true},      // control byte in a String
		{in: `"n";q=1234567890123456`, bad: true}, // 16 digits
	} {
		got, err := parseSFList(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("parseSFList(%q) = %v, want an error", c.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseSFList(%q): %v", c.in, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("parseSFList(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}
