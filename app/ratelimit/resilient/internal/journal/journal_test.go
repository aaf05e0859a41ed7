package journal_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

var jp = ratelimit.Policy{Name: "j", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Minute}

func TestJournalSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := store.IdentityOf("a"), store.IdentityOf("b")
	for i, g := range []struct {
		id store.Identity
		g  store.Grant
	}{{a, store.Grant{At: 1, Cost: 1, ID: "r1"}}, {a, store.Grant{At: 2, Cost: 2, ID: "r2"}}, {b, store.Grant{At: 3, Cost: 1, ID: "r3"}}} {
		if err := j.Append(jp, g.id, g.g); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	epoch := j.Rotate()
	pending, _ := j.Pending(epoch)
	if len(pending) != 2 {
		t.Fatalf("%d batches, want 2 (one per key)", len(pending))
	}
	for _, p := range pending {
		if p.Identity == b {
			j.Ack([]store.ReplayBatch{p}, []store.ReplayResult{{Replayed: 1}})
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	// A torn last line, as a crash mid-write leaves it.
	f, err := os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("G\t1\tj\tsliding_window_log\t10\t600")
	_ = f.Close()

	j2, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	st := j2.Stats()
	if j2.Len() != 2 || st.Reloaded != 3 || st.Corrupt != 1 || st.Epoch <= epoch {
		t.Fatalf("reopened: len %d stats %+v, want a's 2 grants (3 units), 1 corrupt line, a later epoch", j2.Len(), st)
	}
	got, _ := j2.Pending(st.Epoch)
	if len(got) != 1 || got[0].Identity != a || len(got[0].Grants) != 2 || got[0].Grants[1].ID != "r2" || got[0].Marker != "app1:"+strconv.FormatUint(epoch, 10) {
		t.Fatalf("reloaded batches %+v", got)
	}
}

func TestJournalAckEmptiesTheFile(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	_ = j.Append(jp, store.IdentityOf("a"), store.Grant{At: 1, Cost: 1, ID: "r1"})
	pending, _ := j.Pending(j.Rotate())
	j.Ack(pending, make([]store.ReplayResult, len(pending)))
	data, err := os.ReadFile(filepath.Join(dir, "journal.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "G\t") {
		t.Fatalf("file after every batch was applied:\n%s", data)
	}
}

func TestJournalOverflowIsCounted(t *testing.T) {
	j, err := journal.Open("", "app1", 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for i := range 5 {
		err := j.Append(jp, store.IdentityOf("a"), store.Grant{At: int64(i), Cost: 1, ID: "r"})
		if (i >= 2) != (err == journal.ErrFull) {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if s := j.Stats(); s.Granted != 2 || s.Overflow != 3 || s.Pending != 2 {
		t.Fatalf("stats %+v, want 2 journaled and 3 overflowed", s)
	}
}

// A journal whose file ends in damage (a torn acknowledgement, a 2 MiB tail
// of zeros without a newline, as a crash can leave it) opens, keeps the
// records before and between the damage, and counts what it skipped.
func TestJournalSkipsDamage(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := store.IdentityOf("a"), store.IdentityOf("b")
	_ = j.Append(jp, a, store.Grant{At: 1, Cost: 1, ID: "r1"})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("A\t5\tj\n") // a torn A record: 3 of its 5 fields
	_, _ = f.WriteString(strings.Repeat("x", 200<<10) + "\n")
	_ = f.Close()
	j2, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = j2.Append(jp, b, store.Grant{At: 2, Cost: 1, ID: "r2"})
	_ = j2.Close()
	f, err = os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(make([]byte, 2<<20))
	_ = f.Close()

	j3, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatalf("open after damage: %v", err)
	}
	defer j3.Close()
	st := j3.Stats()
	if j3.Len() != 2 || st.Reloaded != 2 || st.Corrupt != 3 {
		t.Fatalf("len %d stats %+v, want both grants and 3 corrupt records (torn A, long line, zero tail)", j3.Len(), st)
	}
}

// Epochs name replay markers in Redis: a process that restarts without its
// journal (memory only, a container without its volume) must not reuse the
// last one's, or its batches would be refused as duplicates.
func TestJournalEpochsUniqueAcrossLifetimes(t *testing.T) {
	markers := map[string]bool{}
	for life := range 3 {
		j, err := journal.Open("", "app1", 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = j.Append(jp, store.IdentityOf("a"), store.Grant{At: 1, Cost: 1, ID: "r"})
		pending, _ := j.Pending(j.Rotate())
		for _, b := range pending {
			if markers[b.Marker] {
				t.Fatalf("life %d: marker %s already used by an earlier process", life, b.Marker)
			}
			markers[b.Marker] = true
		}
		_ = j.Close()
		time.Sleep(time.Millisecond)
	}
}

func openJournal(t *testing.T, dir string, max int) *journal.Journal {
	t.Helper()
	j, err := journal.Open(dir, "app1", max, nil)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func appendLine(t *testing.T, dir, s string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// A torn last line whose remains would parse (a request id cut short) is
// refused by its checksum: a sliding window log replay would add the wrong
// member, and the request would count twice.
func TestJournalRefusesATornLineThatParses(t *testing.T) {
	dir := t.TempDir()
	j := openJournal(t, dir, 0)
	_ = j.Append(jp, store.IdentityOf("a"), store.Grant{At: 1, Cost: 1, ID: "request-0123456789"})
	_ = j.Close()
	data, err := os.ReadFile(filepath.Join(dir, "journal.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Cut the line inside its checksum, then inside its request id.
	for _, cut := range []int{4, 14} {
		line := data[:len(data)-cut]
		if err := os.WriteFile(filepath.Join(dir, "journal.log"), line, 0o600); err != nil {
			t.Fatal(err)
		}
		j := openJournal(t, dir, 0)
		st := j.Stats()
		_ = j.Close()
		if st.Reloaded != 0 || st.Corrupt != 1 {
			t.Fatalf("cut %d bytes: stats %+v, want the torn grant refused", cut, st)
		}
	}
}

// A torn last line is cut off when the journal opens: the next record is
// not appended onto it, and a later reopen reads that record.
func TestJournalDoesNotAppendToATornLine(t *testing.T) {
	dir := t.TempDir()
	j := openJournal(t, dir, 0)
	_ = j.Close()
	appendLine(t, dir, "G\t1\tj\tsliding_window_log\t10\t600")
	j = openJournal(t, dir, 0)
	_ = j.Append(jp, store.IdentityOf("b"), store.Grant{At: 2, Cost: 1, ID: "r2"})
	_ = j.Close()
	j = openJournal(t, dir, 0)
	defer j.Close()
	if st := j.Stats(); st.Reloaded != 1 || st.Corrupt != 0 {
		t.Fatalf("stats %+v, want the grant after the torn line reloaded and nothing corrupt left", st)
	}
}

// A key's snapshot goes with its last grant, while other keys' stay; and a
// full journal refuses grants (counted as overflow) instead of making them
// unrecorded.
func TestJournalBoundsSnapshotsAndRefusesWhenFull(t *testing.T) {
	j := openJournal(t, "", 4)
	defer j.Close()
	p := ratelimit.Policy{Name: "g", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Minute}
	a, b := store.IdentityOf("a"), store.IdentityOf("b")
	for _, id := range []store.Identity{a, b} {
		if err := j.AppendSnapshot(journal.Snapshot{Policy: p, Identity: id, N: 4}); err != nil {
			t.Fatal(err)
		}
		if err := j.Append(p, id, store.Grant{At: 1, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Append(p, a, store.Grant{At: 2, Cost: 1}); err != journal.ErrFull {
		t.Fatalf("append to a full journal: %v, want ErrFull", err)
	}
	epoch := j.Rotate()
	pending, _ := j.Pending(epoch)
	for _, bt := range pending {
		if bt.Identity == a {
			j.Ack([]store.ReplayBatch{bt}, []store.ReplayResult{{}})
		}
	}
	if st := j.Stats(); st.Held != 2 || st.Overflow != 1 {
		t.Fatalf("stats %+v: want b's grant and snapshot held (a's snapshot gone with its grant), 1 unit of overflow", st)
	}
	if snap, _ := j.Key(p, a); snap != nil {
		t.Fatalf("a's snapshot outlived its grants: %+v", snap)
	}
	if err := j.Append(p, a, store.Grant{At: 3, Cost: 1}); err != nil {
		t.Fatalf("append after the room was freed: %v", err)
	}
}

// A doubt is held (it counts toward its key) but not replayed until it is
// resolved: present, it goes; not, it is replayed with the other grants.
// One left unresolved when the process died is replayed after a restart,
// and once only, however often the journal is reopened.
func TestJournalDoubts(t *testing.T) {
	dir := t.TempDir()
	j := openJournal(t, dir, 0)
	a := store.IdentityOf("a")
	for _, id := range []string{"d1", "d2", "d3"} {
		if err := j.AppendDoubt(jp, a, store.Grant{At: 1, Cost: 1, ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if pending, _ := j.Pending(j.Rotate()); len(pending) != 0 || j.Held(jp, a) != 3 {
		t.Fatalf("doubts: %d batches pending, %d units held; want none pending, 3 held", len(pending), j.Held(jp, a))
	}
	j.Resolve("d1", true)
	j.Resolve("d2", false)
	pending, _ := j.Pending(j.Rotate())
	if len(pending) != 1 || len(pending[0].Grants) != 1 || pending[0].Grants[0].ID != "d2" {
		t.Fatalf("pending %+v, want d2 alone", pending)
	}
	j.Ack(pending, []store.ReplayResult{{Replayed: 1}})
	if st := j.Stats(); st.Present != 1 || st.Replayed != 1 || st.Pending != 1 || st.Doubts != 1 {
		t.Fatalf("stats %+v, want d1 present, d2 replayed, d3 still a doubt", st)
	}
	_ = j.Close()
	for life := range 2 {
		j = openJournal(t, dir, 0)
		pending, _ = j.Pending(j.Rotate())
		if life == 0 && (len(pending) != 1 || pending[0].Grants[0].ID != "d3") {
			t.Fatalf("after a restart: pending %+v, want d3 as a grant", pending)
		}
		if life == 1 && len(pending) != 0 {
			t.Fatalf("second restart: pending %+v, want nothing (d3 was acknowledged)", pending)
		}
		results := make([]store.ReplayResult, len(pending))
		for i := range results {
			results[i].Replayed = int64(len(pending[i].Grants))
		}
		j.Ack(pending, results)
		if err := j.Stats().Reconcile(); err != nil {
			t.Fatal(err)
		}
		_ = j.Close()
	}
}

// TestJournalDropThrough: a reset at time 20 drops the key's grants made at
// or before it, doubts included, and keeps the later ones and the other
// keys'; a journal reopened from the file holds the same.
func TestJournalDropThrough(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := store.IdentityOf("a"), store.IdentityOf("b")
	for _, g := range []struct {
		id store.Identity
		g  store.Grant
	}{{a, store.Grant{At: 10, Cost: 1, ID: "r1"}}, {a, store.Grant{At: 20, Cost: 2, ID: "r2"}}, {b, store.Grant{At: 15, Cost: 1, ID: "r3"}}} {
		if err := j.Append(jp, g.id, g.g); err != nil {
			t.Fatal(err)
		}
	}
	j.Rotate() // a second epoch: the key's grants in two batches
	if err := j.Append(jp, a, store.Grant{At: 30, Cost: 4, ID: "r4"}); err != nil {
		t.Fatal(err)
	}
	if err := j.AppendDoubt(jp, a, store.Grant{At: 12, Cost: 8, ID: "r5"}); err != nil {
		t.Fatal(err)
	}
	if n := j.Drop(jp, a, 20); n != 11 {
		t.Fatalf("dropped %d units, want 11 (r1, r2 and the doubt r5)", n)
	}
	check := func(j *journal.Journal, how string) {
		t.Helper()
		pending, _ := j.Pending(j.Rotate())
		var got []string
		for _, p := range pending {
			for _, g := range p.Grants {
				got = append(got, g.ID)
			}
		}
		if strings.Join(got, ",") != "r3,r4" && strings.Join(got, ",") != "r4,r3" {
			t.Fatalf("%s: grants %v, want r3 and r4", how, got)
		}
	}
	check(j, "after the drop")
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j2, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	check(j2, "reopened")
}
