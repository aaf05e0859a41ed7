package invariant

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// InstanceStatus is one instance's /status document.
type InstanceStatus struct {
	Instance string `json:"instance"`
	// Final: the process running after settle. Otherwise the last snapshot
	// of an incarnation killed during the run.
	Final bool           `json:"final"`
	Body  map[string]any `json:"status,omitempty"`
	Err   string         `json:"error,omitempty"`
}

// The /status fields the reconciled invariant reads (the app's admin
// /status: the resilient limiter's "limiter" object and its "journal"
// counters, in units). Each is searched at any depth, breadth first, so the
// layout may change as long as the names stay.
const (
	// fieldGranted counts every request the instance granted locally
	// (journaled or not).
	fieldGranted = "local_grants"
	// fieldJournal is the object of journal counters below.
	fieldJournal   = "journal"
	fieldReloaded  = "reloaded"        // found in the journal file at start
	fieldReplayed  = "replayed"        // folded into Redis
	fieldPresent   = "present"         // already in Redis (a decision that timed out but ran)
	fieldDropped   = "dropped"         // too old to matter: dropped as expired
	fieldDupUnits  = "duplicate_units" // in batches Redis had already applied
	fieldPending   = "pending"         // still journaled
	fieldJournaled = "journal_size"    // still journaled, when the journal object lacks pending
)

// ReconciledBound is the reconciled invariant's bound, in words.
const ReconciledBound = "local_grants + inherited - handed_over = replayed + dropped_expired + duplicates_refused + journaled; journaled = 0 (no batch is applied twice: its marker refuses a second send)"

// Reconciliation sums the reconciled quantities over all instances (and
// killed incarnations), in units.
type Reconciliation struct {
	// GrantedLocally: requests granted from the fallback budget.
	GrantedLocally int64 `json:"local_grants"`
	// Inherited: grants a process found in its journal file at start (left
	// by an earlier incarnation); HandedOver: grants a killed incarnation
	// still held, which its successor inherits.
	Inherited  int64 `json:"inherited"`
	HandedOver int64 `json:"handed_over"`
	// Replayed counts grants folded into Redis, Present among them the
	// ones Redis already held.
	Replayed int64 `json:"replayed"`
	Present  int64 `json:"present"`
	// DroppedExpired: too old to matter when Redis came back.
	DroppedExpired int64 `json:"dropped_expired"`
	// DuplicatesRefused: units in replay batches sent again after Redis had
	// applied them without the acknowledgement arriving (a replay that
	// timed out but ran); the idempotency marker refused the second send,
	// so they count once, as replayed by the first. Duplicates replayed
	// (a batch applied twice) cannot happen while markers work; the
	// sliding window log's member count cross-checks that in Redis.
	DuplicatesRefused int64 `json:"duplicates_refused"`
	// Journaled: still waiting in a journal after settle.
	Journaled int64 `json:"journaled"`
	// Imbalance is the left side of the bound minus the right side.
	Imbalance int64 `json:"imbalance"`
}

// ReconciledRow judges "granted locally = replayed + dropped as expired +
// still journaled (0 at settle); duplicates replayed: 0" over all
// instances, from their /status after settle:
//
//   - granted locally is local_grants, plus what a process inherited from
//     its journal file at start (journal.reloaded), minus what a killed
//     incarnation still held at its last snapshot (journal.pending, which
//     its successor inherits);
//   - replayed is journal.replayed plus journal.present (units Redis
//     already held: a decision that timed out but ran);
//   - dropped as expired is journal.dropped, still journaled
//     journal.pending (journal_size); journal.duplicate_units were
//     applied by an earlier send whose acknowledgement was lost, and count
//     on the replayed side (duplicates_refused).
//
// A killed incarnation counts through its last snapshot, taken just before
// the kill. The row fails, saying why, when a status is missing or lacks a
// field.
func ReconciledRow(statuses []InstanceStatus) Row {
	row := Row{Name: Reconciled, Route: AllRoutes, Phase: Settle, Bound: ReconciledBound}
	if len(statuses) == 0 {
		row.Measured = "no /status collected"
		return row
	}
	var (
		unavailable, missing, missingIn []string
		sum                             Reconciliation
	)
	for _, st := range statuses {
		if st.Err != "" {
			unavailable = append(unavailable, st.Instance+": "+st.Err)
			continue
		}
		lacks := false
		need := func(doc map[string]any, name string) int64 {
			v, ok := lookupNumber(doc, name)
			if !ok {
				lacks = true
				if !slices.Contains(missing, name) {
					missing = append(missing, name)
				}
			}
			return v
		}
		granted := need(st.Body, fieldGranted)
		journal, ok := lookupObject(st.Body, fieldJournal)
		if !ok {
			need(map[string]any{}, fieldJournal)
			missingIn = append(missingIn, st.Instance)
			continue
		}
		reloaded := need(journal, fieldReloaded)
		replayed := need(journal, fieldReplayed)
		present := need(journal, fieldPresent)
		dropped := need(journal, fieldDropped)
		dups := need(journal, fieldDupUnits)
		pending, ok := lookupNumber(journal, fieldPending)
		if !ok {
			pending = need(st.Body, fieldJournaled)
		}
		if lacks {
			missingIn = append(missingIn, st.Instance)
			continue
		}
		sum.GrantedLocally += granted
		sum.Inherited += reloaded
		sum.Replayed += replayed + present
		sum.Present += present
		sum.DroppedExpired += dropped
		sum.DuplicatesRefused += dups
		if st.Final {
			sum.Journaled += pending
		} else {
			sum.HandedOver += pending
		}
	}
	switch {
	case len(unavailable) > 0:
		row.Measured = "status unavailable: " + strings.Join(unavailable, "; ")
	case len(missing) > 0:
		row.Measured = fmt.Sprintf("status fields missing: %s (in %s)", strings.Join(missing, ", "), strings.Join(missingIn, ", "))
	default:
		sum.Imbalance = sum.GrantedLocally + sum.Inherited - sum.HandedOver -
			(sum.Replayed + sum.DroppedExpired + sum.DuplicatesRefused + sum.Journaled)
		row.Measured = sum
		row.Pass = sum.Imbalance == 0 && sum.Journaled == 0
	}
	return row
}

// lookupNumber finds name in a JSON document, breadth first, as an integer.
func lookupNumber(doc map[string]any, name string) (int64, bool) {
	v, ok := lookup(doc, name, func(v any) bool { _, ok := asInt(v); return ok })
	if !ok {
		return 0, false
	}
	n, _ := asInt(v)
	return n, true
}

// lookupObject finds the object name in a JSON document, breadth first.
func lookupObject(doc map[string]any, name string) (map[string]any, bool) {
	v, ok := lookup(doc, name, func(v any) bool { _, ok := v.(map[string]any); return ok })
	if !ok {
		return nil, false
	}
	m, ok := v.(map[string]any)
	return m, ok
}

func lookup(doc map[string]any, name string, fits func(any) bool) (any, bool) {
	queue := []map[string]any{doc}
	for len(queue) > 0 {
		m := queue[0]
		queue = queue[1:]
		if v, ok := m[name]; ok && fits(v) {
			return v, true
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if sub, ok := m[k].(map[string]any); ok {
				queue = append(queue, sub)
			}
		}
	}
	return nil, false
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case float64:
		return int64(x), x == float64(int64(x))
	case json.Number:
		n, err := x.Int64()
		return n, err == nil
	case int:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}
