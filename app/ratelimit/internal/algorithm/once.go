package algorithm

import (
	"strconv"
	"strings"
)

// Admission is what a key remembers of an admitted request for the
// at-most-once rule: its request id and its store time (µs). Twin of
// redisstore's lua/once.lua, where the token bucket's, GCRA's and the
// counter's hash keep the key's last admission in field i (String's form),
// and of the sliding window log's members, each an admission of its id
// scored by its time. A request with the id of an admission less than the
// resend window from it (a proxy's resend of a request it may have got
// decided) is admitted without being counted again; later, the same id
// counts like any other. The zero value is no admission.
type Admission struct {
	ID string
	At int64
}

// Resend reports whether a request with id at now (µs) is a resend of a:
// the same, non-empty id, less than window µs from a's time, on either side
// (a store clock that stepped back by less than the window still recognises
// a resend).
func (a Admission) Resend(id string, now, window int64) bool {
	d := now - a.At
	return id != "" && id == a.ID && d < window && -d < window
}

// Hint returns what a refusal at now reports of a (ratelimit.Decision's
// ResendID and ResendUntil): its id and the time until which a request with
// it is a resend, while that time is ahead; "" and 0 otherwise.
func (a Admission) Hint(now, window int64) (string, int64) {
	if !a.Resend(a.ID, now, window) {
		return "", 0
	}
	return a.ID, a.At + window
}

// String encodes a as lua/once.lua's field i: "<µs>:<id>".
func (a Admission) String() string { return strconv.FormatInt(a.At, 10) + ":" + a.ID }

// ParseAdmission decodes String's form. A field in any other form (one
// written before the time was part of it, say) is no admission: a request
// with its id counts.
func ParseAdmission(s string) (Admission, bool) {
	at, id, ok := strings.Cut(s, ":")
	if !ok {
		return Admission{}, false
	}
	n, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return Admission{}, false
	}
	return Admission{ID: id, At: n}, true
}
