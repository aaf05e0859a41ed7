package journal

import (
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// record is one line of the journal file (see Journal for the format). One
// codec writes and reads every kind: appendRecord and parseRecord are
// inverses (FuzzRecord checks it).
type record struct {
	kind  byte // 'E', 'G', 'D', 'R', 'A', 'X' or 'S'
	epoch uint64
	// policy: G, D and S carry its name, algorithm, limit, window and
	// burst; A and X its name, with fingerprint; X's time is grant.At.
	policy      ratelimit.Policy
	fingerprint string
	identity    store.Identity // G, D, A, S
	grant       store.Grant    // G, D; R: only the request id
	present     bool           // R: the store had the doubtful grant
	// S: what the key's local share started from.
	valid     bool
	n         float64
	confirmed int64
	state     contract.State
}

// Record field counts, without the checksum.
const (
	epochFields    = 2
	grantFields    = 11
	resolveFields  = 4
	ackFields      = 5
	dropFields     = 6
	snapshotFields = 8 + 3 + 7 + contract.AgeBuckets
)

// crcLen is the length of a record's checksum: a tab and eight hex digits
// of the CRC-32 (IEEE) of the line before it. A line torn by a crash, or
// damaged on disk, fails it even where what is left would parse (a grant
// whose cost lost its last digits, say).
const crcLen = 9

var crcTable = crc32.MakeTable(crc32.IEEE)

// maxFleet bounds the fleet size an S record may name.
const maxFleet = 1 << 20

var errRecord = errors.New("journal: malformed record")

// appendRecord appends r's line, with its checksum and newline, to b.
func appendRecord(b []byte, r record) []byte {
	start := len(b)
	b = append(b, r.kind, '\t')
	b = strconv.AppendUint(b, r.epoch, 10)
	p := r.policy
	switch r.kind {
	case 'R':
		b = append(append(b, '\t'), r.grant.ID...)
		if r.present {
			b = append(b, "\t1"...)
		} else {
			b = append(b, "\t0"...)
		}
	case 'A', 'X':
		b = append(append(append(b, '\t'), p.Name...), '\t')
		b = append(append(b, r.fingerprint...), '\t')
		b = hex.AppendEncode(b, r.identity[:])
		if r.kind == 'X' {
			b = strconv.AppendInt(append(b, '\t'), r.grant.At, 10)
		}
	case 'G', 'D', 'S':
		b = append(append(append(b, '\t'), p.Name...), '\t')
		b = append(append(b, p.Algorithm...), '\t')
		b = append(strconv.AppendInt(b, p.Limit, 10), '\t')
		b = append(strconv.AppendInt(b, p.Window.Microseconds(), 10), '\t')
		b = append(strconv.AppendInt(b, p.Burst, 10), '\t')
		b = hex.AppendEncode(b, r.identity[:])
		if r.kind != 'S' {
			b = append(strconv.AppendInt(append(b, '\t'), r.grant.At, 10), '\t')
			b = append(strconv.AppendInt(b, r.grant.Cost, 10), '\t')
			b = append(b, r.grant.ID...)
			break
		}
		if r.valid {
			b = append(b, "\t1\t"...)
		} else {
			b = append(b, "\t0\t"...)
		}
		b = strconv.AppendFloat(b, r.n, 'g', -1, 64)
		st := r.state
		for _, v := range [...]int64{r.confirmed, st.Now, st.Tokens, st.TAT, st.TATRem, st.WindowStart, st.Current, st.Previous} {
			b = strconv.AppendInt(append(b, '\t'), v, 10)
		}
		for _, v := range st.Ages {
			b = strconv.AppendInt(append(b, '\t'), v, 10)
		}
	}
	sum := crc32.Checksum(b[start:], crcTable)
	b = append(b, '\t')
	b = hex.AppendEncode(b, []byte{byte(sum >> 24), byte(sum >> 16), byte(sum >> 8), byte(sum)})
	return append(b, '\n')
}

// parseRecord parses one line (without its newline). Whatever it accepts,
// appendRecord writes back as the same line; anything else (a checksum that
// does not match included) is errRecord.
func parseRecord(line string) (record, error) {
	if len(line) < crcLen+1 || line[len(line)-crcLen] != '\t' {
		return record{}, errRecord
	}
	body, sum := line[:len(line)-crcLen], line[len(line)-crcLen+1:]
	want, err := hex.DecodeString(sum)
	if err != nil || hex.EncodeToString(want) != sum ||
		crc32.Checksum([]byte(body), crcTable) != uint32(want[0])<<24|uint32(want[1])<<16|uint32(want[2])<<8|uint32(want[3]) {
		return record{}, errRecord
	}
	return parseBody(body)
}

// parseBody parses a record's line without its checksum.
func parseBody(line string) (record, error) {
	f := strings.Split(line, "\t")
	if len(f) < 2 || len(f[0]) != 1 {
		return record{}, errRecord
	}
	r := record{kind: f[0][0]}
	var err error
	if r.epoch, err = strconv.ParseUint(f[1], 10, 64); err != nil || strconv.FormatUint(r.epoch, 10) != f[1] {
		return record{}, errRecord
	}
	ints := func(fields []string) ([]int64, bool) {
		out := make([]int64, len(fields))
		for i, s := range fields {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil || strconv.FormatInt(v, 10) != s {
				return nil, false
			}
			out[i] = v
		}
		return out, true
	}
	identity := func(s string) bool {
		b, err := hex.DecodeString(s)
		if err != nil || len(b) != len(r.identity) || hex.EncodeToString(b) != s {
			return false
		}
		copy(r.identity[:], b)
		return true
	}
	// policy reads name, algorithm, limit, window and burst from f[2:7].
	policy := func() bool {
		n, ok := ints(f[4:7])
		if !ok {
			return false
		}
		r.policy = ratelimit.Policy{Name: f[2], Algorithm: ratelimit.Algorithm(f[3]), Limit: n[0], Window: time.Duration(n[1]) * time.Microsecond, Burst: n[2]}
		return r.policy.Validate() == nil && r.policy.Window.Microseconds() == n[1]
	}
	switch r.kind {
	case 'E':
		if len(f) != epochFields {
			return record{}, errRecord
		}
	case 'A':
		if len(f) != ackFields || contract.ValidateKey(f[2]) != nil || strings.ContainsAny(f[2]+f[3], " ") || f[3] == "" || !identity(f[4]) {
			return record{}, errRecord
		}
		r.policy.Name, r.fingerprint = f[2], f[3]
	case 'X':
		if len(f) != dropFields || contract.ValidateKey(f[2]) != nil || strings.ContainsAny(f[2]+f[3], " ") || f[3] == "" || !identity(f[4]) {
			return record{}, errRecord
		}
		n, ok := ints(f[5:6])
		if !ok {
			return record{}, errRecord
		}
		r.policy.Name, r.fingerprint, r.grant.At = f[2], f[3], n[0]
	case 'R':
		if len(f) != resolveFields || !requestID(f[2]) || f[2] == "" || (f[3] != "0" && f[3] != "1") {
			return record{}, errRecord
		}
		r.grant.ID, r.present = f[2], f[3] == "1"
	case 'G', 'D':
		if len(f) != grantFields || !policy() || !identity(f[7]) {
			return record{}, errRecord
		}
		n, ok := ints(f[8:10])
		if !ok || n[1] <= 0 {
			return record{}, errRecord
		}
		r.grant = store.Grant{At: n[0], Cost: n[1], ID: f[10]}
		if !requestID(f[10]) || (r.kind == 'D' && f[10] == "") {
			return record{}, errRecord
		}
	case 'S':
		if len(f) != snapshotFields || !policy() || !identity(f[7]) || (f[8] != "0" && f[8] != "1") {
			return record{}, errRecord
		}
		r.valid = f[8] == "1"
		if r.n, err = strconv.ParseFloat(f[9], 64); err != nil || !(r.n >= 1 && r.n <= maxFleet) || // not NaN, not Inf
			strconv.FormatFloat(r.n, 'g', -1, 64) != f[9] {
			return record{}, errRecord
		}
		v, ok := ints(f[10:])
		if !ok {
			return record{}, errRecord
		}
		r.confirmed = v[0]
		r.state = contract.State{Now: v[1], Tokens: v[2], TAT: v[3], TATRem: v[4], WindowStart: v[5], Current: v[6], Previous: v[7]}
		copy(r.state.Ages[:], v[8:])
	default:
		return record{}, fmt.Errorf("%w: kind %q", errRecord, f[0])
	}
	return r, nil
}

// requestID reports whether s is a request id a record may hold: empty, or
// a valid key without a space or '#'.
func requestID(s string) bool {
	return s == "" || contract.ValidateKey(s) == nil && !strings.ContainsAny(s, " #")
}

// snapshot returns an S record's snapshot.
func (r record) snapshot() Snapshot {
	return Snapshot{Policy: r.policy, Identity: r.identity, State: r.state, Valid: r.valid, N: r.n, Confirmed: r.confirmed}
}

// snapshotRecord is the S record of s in epoch.
func snapshotRecord(epoch uint64, s Snapshot) record {
	return record{kind: 'S', epoch: epoch, policy: s.Policy, identity: s.Identity,
		valid: s.Valid, n: s.N, confirmed: s.Confirmed, state: s.State}
}
